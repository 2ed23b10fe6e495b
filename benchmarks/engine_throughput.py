"""Engine throughput and per-step Python overhead, jenga vs paged, on the ``jenga bench`` workload.

Usage: ``python benchmarks/engine_throughput.py [--requests N] [--kv-memory 12MiB] ...`` (the same
options as ``jenga bench``).  Prints, per manager: output tokens/s, steps, mean decode batch,
time in the model forward, and the engine's own time outside it (scheduling, KV-cache manager,
attention metadata, sampling) per step and as a share of the wall time.

``--ops`` also counts the torch operators each engine dispatches per step (the whole run, its
4-token warm-up included, over its steps): on a GPU each is about one kernel launch or copy, so
the count is the per-step work a launch-bound GPU pays, measured on a CPU, the same on every run;
with two managers, the operators whose counts differ most follow the table.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from contextlib import nullcontext

from rich.console import Console
from rich.table import Table
from torch.utils._python_dispatch import TorchDispatchMode


def main(argv: list[str] | None = None) -> int:
    import torch

    from jenga.bench import add_bench_parser, bench_workload, run_engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd")
    add_bench_parser(sub)
    sub.choices["bench"].add_argument("--ops", action="store_true",
                                      help="also the torch operators dispatched per step (module doc)")
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    ops = args.ops
    torch.set_num_threads(args.threads)
    work = bench_workload(args)
    names = [n.strip() for n in args.managers.split(",") if n.strip()]
    res, counts = {}, {}
    for name in names:
        with OpCount() if ops else nullcontext() as count:
            res[name] = run_engine(name, args, work, track_kv_stats=False)
        if ops:
            counts[name] = count.ops
    t = Table(title=f"engine throughput: {args.model}, {args.requests} requests, KV {args.kv_memory}")
    t.add_column("metric")
    for name in res:
        t.add_column(name, justify="right")
    rows = [
        ("tokens/s", lambda r: f"{r['tokens_per_s']:.1f}"),
        ("steps", lambda r: str(r["steps"])),
        ("mean decode batch", lambda r: f"{r['decode_batch_mean']:.1f}"),
        ("wall", lambda r: f"{r['wall_s']:.2f} s"),
        ("model forward", lambda r: f"{r['model_s']:.2f} s"),
        ("overhead (outside forward)", lambda r: f"{r['overhead_s']:.2f} s"),
        ("overhead per step", lambda r: f"{1000 * r['overhead_s'] / max(1, r['steps']):.2f} ms"),
        ("overhead share", lambda r: f"{100 * r['overhead_s'] / r['wall_s']:.1f}%"),
        ("forward per step", lambda r: f"{1000 * r['model_s'] / max(1, r['steps']):.2f} ms"),
    ]
    if ops:
        rows.append(("torch ops per step", lambda r: f"{r['ops'] / max(1, r['steps']):.0f}"))
        for name, r in res.items():
            r["ops"] = sum(counts[name].values())
    for label, fmt in rows:
        t.add_row(label, *(fmt(r) for r in res.values()))
    Console().print(t)
    if ops and len(names) == 2:
        (a, ca), (b, cb) = counts.items()
        sa, sb = max(1, res[a]["steps"]), max(1, res[b]["steps"])
        diff = sorted(set(ca) | set(cb), key=lambda k: -abs(ca[k] / sa - cb[k] / sb))[:8]
        print(f"ops per step, {a} / {b}, most apart: " + ", ".join(f"{k} {ca[k] / sa:.1f} / {cb[k] / sb:.1f}"
                                                                   for k in diff))
    return 0


class OpCount(TorchDispatchMode):
    """Counts the torch operators dispatched inside a ``with`` block, by name (``ops``)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

if __name__ == "__main__":
    sys.exit(main())
