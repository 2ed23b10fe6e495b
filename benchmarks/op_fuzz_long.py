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

Each fuzz is cut into slices of ``--slice-ops`` / ``--vllm-slice-ops`` operations (whole runs,
``--start``: together they are the one fuzz), the streams taken in turn so that a run stopped early
(``--hours``: no slice starts after) has covered every part; each finished slice is logged on
stderr (operations, violations, CPU seconds, host-tier counts).  It prints the operations and
violations per manager and feature (``--markdown``: the tables of docs/reproduction.md), then the
violations themselves; exit status 1 when there is any, or when a run of 10^5 operations or more
never demoted, promoted or evicted a host page.

A run stopped early goes on with ``--first-slice K`` (K: the slice after the last one it ran, as its
last line says): the slices are deterministic, so the two runs' tables add up to one whole run's.

    nice -n 15 python benchmarks/op_fuzz_long.py --ops 10000000 --jobs 2 --markdown
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


#: operations per run (a fresh manager or adapter each): each fuzz's default
RUNS_OF = {"managers": 2000, "vllm": 500}


def _slices(n: int, size: int, runs_of: int) -> list[tuple[int, int]]:
    """``n`` operations as (first run, operations) slices of about ``size`` operations (whole runs
    of ``runs_of``), in order: the slices together are the one fuzz of ``n`` operations."""
    size = max(runs_of, size - size % runs_of)
    out, run = [], 0
    while n > 0:
        m = min(size, n)
        out.append((run, m))
        run += -(-m // runs_of)
        n -= m
    return out


def jobs(ops: int, seed: int, parts: str, vllm_share: float, slice_ops: int = 100_000,
         vllm_slice_ops: int = 200_000) -> list[tuple[str, list[str]]]:
    """(label, command) of every subprocess: the manager fuzz (seed ``seed``) and each vLLM's adapter
    fuzz (seed ``seed + 10 + i``), each cut into slices (``--start``), taken in turn."""
    managers = ops if parts == "managers" else round(ops * (1 - vllm_share))
    streams = [[("managers", [sys.executable, str(TESTS / "op_fuzz.py"), "--ops", str(n), "--seed", str(seed),
                              "--start", str(first), "--json"])
                for first, n in _slices(managers, slice_ops, RUNS_OF["managers"])]]
    if parts != "managers":
        pys = vllm_pythons()
        left = ops - managers
        for i, (version, py) in enumerate(pys.items()):
            n = left // (len(pys) - i)
            left -= n
            streams.append([(f"vLLM {version}", [py, str(TESTS / "vllm_adapter_fuzz.py"), "--ops", str(m), "--seed",
                                                 str(seed + 10 + i), "--start", str(first), "--json"])
                            for first, m in _slices(n, vllm_slice_ops, RUNS_OF["vllm"])])
    # in turn, in proportion to each stream's length: a run cut short has covered every part
    out, taken = [], [0] * len(streams)
    while any(t < len(st) for t, st in zip(taken, streams, strict=True)):
        i = min((j for j, st in enumerate(streams) if taken[j] < len(st)), key=lambda j: taken[j] / len(streams[j]))
        out.append(streams[i][taken[i]])
        taken[i] += 1
    return out


def run(commands: list[tuple[str, list[str]]], parallel: int, log=None,
        deadline: float | None = None, first: int = 0) -> list[tuple[str, dict]]:
    """Run ``commands[first:]``, ``parallel`` at once; (label, result) of each that ran, in order.
    None starts after ``deadline`` (``time.time()``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               VLLM_LOGGING_LEVEL="ERROR", VLLM_TARGET_DEVICE="cpu", PYTHONHASHSEED="0")
    pending, running, results = list(enumerate(commands))[first:], [], {}
    while running or (pending and (deadline is None or time.time() < deadline)):
        while pending and len(running) < parallel and (deadline is None or time.time() < deadline):
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
                r, cmd = results[i][1], commands[i][1]
                seen, cpu = r["seen"], r.get("cpu_s") or 0
                host = " ".join(f"{k.split()[1]} {seen.get(k, 0):,}" for k in HOST_EVENTS)
                log(f"slice {i + 1}/{len(commands)} {label} (seed {cmd[cmd.index('--seed') + 1]}, first run "
                    f"{cmd[cmd.index('--start') + 1]}): {r['ops']:,} ops, {len(r['violations'])} violations, "
                    f"{cpu:,.0f} CPU-s ({r['ops'] / max(cpu, 1e-9):,.0f} ops/CPU-s); host tier: {host}")
    return [results[i] for i in sorted(results)]


#: what the host tier did (the fuzzes' counters): each must be > 0 in a long run
HOST_EVENTS = ("host demoted", "host promoted", "host evicted")


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
                   (f"{label}: KV events stored / removed", f"{s['events stored']:,} / {s['events removed']:,}"),
                   (f"{label}: host tier pages demoted / promoted / host pages evicted",
                    " / ".join(f"{s[k]:,}" for k in HOST_EVENTS))]
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
    ap.add_argument("--slice-ops", type=int, default=100_000, help="operations per manager fuzz subprocess")
    ap.add_argument("--vllm-slice-ops", type=int, default=200_000, help="operations per adapter fuzz subprocess")
    ap.add_argument("--hours", type=float, default=None,
                    help="start no slice after this long (the tables then count the slices that ran)")
    ap.add_argument("--first-slice", type=int, default=1,
                    help="run the slices from this one on (1-based, as logged): the rest of a run --hours stopped")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    log = lambda msg: print(f"{time.time() - t0:8.0f}s {msg}", file=sys.stderr, flush=True)  # noqa: E731
    commands = jobs(int(args.ops), args.seed, args.parts, args.vllm_share, args.slice_ops, args.vllm_slice_ops)
    if not 1 <= args.first_slice <= len(commands):
        ap.error(f"--first-slice must be in 1..{len(commands)}")
    results = run(commands, args.jobs, log, None if args.hours is None else t0 + args.hours * 3600,
                  first=args.first_slice - 1)
    rows, events = tables(results)
    total = sum(r["ops"] for _, r in results)
    violations = [v for _, r in results for v in r["violations"]]
    if len(results) < len(commands) - args.first_slice + 1:
        log(f"stopped at the deadline: slices {args.first_slice}-{args.first_slice + len(results) - 1} of "
            f"{len(commands)} ran, {total:,} of {int(args.ops):,} ops (the rest: --first-slice "
            f"{args.first_slice + len(results)})")
    seen = Counter()
    for label, r in results:
        if label == "managers":
            seen.update(r["seen"])
    missing = [k for k in HOST_EVENTS if not seen[k]]
    log("host tier (manager fuzz): " + ", ".join(f"{k} {seen[k]:,}" for k in HOST_EVENTS))
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
    if missing and total >= 100_000:  # a long run that never demoted, promoted or evicted a host page
        print(f"the host tier was not covered: no {', '.join(missing)}", file=sys.stderr)
        return 1
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
