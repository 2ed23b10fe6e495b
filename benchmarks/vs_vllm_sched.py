"""jenga against vLLM at its best, inside vLLM's own scheduler, at real model sizes, in time.

Both sides are vLLM's real ``Scheduler`` (admission, chunked prefill, preemption, 0.34's
cache-aware admission): stock with its own ``KVCacheManager``, and ``JengaScheduler``.  Both are
planned by vLLM's own planner at the catalog model's real layout and KV budget
(``vllm_layouts``), with H100 server limits (``--batched-tokens`` 8,192, ``--max-seqs`` 1,024)
and the same bytes on both sides.  The runner computes nothing; each step is priced by the
simulator's calibrated cost model (``jenga.sim.calibration.FITTED``, engine ``v1``) on the
model's real GPU (``sched_driver``).  Budgets: ``real`` = the simulator's (0.9 x GPU memory -
bf16 weights, smallest TP that fits; Jamba on one H200), ``tight`` = ``--tight`` x real.

vLLM runs at its best: every row sweeps vLLM's settings (``--sweep``) and keeps the one with
the highest req/s (ties: fewer steps); the table names it.  ``quick``: retention
{0, dense} x admission {FCFS, cache-aware (0.34: window 2,048, threshold 0)}, and on hybrids
``prefix_match_unit`` 16 besides None; ``full`` adds retention 4 and 16 blocks.  jenga runs
its defaults (its own admission order, most cached prefix first; chunk-end state checkpoints on
hybrids; on hybrids ``prefix_match_unit`` 16 when that won vLLM's row, as a user would set it for
both), and each policy switch (``--variants``): ``ordered`` (no protected-page hold on
admissions), ``always`` (every page reused twice protected, not only the pages the next-use
predictor keeps: ``jenga.core.evict.predicted``), ``reused-only`` (the predictor keeps reused pages
only, not pages used once after a departed prefix came back), ``whole-states`` (a hybrid's state
layers in one group, not cut as vLLM cuts them: ``jenga.vllm.plan``), ``no-step-ends`` (no chunk-end state
checkpoints), ``no-prefix-wait`` (no admission held for a prefix a step in flight computes:
``jenga.vllm.prefix_wait``), ``queue-goes-on`` (the queue behind such a held request goes on at any
usage), ``exact-junction`` (every junction stop exact, also off vLLM's Mamba block
grid, where it costs its request a step: ``jenga.vllm.junction_stop``), ``hits-first`` (queue order among hits), ``fcfs`` (vLLM's queue order), ``before`` (the last three: jenga's
defaults before this benchmark), ``no-reserve`` (the whole-prompt admission check does not count
as taken the pages the admitted prompts still need, ``jenga.vllm.admission``).

Run with the 0.34 python (0.32 works too, without cache-aware admission)::

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=$PWD/src .vllm-envs/0.34.0/bin/python benchmarks/vs_vllm_sched.py --rows quick

A request whose prompt is ``max_model_len`` tokens or longer is left out on both sides, as vLLM's
engine refuses it before any scheduler sees it (``served``; counted on stderr): with Nemotron-H-8B's
8,192 tokens, 6 of the 48 round-robin turns, and every prompt of ``articles16`` (the row is left out).
A row whose budget cannot hold one ``max_model_len`` request is left out too, as vLLM refuses to
start on it (its planner's ``ValueError``: ``vllm_layouts.BudgetRefused``; the reason on stderr):
Gemma-3-27B's tight budget (4.65 GiB) at 24,576 tokens (``articles16``) or 12,288 (``round-robin``),
at every setting of the sweep (vLLM's estimate of what fits: 8,688).

Columns: steps, prefill tokens computed (prompt tokens not hit + recompute), hit % (first
admissions), mean batch (requests per step), preemptions, req/s and TTFT p50 / p99 in simulated
seconds, jenga / vLLM req/s.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM logs to stdout: keep the table clean

from manager_traces import TRACES  # noqa: E402
from sched_driver import run  # noqa: E402
from vllm_layouts import BudgetRefused, VllmSettings, hybrid_block, scheduler  # noqa: E402

GPU = {"jamba-1.5-mini": "h200-141gb"}
#: rows: model:trace:budget
QUICK = ["gemma-3-12b:articles16:real", "gemma-3-12b:articles16:tight", "jamba-1.5-mini:articles16:real",
         "jamba-1.5-mini:articles16:tight", "llama-3.1-8b:articles16:real", "llama-3.1-8b:articles16:tight",
         "ministral-8b:articles16:real", "ministral-8b:articles16:tight"]
MORE = ["gemma-3-12b:short:real", "jamba-1.5-mini:short:tight", "gemma-3-12b:round-robin:tight",
        "jamba-1.5-mini:mamba-prefix:tight", "gpt-oss-120b:articles16:tight", "llama-4-scout:articles16:tight",
        "qwen3-next-80b:articles16:tight", "nemotron-h-8b:short:tight", "falcon-h1-7b:articles16:tight"]
#: the rows people care about: models deployed in late 2026 at their real sizes (Llama-3.1-8B the
#: control) x the workloads users of vLLM and SGLang report x the GPU's real budget and a tight one
WIDE_MODELS = ["gemma-3-27b", "gpt-oss-120b", "llama-4-scout", "ministral-8b", "qwen3-next-80b", "nemotron-h-8b",
               "falcon-h1-7b", "jamba-1.5-mini", "llama-3.1-8b"]
WIDE_TRACES = ["hybrid-short", "agent-branch", "round-robin", "articles16", "rag"]
WIDE = [f"{m}:{t}:{b}" for m in WIDE_MODELS for t in WIDE_TRACES for b in ("real", "tight")]
ROWS = {"quick": QUICK, "more": MORE, "all": QUICK + MORE, "wide": WIDE,
        "wide-tight": [r for r in WIDE if r.endswith(":tight")], "wide-real": [r for r in WIDE if r.endswith(":real")]}
CACHE_AWARE = dict(admission_window=2048, admission_threshold=0.0)
#: jenga's policy switches measured beside its defaults (``--variants``): environment of JengaScheduler
VARIANTS = {
    "whole-states": {"JENGA_VLLM_STATE_GROUPS": "whole"},
    "always": {"JENGA_VLLM_PROTECT": "always"},
    "reused-only": {"JENGA_VLLM_KEEP_ONCE": "off"},
    "ordered": {"JENGA_VLLM_PROTECT": "auto"},
    "no-step-ends": {"JENGA_VLLM_STEP_CHECKPOINTS": "off"},
    "no-prefix-wait": {"JENGA_VLLM_PREFIX_WAIT": "off"},
    "queue-goes-on": {"JENGA_VLLM_PREFIX_WAIT_STOPS": "never"},
    "exact-junction": {"JENGA_VLLM_JUNCTION_STOP": "exact"},
    "hits-first": {"JENGA_VLLM_ADMISSION": "hits-first"},
    "fcfs": {"JENGA_VLLM_ADMISSION": "fcfs"},
    "no-reserve": {"JENGA_VLLM_RESERVE": "off"},
    "before": {"JENGA_VLLM_STEP_CHECKPOINTS": "off", "JENGA_VLLM_ADMISSION": "hits-first",
               "JENGA_VLLM_PROTECT": "always"},
}


def sweep(model, kind: str) -> list[VllmSettings]:
    """vLLM's settings tried on ``model`` (module doc)."""
    from jenga.vllm.compat import MINOR
    block = hybrid_block(model)
    windowed = any(g.kind in ("sliding", "mamba") for g in model.groups)
    retentions = [0, None] + ([4 * block, 16 * block] if kind == "full" else []) if windowed else [0]
    units = [None, 16] if block > 16 else [None]
    admissions = [{}, CACHE_AWARE] if MINOR >= (0, 34) else [{}]
    return [VllmSettings(retention=r, match_unit=u, **a) for r in retentions for u in units for a in admissions]


def setup_of(name: str):
    from jenga.sim.calibration import FITTED
    from jenga.sim.gpu import ModelDoesNotFitError
    from jenga.sim.setup import build_setup
    gpu, tp = GPU.get(name, "h100-80gb"), 1
    while True:
        try:
            return build_setup(name, gpu, tp, efficiency=FITTED.cost_kwargs("v1"))
        except ModelDoesNotFitError:
            tp *= 2


def trace_of(trace: str, scale: float):
    counts = {"short": ("n", 1000), "long": ("n", 20), "hybrid-short": ("n", 200), "mamba-prefix": ("n", 64),
              "agent": ("sessions", 16), "round-robin": ("sessions", 8), "agent-branch": ("sessions", 8),
              "rag": ("n", 256)}
    kw = {}
    if scale != 1.0 and trace in counts:
        k, v = counts[trace]
        kw[k] = max(2, round(v * scale))
    return TRACES[trace](**kw)


def max_len_of(model, reqs, a) -> int:
    """The engine's ``max_model_len``: ``--max-model-len``, else the trace's longest request rounded
    up to 4,096, at most the model's own."""
    longest = max(len(r.tokens) + r.output_len for r in reqs)
    return a.max_model_len or min(model.max_model_len, -(-longest // 4096) * 4096)


def served(reqs, max_len: int) -> tuple[list, int]:
    """The requests vLLM's engine accepts, and how many it refuses: its input processor refuses a
    prompt of ``max_model_len`` tokens or more (``InputProcessor._validate_prompt_len``) before any
    scheduler sees it.  Handed one, a scheduler never finishes it: on a Mamba hybrid the step is cut
    to ``max_model_len - 1`` tokens, then down to the block grid, to 0 tokens every step."""
    ok = [r for r in reqs if len(r.tokens) < max_len]
    return ok, len(reqs) - len(ok)


def one(side: str, model, settings, memory: int, setup, reqs, a, max_len: int) -> dict:
    from jenga.sim.step_clock import StepClock
    sched, hash_block = scheduler(side, model, settings, memory, max_model_len=max_len,
                                  batched_tokens=a.batched_tokens, max_seqs=a.max_seqs)
    t0 = time.perf_counter()
    m = run(sched, hash_block, reqs, StepClock(setup, model))
    m["wall"] = time.perf_counter() - t0
    m["settings"] = settings
    return m


def better(m: dict, best: dict | None) -> bool:
    return best is None or (m["rps"], -m["steps"]) > (best["rps"], -best["steps"])


def run_row(row: str, a) -> dict:
    name, trace, budget = row.split(":")
    from jenga.core.specs import ModelSpec
    setup = setup_of(name)
    model = ModelSpec.from_hf_config(name, vision=False)  # text traces: a VLM's tower holds no KV here
    memory = int(setup.memory_bytes * (a.tight if budget == "tight" else 1.0))
    reqs = trace_of(trace, a.scale)
    max_len = max_len_of(model, reqs, a)
    reqs, refused = served(reqs, max_len)
    if not reqs:
        return dict(row=row, left_out=f"all {refused} prompts are max_model_len ({max_len}) tokens or longer")
    try:
        return measure(row, a, model, setup, memory, reqs, max_len, refused)
    except BudgetRefused as e:  # only vLLM's planner refusing the budget; any other error stops the run
        return dict(row=row, left_out=f"vLLM refuses to start on {memory / 2**30:.2f} GiB of KV cache: {e.reason}")


def measure(row: str, a, model, setup, memory: int, reqs, max_len: int, refused: int) -> dict:
    """vLLM's sweep and jenga (defaults and ``a.variants``) on ``row``'s served requests."""
    best, tried = None, []
    for s in sweep(model, a.sweep):
        m = one("vllm", model, s, memory, setup, reqs, a, max_len)
        tried.append(m)
        if a.verbose:
            print(f"  {row} vLLM {s.name()}: {_brief(m)}", file=sys.stderr, flush=True)
        if better(m, best):
            best = m
    jset = VllmSettings(match_unit=best["settings"].match_unit)
    out = dict(row=row, memory=memory, gpu=f"{setup.gpu} x TP{setup.tp}", vllm=best, tried=tried, variants={},
               refused=refused)
    for var in [None] + a.variants:
        env = VARIANTS[var] if var else {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            j = one("jenga", model, jset, memory, setup, reqs, a, max_len)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        if a.verbose:
            print(f"  {row} jenga {var or 'default'} {jset.name()}: {_brief(j)}", file=sys.stderr, flush=True)
        if var:
            out["variants"][var] = j
        else:
            out["jenga"] = j
    return out


def _brief(m: dict) -> str:
    return (f"{m['steps']} steps, {m['prefill'] / 1e6:.2f}M prefill, hit {100 * m['hit']:.1f} %, batch "
            f"{m['batch']:.1f}, preempt {m['preempt']}, {m['rps']:.3f} req/s, TTFT p99 / mean / max "
            f"{m['ttft99']:.2f} / {m['ttft_mean']:.2f} / {m['ttft_max']:.2f} s "
            f"(wall {m['wall']:.0f} s, sched CPU {m['cpu']:.1f} s)")


HEADER = ["row", "KV GiB", "vLLM best setting", "steps vLLM / jenga", "prefill tok vLLM / jenga", "hit vLLM / jenga",
          "batch vLLM / jenga", "preempt vLLM / jenga", "req/s vLLM / jenga", "jenga/vLLM", "TTFT p50 vLLM / jenga",
          "TTFT p99 vLLM / jenga"]


def fmt(res: dict) -> list[str]:
    v, j = res["vllm"], res["jenga"]

    def pair(key, f):
        return f"{f(v[key])} / {f(j[key])}"

    return [res["row"], f"{res['memory'] / 2**30:.1f}", v["settings"].name(), pair("steps", str),
            pair("prefill", lambda x: f"{x / 1e6:.2f}M"), pair("hit", lambda x: f"{100 * x:.1f} %"),
            pair("batch", lambda x: f"{x:.1f}"), pair("preempt", str), pair("rps", lambda x: f"{x:.3f}"),
            f"{j['rps'] / v['rps']:.2f}x", pair("ttft50", lambda x: f"{x:.1f}"),
            pair("ttft99", lambda x: f"{x:.1f}")] + [
        f"{m['rps'] / v['rps']:.2f}x, p99 TTFT {m['ttft99'] / v['ttft99']:.2f}x ({m['steps']} steps, batch "
        f"{m['batch']:.1f}, hit {100 * m['hit']:.1f} %)"
        for m in res["variants"].values()]


OUTCOME = ["row", "GPU", "KV GiB", "vLLM best setting", "req/s vLLM / jenga", "jenga/vLLM", "TTFT p99 s vLLM / jenga",
           "prompt tokens computed vLLM / jenga"]


def outcome(res: dict) -> list[str]:
    """The README's columns (``--outcome``): simulated time only, no wall-clock figure."""
    v, j = res["vllm"], res["jenga"]
    return [res["row"], res["gpu"], f"{res['memory'] / 2**30:.1f}", v["settings"].name(),
            f"{v['rps']:.3f} / {j['rps']:.3f}", f"{j['rps'] / v['rps']:.2f}x", f"{v['ttft99']:.1f} / {j['ttft99']:.1f}",
            f"{v['prefill'] / 1e6:.2f}M / {j['prefill'] / 1e6:.2f}M"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="quick", help="'quick' (4 models x articles16 x real/tight), 'more', 'all', 'wide' "
                   "(9 models x 5 workloads x real/tight), 'wide-tight', 'wide-real', "
                   "or comma-separated model:trace:budget (budget real|tight; traces: " + ", ".join(TRACES) + ")")
    p.add_argument("--sweep", choices=("quick", "full"), default="quick", help="vLLM settings tried per row")
    p.add_argument("--tight", type=float, default=0.25, help="the tight budget as a share of the real one")
    p.add_argument("--scale", type=float, default=1.0, help="scale request / session counts (quick runs)")
    p.add_argument("--batched-tokens", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--max-seqs", type=int, default=1024, help="max_num_seqs")
    p.add_argument("--max-model-len", type=int, help="default: the trace's longest request, rounded up to 4,096")
    p.add_argument("--variants", default="always,reused-only,ordered,no-step-ends,no-prefix-wait,no-reserve,hits-first,before", help="jenga policy switches also measured, comma-separated "
                   f"({', '.join(VARIANTS)}; '' for none): jenga/vLLM req/s with each")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--outcome", action="store_true", help="the README's columns only (req/s, p99 TTFT, prompt "
                   "tokens computed) and no variants")
    p.add_argument("-v", "--verbose", action="store_true", help="every sweep point on stderr")
    a = p.parse_args(argv)
    rows = ROWS.get(a.rows) or a.rows.split(",")
    a.variants = [v for v in a.variants.split(",") if v] if not a.outcome else []
    header = OUTCOME if a.outcome else HEADER + [f"jenga/vLLM with {v}" for v in a.variants]
    table, ratios = [], []
    if a.markdown:
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for row in rows:
        res = run_row(row, a)
        if "left_out" in res:
            print(f"{row}: left out, {res['left_out']}", file=sys.stderr, flush=True)
            continue
        cells = outcome(res) if a.outcome else fmt(res)
        table.append(cells)
        ratios.append(res["jenga"]["rps"] / res["vllm"]["rps"])
        refused = f" ({res['refused']} refused: prompt not below max_model_len)" if res["refused"] else ""
        print(f"{row}: {res['jenga']['n']} requests{refused}, {res['gpu']}", file=sys.stderr, flush=True)
        if a.markdown:
            print("| " + " | ".join(cells) + " |", flush=True)
    if not a.markdown:
        widths = [max(len(x[i]) for x in table + [header]) for i in range(len(header))]
        for r in [header] + table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    if not ratios:
        return 0
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
    if a.markdown and a.outcome:
        print(f"| geo-mean over {len(ratios)} rows | | | | | {geo:.2f}x | | |")
    print(f"geo-mean jenga/vLLM-best req/s over {len(ratios)} rows: {geo:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
