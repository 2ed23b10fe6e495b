"""Manager CPU cost per scheduler step on a decode-heavy trace.

256 running requests of mixed families (each family gets its own manager, as an engine
serving that model would), prompts of 1-4k tokens, then decode steps where every request
allocates one token and appends its sampled token.  Prints microseconds per step (all 256
requests) for jenga and the baselines side by side, measured in this run.

    .venv/bin/python benchmarks/manager_overhead.py [--requests 256] [--steps 200]
"""

from __future__ import annotations

import argparse
import random
import time

from rich.console import Console
from rich.table import Table

from jenga.baselines import make_manager
from jenga.core.specs import ModelSpec

FAMILIES = ("gemma-3-12b", "ministral-8b", "llama-4-scout", "jamba-1.5-mini", "llama-3.1-8b")


def prefill(mgr, n_req: int, rng: random.Random) -> None:
    for r in range(n_req):
        length = rng.randrange(1024, 4096)
        mgr.add_request(r, [rng.randrange(32000) for _ in range(length)])
        mgr.lookup(r)
        done = mgr.requests[r].num_computed
        while done < length:
            n = min(2048, length - done)
            assert mgr.allocate(r, n) is not None, f"{mgr.name}: memory too small for request {r}"
            done += n
            mgr.append_tokens(r, [1] if done == length else [])


def decode(mgr, n_req: int, steps: int) -> float:
    t0 = time.perf_counter()
    for s in range(steps):
        for r in range(n_req):
            mgr.allocate(r, 1)
            mgr.append_tokens(r, [s])
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--managers", default="jenga,paged,uniform")
    args = ap.parse_args()
    table = Table(title=f"manager CPU time per decode step, {args.requests} running requests")
    table.add_column("model")
    names = args.managers.split(",")
    for n in names:
        table.add_column(f"{n} µs/step", justify="right")
    table.add_column("jenga µs/request", justify="right")
    for fam in FAMILIES:
        model = ModelSpec.from_hf_config(fam)
        row = [fam]
        jenga_us = 0.0
        for name in names:
            mgr = make_manager(name, model, 400 << 30)
            prefill(mgr, args.requests, random.Random(0))
            mgr.check_integrity()
            us = decode(mgr, args.requests, args.steps) * 1e6
            mgr.check_integrity()
            jenga_us = us if name == "jenga" else jenga_us
            row.append(f"{us:,.0f}")
        row.append(f"{jenga_us / args.requests:.2f}")
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
