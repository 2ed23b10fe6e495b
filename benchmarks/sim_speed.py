"""How fast the simulator runs: arXiv-QA-length requests on a 48-layer model.

    .venv/bin/python benchmarks/sim_speed.py [--requests 1000] [--model gemma-3-12b]
        [--managers jenga,paged] [--tokens-per-page 16] [--record-every 10] [--profile out.prof]

Prints wall seconds per manager and simulated requests per wall-second (target: 1,000
requests in under a minute for jenga).  ``--profile`` writes a cProfile dump of the jenga run
and prints its top functions, to find hot spots in the manager.
"""

from __future__ import annotations

import argparse
import time

from jenga.sim.setup import build_setup
from jenga.sim.simulator import SimConfig, Simulator
from jenga.sim.workloads import get_workload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--model", default="gemma-3-12b", help="48 layers: gemma-3-12b or llama-4-scout (--tp 8)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--managers", default="jenga,paged")
    p.add_argument("--tokens-per-page", type=int, default=16)
    p.add_argument("--record-every", type=int, default=10)
    p.add_argument("--rate", type=float, default=0.5, help="arrivals per second (Poisson)")
    p.add_argument("--profile", default=None, metavar="OUT.prof")
    args = p.parse_args(argv)

    st = build_setup(args.model, args.gpu, args.tp, tokens_per_page=args.tokens_per_page)
    t0 = time.perf_counter()
    w = get_workload("arxiv-qa", num_requests=args.requests, rate=args.rate,
                     max_len=min(131072, st.target.max_model_len))
    tokens = sum(r.prompt_len + r.output_len for r in w)
    print(f"{args.model} ({st.target.num_layers} layers) TP{args.tp} on {args.gpu}: {len(w)} arxiv-qa requests, "
          f"{tokens / 1e6:.1f}M tokens, tokens/page {args.tokens_per_page}, KV {st.memory_bytes / 2**30:.1f} GiB "
          f"(trace built in {time.perf_counter() - t0:.2f}s)")
    cfg = SimConfig(tokens_per_page=args.tokens_per_page, record_every=args.record_every)
    sim = Simulator(st, cfg)
    for name in [m.strip() for m in args.managers.split(",") if m.strip()]:
        t = time.perf_counter()
        if args.profile and name == "jenga":
            import cProfile
            import pstats

            prof = cProfile.Profile()
            r = prof.runcall(sim.run, w, name)
            prof.dump_stats(args.profile)
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        else:
            r = sim.run(w, name)
        wall = time.perf_counter() - t
        s = r.summary()
        print(f"{name:>8}: {wall:7.1f} s wall, {r.num_requests / wall:7.1f} simulated req/s, "
              f"{tokens / wall / 1e6:5.2f}M tokens/s, {r.steps} steps ({r.steps / wall:,.0f} steps/s); "
              f"sim: {s['throughput_req_s']:.3f} req/s, waste {s['waste_frac_mean']:.1%}, "
              f"preemptions {s['preemptions']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
