"""The long operation fuzz: every manager, the host tier, speculative lookahead and the vLLM
adapter's call sequence, ``--ops`` operations in all, ``check_integrity()`` after each.

Parts (each a seeded, deterministic subprocess; ``--jobs`` of them at once):

* the manager fuzz (``tests/op_fuzz.py``): jenga, the paged / static / uniform baselines and the
  multi-model pool on six layer mixes, jenga's host tier (demotion, promotion, host eviction),
  speculative lookahead (allocate with draft slots, commit with rejected drafts); ``1 - vllm_share``
  of the operations, in two halves (seeds ``seed`` and ``seed + 1``);
* the vLLM adapter fuzz (``tests/vllm_adapter_fuzz.py``): ``JengaKVCacheAdapter`` driven by the
  calls vLLM's scheduler makes, in its order, on real ``Request`` objects; ``vllm_share`` of the
  operations, split evenly over the vLLM pythons found (``.venv``'s vLLM 0.32 and the 0.33 / 0.34
  scheduler-level venvs under ``.vllm-envs``).

It prints the operations and violations per manager and feature (``--markdown``: the tables of
docs/reproduction.md), then the violations themselves; exit status 1 when there is any.

    python benchmarks/op_fuzz_long.py --ops 10000000 --markdown
    python benchmarks/op_fuzz_long.py --ops 20000 --parts managers --markdown   # seconds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
VLLM_ENVS = Path(os.environ.get("VLLM_ENVS", ROOT / ".vllm-envs"))
VLLM_VERSIONS = ("0.33.0", "0.34.0")
CONF = re.compile(r"^(?P<name>vllm \S+|\S+) (?P<spec>\S+) host=(?P<host>\w+) k=(?P<k>\d+) seed=")


def vllm_pythons() -> dict[str, str]:
    """vLLM version -> its python: this one (if it has vLLM), then the scheduler-level venvs found."""
    out = {}
    if importlib.util.find_spec("vllm") is not None:
        import vllm  # noqa: PLC0415 (seconds: only when the vLLM parts run)

        out[vllm.__version__] = sys.executable
    for v in VLLM_VERSIONS:
        py = VLLM_ENVS / v / "bin" / "python"
        if py.exists():
            out[v] = str(py)
    return out


def jobs(ops: int, seed: int, parts: str, vllm_share: float) -> list[tuple[str, list[str]]]:
    """(label, command) of every subprocess."""
    managers = ops if parts == "managers" else round(ops * (1 - vllm_share))
    out = []
    for i, n in enumerate((managers - managers // 2, managers // 2)):
        out.append(("managers", [sys.executable, str(TESTS / "op_fuzz.py"), "--ops", str(n), "--seed",
                                 str(seed + i), "--json"]))
    if parts == "managers":
        return out
    pys = vllm_pythons()
    left = ops - managers
    for i, (version, py) in enumerate(pys.items()):
        n = left // (len(pys) - i)
        left -= n
        out.append((f"vLLM {version}", [py, str(TESTS / "vllm_adapter_fuzz.py"), "--ops", str(n), "--seed",
                                        str(seed + 10 + i), "--json"]))
    return out


def run(commands: list[tuple[str, list[str]]], parallel: int, log=None) -> list[tuple[str, dict]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               VLLM_LOGGING_LEVEL="ERROR", VLLM_TARGET_DEVICE="cpu", PYTHONHASHSEED="0")
    pending, running, results = list(enumerate(commands)), [], {}
    while pending or running:
        while pending and len(running) < parallel:
            i, (label, cmd) = pending.pop(0)
            running.append((i, label, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                                       text=True, env=env, cwd=ROOT)))
        time.sleep(0.2)
        for item in list(running):
            i, label, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            out = proc.stdout.read()
            line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), None)
            if line is None:  # a crash outside any run: one violation, no operations counted
                line = json.dumps({"ops": 0, "seen": {}, "violations": [
                    f"{label}: {' '.join(commands[i][1])} printed no result (exit {proc.returncode})"]})
            results[i] = (label, json.loads(line))
            if log:
                log(f"{label}: {results[i][1]['ops']:,} ops, {len(results[i][1]['violations'])} violations")
    return [results[i] for i in sorted(results)]


def tables(results: list[tuple[str, dict]]) -> tuple[list[tuple], list[tuple]]:
    """(rows: part, configurations, operations, violations; what happened: event, count)."""
    sys.path.insert(0, str(TESTS))
    import op_fuzz

    confs = op_fuzz.configurations()
    seen, bad = Counter(), Counter()
    vllm: dict[str, tuple[Counter, Counter]] = {}
    for label, r in results:
        if label == "managers":
            seen.update(r["seen"])
            for v in r["violations"]:
                m = CONF.match(v)  # None: the process crashed (counted in the total only)
                bad[(m["name"], m["host"] == "True", int(m["k"])) if m else ("?", False, 0)] += 1
        else:
            s, b = vllm.setdefault(label, (Counter(), Counter()))
            s.update(r["seen"])
            for v in r["violations"]:
                m = CONF.match(v)
                b[(m["spec"], m["host"] == "True", int(m["k"])) if m else ("?", False, 0)] += 1
    rows = []
    for name in op_fuzz.MANAGERS:
        n = sum(1 for c in confs if c[0] == name and not c[2])
        label = "multi-model pool (2 models)" if name == "multi" else name
        rows.append((label, n, seen[f"ops:{name}"] - (seen["ops:host tier"] if name == "jenga" else 0),
                     sum(v for (nm, h, _), v in bad.items() if nm == name and not h)))
    rows.append(("jenga + host tier", sum(1 for c in confs if c[2]), seen["ops:host tier"],
                 sum(v for (_, h, _), v in bad.items() if h)))
    rows.append(("speculative lookahead (k = 3, every manager above)", sum(1 for c in confs if c[3]),
                 seen["ops:lookahead"], sum(v for (_, _, k), v in bad.items() if k)))
    events = [("manager fuzz: prefix hits", seen["hit"]), ("manager fuzz: allocates refused", seen["none"]),
              ("manager fuzz: kept drafts committed", seen["kept drafts"]),
              ("manager fuzz: hits shortened by the floors", seen["hit shortened by floors"]),
              ("host tier: pages demoted", seen["host demoted"]), ("host tier: pages promoted", seen["host promoted"]),
              ("host tier: host pages evicted", seen["host evicted"])]
    for label, (s, b) in vllm.items():
        import vllm_adapter_fuzz as vf  # noqa: PLC0415 (needs vLLM: only with vLLM parts)

        vconfs = vf.configurations()
        for layout in vf.LAYOUTS:
            rows.append((f"{label} adapter: {layout}", sum(1 for c in vconfs if c[0] == layout),
                         s[f"ops:vllm {layout}"], sum(v for (sp, _, _), v in b.items() if sp == layout)))
        rows.append((f"{label} adapter: host tier", sum(1 for c in vconfs if c[1]), s["ops:vllm host tier"],
                     sum(v for (_, h, _), v in b.items() if h)))
        rows.append((f"{label} adapter: lookahead (k = 2)", sum(1 for c in vconfs if c[2]), s["ops:vllm lookahead"],
                     sum(v for (_, _, k), v in b.items() if k)))
        events += [(f"{label}: scheduler steps' tokens", s["scheduled tokens"]), (f"{label}: preemptions", s["preempted"]),
                   (f"{label}: drafts rejected", s["drafts rejected"]), (f"{label}: shared blocks seen", s["shared blocks"]),
                   (f"{label}: KV events stored / removed", f"{s['events stored']:,} / {s['events removed']:,}")]
    return rows, events


def markdown(rows, events, total: int, violations: int) -> str:
    out = ["| part | configurations | operations | violations |", "|---|---:|---:|---:|"]
    out += [f"| {p} | {c} | {o:,} | {v} |" for p, c, o, v in rows]
    out.append(f"| **all** | | **{total:,}** | **{violations}** |")
    out += ["", "| what happened | count |", "|---|---:|"]
    out += [f"| {e} | {n:,} |" if isinstance(n, int) else f"| {e} | {n} |" for e, n in events]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=float, default=1e7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", choices=("all", "managers"), default="all")
    ap.add_argument("--vllm-share", type=float, default=0.2, help="of the operations, the vLLM adapter's")
    ap.add_argument("--jobs", type=int, default=2, help="subprocesses at once (the results do not depend on it)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    log = lambda msg: print(f"{time.time() - t0:8.0f}s {msg}", file=sys.stderr, flush=True)  # noqa: E731
    results = run(jobs(int(args.ops), args.seed, args.parts, args.vllm_share), args.jobs, log)
    rows, events = tables(results)
    total = sum(r["ops"] for _, r in results)
    violations = [v for _, r in results for v in r["violations"]]
    if args.markdown:
        print(markdown(rows, events, total, len(violations)))
    else:
        for p, c, o, v in rows:
            print(f"{p:55s} {c:3d} configurations {o:>12,} ops {v} violations")
        print(f"{'all':55s} {'':19s} {total:>12,} ops {len(violations)} violations")
        for e, n in events:
            print(f"  {e}: {n:,}" if isinstance(n, int) else f"  {e}: {n}")
    for v in violations[:20]:
        print(v, file=sys.stderr)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
