"""Speculative decoding: draft + target caches in one jenga pool vs fixed per-group pools.

Both runs use the same engine, requests and total KV memory; only the manager differs:

* ``jenga``: the combined spec (target groups + ``draft/`` groups) in one LCM pool, pages move
  between the target's and the draft's groups as requests need them;
* ``static``: the same pages, but every group owns a fixed share of the large pages decided at
  start-up (the paper artifact's static partition: ``w_g = page bytes x 1.0 for full, 0.5 for
  sliding``), i.e. the memory split into fixed pools for the target's and the draft's groups.

Target: the built-in ``tiny-gemma3`` (5 sliding : 1 full).  Draft (``--draft tiny-gemma3``, the
default): the same architecture with the target's weights plus N(0, ``--draft-noise``) (random
weights would almost never agree with the target; a perturbed copy is accepted part of the
time).  ``--draft tiny-llama``: a 2-layer full-attention Llama with its own random weights (a
draft whose cache is shaped unlike the target's; almost nothing is accepted).  Greedy,
EOS ignored, fp32 on the CPU, one thread.  Prints tokens/s, acceptance rate, tokens per target
forward, the largest running batch and preemptions, and checks that both runs emit the same
tokens.

Usage: ``python benchmarks/spec_decode_pool.py [--requests 24] [--kv-memory 10MiB] [--k 3]``;
``--markdown --outcome`` prints the rows every run of the same code prints alike (no tokens/s) as
Markdown: the README's generated tables.
"""

from __future__ import annotations

import argparse
import time


def run(manager: str, prompts, args) -> dict:
    import torch

    import jenga
    from jenga import SamplingParams

    copy = args.draft == "tiny-gemma3"
    llm = jenga.LLM("tiny-gemma3", manager=manager, kv_memory=args.kv_memory, speculative_model=args.draft,
                    num_speculative_tokens=args.k, speculative_seed=0 if copy else None,
                    max_num_batched_tokens=args.max_num_batched_tokens)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in llm.speculative.draft.model.parameters() if copy else ():
            p.add_(torch.randn(p.shape, generator=gen) * args.draft_noise)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    llm.generate([list(range(3, 40))], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    llm.reset_metrics()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    m, s = llm.metrics, llm.scheduler.stats
    return dict(tokens_per_s=m.output_tokens / wall, wall_s=wall, acceptance=m.acceptance_rate,
                per_forward=m.tokens_per_target_forward, max_running=s.max_running, preemptions=s.preemptions,
                decode_batch=s.batch_mean, tokens=[o.token_ids for o in outs])


def main(argv=None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from jenga.bench import make_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-min", type=int, default=160)
    ap.add_argument("--prompt-max", type=int, default=320)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--kv-memory", default="10MiB")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--draft", default="tiny-gemma3",
                    help="tiny-gemma3: a perturbed copy of the target; another tiny name: its random weights")
    ap.add_argument("--draft-noise", type=float, default=0.02)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--outcome", action="store_true", help="only the rows that do not depend on the machine "
                    "(no tokens/s)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    work = make_workload(args.requests, args.prompt_min, args.prompt_max, args.output_len, 512, args.seed)
    res = {name: run(name, work.prompts, args) for name in ("jenga", "static")}
    if res["jenga"]["tokens"] != res["static"]["tokens"]:
        raise SystemExit("outputs differ between the two managers")
    if args.markdown:
        print(markdown(res["jenga"], res["static"], args.outcome))
        return 0
    t = Table(title=f"speculative decoding (k={args.k}): tiny-gemma3 target + {args.draft} draft, {args.requests} requests, "
                    f"KV {args.kv_memory}")
    t.add_column("metric")
    for name in ("jenga (one pool)", "static (fixed pools)", "jenga / static"):
        t.add_column(name, justify="right")
    j, s = res["jenga"], res["static"]
    t.add_row("tokens/s", f"{j['tokens_per_s']:.1f}", f"{s['tokens_per_s']:.1f}",
              f"[bold]{j['tokens_per_s'] / s['tokens_per_s']:.2f}x[/bold]")
    t.add_row("acceptance rate", f"{j['acceptance']:.2f}", f"{s['acceptance']:.2f}", "")
    t.add_row("tokens / target forward", f"{j['per_forward']:.2f}", f"{s['per_forward']:.2f}", "")
    t.add_row("max running batch", str(j["max_running"]), str(s["max_running"]),
              f"{j['max_running'] / max(1, s['max_running']):.2f}x")
    t.add_row("mean batch", f"{j['decode_batch']:.1f}", f"{s['decode_batch']:.1f}", "")
    t.add_row("preemptions", str(j["preemptions"]), str(s["preemptions"]), "")
    Console().print(t)
    return 0


def markdown(j: dict, s: dict, outcome: bool) -> str:
    """The table as Markdown; ``outcome``: without tokens/s (machine-dependent)."""
    rows = [] if outcome else [("tokens/s", f"{j['tokens_per_s']:.1f}", f"{s['tokens_per_s']:.1f}",
                                f"{j['tokens_per_s'] / s['tokens_per_s']:.2f}x")]
    rows += [("acceptance rate", f"{j['acceptance']:.2f}", f"{s['acceptance']:.2f}", ""),
             ("tokens / target forward", f"{j['per_forward']:.2f}", f"{s['per_forward']:.2f}", ""),
             ("max running batch", str(j["max_running"]), str(s["max_running"]),
              f"{j['max_running'] / max(1, s['max_running']):.2f}x"),
             ("mean batch", f"{j['decode_batch']:.1f}", f"{s['decode_batch']:.1f}", ""),
             ("preemptions", str(j["preemptions"]), str(s["preemptions"]), "")]
    out = ["| metric | jenga (one pool) | static (fixed pools) | jenga / static |", "|---|---|---|---|"]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])


if __name__ == "__main__":
    raise SystemExit(main())
