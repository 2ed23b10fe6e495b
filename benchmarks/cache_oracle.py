"""The cache-correctness oracle, long run: prefix caching on gives what caching off gives, for every
family and feature, in jenga's engine and inside vLLM 0.32.

Engine side (``tests/engine_cache_oracle.py``): every built-in tiny model, each feature it takes (plain,
speculative draft, host tier, images, salts), over ``--seeds``; vLLM side
(``tests/vllm_cache_oracle.py``, jenga's scheduler, vLLM's CPU build, in this process): every family
the integration runs end to end, each feature it supports there (plain, speculative, host tier
through ``kv_offloading_size``, salts, LoRA; images on its two VLMs; a case jenga refuses at engine
start (speculative decoding on a state hybrid) or stock vLLM's CPU build fails itself (LoRA on a MoE
family) shows that), over ``--vllm-seeds``, at the
budget (vLLM blocks, in the cell) where its caching-on run first preempted.  Each cell: requests whose
greedy tokens agree between caching on and off / requests, then the caching-on runs' prefix hit
tokens and preemptions (host hit tokens with the host tier; with images, images served from the
engine's encoder cache, or inside vLLM requests whose prefix hit reached past their picture; inside
vLLM with speculative decoding, the draft tokens it accepted), summed
over the seeds; ``-``: a feature the family does not take.  Any request that
differs, a hit past the trace's bound, a vacuous run (no hit, no preemption ...) or a run that
raises (``failed`` in its cell) is listed under the table and the script exits 1.

Usage: ``python benchmarks/cache_oracle.py [--seeds 0,1] [--vllm-seeds 0] [--families A,B]
[--features plain,spec] [--no-vllm | --vllm-only] [--jobs 3] [--markdown]``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

COLUMNS = (("plain", "plain"), ("spec", "speculative"), ("host", "host tier"), ("images", "images"),
           ("salts", "salts"), ("lora", "LoRA"))


def _cell(results) -> str:
    if not results:
        return "-"
    if any(isinstance(r, Failed) for r in results):
        return "failed: " + ", ".join(sorted({r.problems[0].split(":")[0] for r in results if isinstance(r, Failed)}))
    if getattr(results[0], "refused", ""):  # vLLM side: jenga refuses it at start, or stock vLLM fails it
        import vllm_cache_oracle as vo

        who, what = vo.REFUSED[results[0].family, results[0].feature]
        return f"refused by jenga at start ({what})" if who == "jenga" else f"stock vLLM fails too ({what})"
    equal, total = sum(r.equal for r in results), sum(r.total for r in results)
    on = {k: sum(r.on.get(k, 0) for r in results) for k in ("hits", "preemptions", "host_hits", "image_hits", "accepted")}
    out = f"{equal}/{total}: {on['hits']} hit, {on['preemptions']} preempt"
    if results[0].feature == "host":
        out += f", {on['host_hits']} from host"
    blocks = sorted({r.blocks for r in results if getattr(r, "blocks", 0)})
    if results[0].feature == "images":  # the engine's encoder cache; inside vLLM, jenga's hits over a picture
        out += f", {on['image_hits']} " + ("hits past a picture" if blocks else "images cached")
    if results[0].feature == "spec" and blocks:  # vLLM: draft tokens it accepted (the proposer ran)
        out += f", {on['accepted']} drafts accepted"
    if blocks:  # vLLM: the budget the caching-on run preempted at
        out += f" ({'/'.join(map(str, blocks))} blocks)"
    return out


@dataclass
class Failed:
    """A case whose run raised: the error is its problem (the table says ``failed``)."""
    family: str
    feature: str
    seed: int
    problems: list[str]
    equal: int = 0
    total: int = 0
    on: dict = field(default_factory=dict)


def _engine_case(case):
    import engine_cache_oracle as co
    import torch

    torch.set_num_threads(1)
    try:
        return co.compare(*case)
    except Exception as e:  # noqa: BLE001  (a run that raises is a finding, listed under the table)
        return Failed(*case, [f"{type(e).__name__}: {str(e)[:300]}"])


def _vllm_case(case):
    import tempfile

    import vllm_cache_oracle as vo

    with tempfile.TemporaryDirectory() as tmp:
        try:
            return vo.compare(*case, Path(tmp))
        except Exception as e:  # noqa: BLE001
            return Failed(*case, [f"{type(e).__name__}: {str(e)[:300]}"])


def results(side: str, cases, jobs: int, log) -> dict:
    """``{(family, side): {feature: [Result per seed]}}`` of ``cases`` ((family, feature, seed)), run
    in ``jobs`` processes (each case in a fresh one: vLLM's engines leave state in their process)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    run = _engine_case if side == "engine" else _vllm_case
    out: dict = {(f, side): {} for f, _, _ in cases}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), max_tasks_per_child=1) as ex:
        t = time.perf_counter()
        for case, res in zip(cases, ex.map(run, cases), strict=True):
            log(f"{side} {' '.join(map(str, case))}: {res.equal}/{res.total} at {time.perf_counter() - t:.0f} s"
                + (f" PROBLEMS {res.problems[:2]}" if res.problems else ""))
            out[(case[0], side)].setdefault(case[1], []).append(res)
    return out


def render(rows: dict, features) -> str:
    cols = [c for c in COLUMNS if c[0] in features]
    lines = ["| family | side | " + " | ".join(label for _, label in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for (fam, side), cells in rows.items():
        lines.append(f"| {fam} | {side} | " + " | ".join(_cell(cells.get(key, [])) for key, _ in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0", help="engine trace seeds")
    ap.add_argument("--vllm-seeds", default="0", help="vLLM trace seeds")
    ap.add_argument("--families", default=None, help="comma-separated: tiny models and / or vLLM families")
    ap.add_argument("--features", default=",".join(k for k, _ in COLUMNS))
    ap.add_argument("--no-vllm", action="store_true", help="the engine side only")
    ap.add_argument("--vllm-only", action="store_true", help="the vLLM side only")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (a process each)")
    ap.add_argument("--markdown", action="store_true", help="the table only (progress on stderr)")
    args = ap.parse_args(argv)
    import engine_cache_oracle as co

    features = args.features.split(",")
    chosen = args.families.split(",") if args.families else None

    def log(msg):
        print(msg, file=sys.stderr if args.markdown else sys.stdout, flush=True)

    rows: dict = {}
    if not args.vllm_only:
        cases = [(f, x, int(s)) for f in co.FAMILIES if chosen is None or f in chosen for x in features
                 if x in co.supported(f) for s in args.seeds.split(",")]
        rows.update(results("engine", cases, args.jobs, log))
    if not args.no_vllm:
        import vllm_cache_oracle as vo

        cases = [(f, x, int(s)) for f, (_, _, feats) in vo.FAMILIES.items() if chosen is None or f in chosen
                 for x in features if x in feats for s in args.vllm_seeds.split(",")]
        rows.update(results("vLLM 0.32", cases, args.jobs, log))
    print(render(rows, features))
    bad = [f"- {r.family} {r.feature} seed {r.seed} ({side}): {p}" for (_, side), cells in rows.items()
           for rs in cells.values() for r in rs for p in r.problems]
    print("\n".join(bad) if bad else "no problem: every request equal, every run with hits and preemptions")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
