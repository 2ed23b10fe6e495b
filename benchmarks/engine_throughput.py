"""Engine throughput and per-step Python overhead, jenga vs paged, on the ``jenga bench`` workload.

Usage: ``python benchmarks/engine_throughput.py [--requests N] [--kv-memory 12MiB] ...`` (the same
options as ``jenga bench``).  Prints, per manager: output tokens/s, steps, mean decode batch,
time in the model forward, and the engine's own time outside it (scheduling, KV-cache manager,
attention metadata, sampling) per step and as a share of the wall time.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table


def main(argv: list[str] | None = None) -> int:
    import torch

    from jenga.bench import add_bench_parser, make_workload, run_engine
    from jenga.engine.tiny import tiny_hf_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_parser(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["bench", *(argv if argv is not None else sys.argv[1:])])
    torch.set_num_threads(args.threads)
    vocab = tiny_hf_config(args.model).vocab_size
    work = make_workload(args.requests, args.prompt_min, args.prompt_max, args.output_len, vocab, args.seed,
                         args.shared_prefix)
    names = [n.strip() for n in args.managers.split(",") if n.strip()]
    res = {name: run_engine(name, args, work, track_kv_stats=False) for name in names}
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
    for label, fmt in rows:
        t.add_row(label, *(fmt(r) for r in res.values()))
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
