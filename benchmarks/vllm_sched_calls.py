"""Where the scheduler's CPU time goes inside vLLM: each KV-cache manager call, stock and jenga.

One row of ``vllm_side_by_side.py`` (the same engines, the same workload, the same ``Counters``),
stock at one setting and jenga, one after the other in this process.  Prints the scheduler's own CPU
time per step (``schedule()`` + ``update_from_output()``, the thread's CPU time, as the side-by-side
table) and, per engine, the thread CPU time and count of every call vLLM's scheduler makes on its
KV-cache manager and of jenga's own per-step hooks (``HitsFirst.reorder``, ``PrefixWait.holds``);
each call's time includes its timer's (about 2 µs per call), so counts compare better than
small totals.  The outcome columns (prompt tokens computed, preemptions, hits per round) show a
change left the decisions alone::

    .venv/bin/python benchmarks/vllm_sched_calls.py control
    .venv/bin/python benchmarks/vllm_sched_calls.py chat --stock '{"prefix_cache_retention_interval": null}'

``--stock`` / ``--jenga``: extra engine arguments (JSON), e.g. the setting that won the row in the
side-by-side table; ``--blocks``: the budget (default the row's first); ``--hits``: also each
request's hit (the last lookup before its admission), as (prompt tokens, hit) pairs per engine,
and for jenga each group's longest cached prefix at that lookup where it differs from the hit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import vllm_side_by_side as sbs

#: what vLLM's scheduler calls on its KV-cache manager (those a manager lacks are skipped)
CALLS = ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "take_events", "new_step_starts",
         "get_num_cached_tokens", "get_blocks", "get_block_ids", "take_kv_cache_block_copies",
         "remove_skipped_blocks", "record_prefix_cache_stats")


class Timed(sbs.Counters):
    """``vllm_side_by_side.Counters`` plus the CPU time and count of each manager call (``calls``)
    and each request's last lookup (``hits``: request id -> (prompt tokens, hit, per-group longest
    prefixes or None))."""

    def __init__(self, sched, hits: bool = False):
        super().__init__(sched)
        self.calls: dict[str, list] = {}
        self.hits: dict[str, tuple] = {}
        if hits:  # inside the timed lookups: their times then count this too
            self._record_hits(sched.kv_cache_manager)
        for name in CALLS:
            self._wrap(sched.kv_cache_manager, name, name)
        for hook, name in ((getattr(sched, "admission", None), "reorder"), (getattr(sched, "prefix_wait", None),
                                                                            "holds")):
            if hook is not None:
                self._wrap(hook, name, f"{type(hook).__name__}.{name}")

    def _record_hits(self, kv) -> None:
        lookup, mgr = kv.get_computed_blocks, getattr(kv, "manager", None)

        def get_computed_blocks(request, *a, **k):
            out = lookup(request, *a, **k)
            groups = None
            if mgr is not None and request.request_id in mgr.requests:
                req, pl = mgr.requests[request.request_id], mgr.prefix_lookup
                top = pl.top(req, None)
                groups = tuple(pol.longest_prefix(req, top, mgr.ledger) for pol in pl.policies)
            self.hits[request.request_id] = (request.num_tokens, out[1], groups)
            return out
        kv.get_computed_blocks = get_computed_blocks

    def _wrap(self, obj, name: str, label: str) -> None:
        f = getattr(type(obj), name, None) and getattr(obj, name)
        if f is None:
            return
        acc = self.calls.setdefault(label, [0, 0.0])

        def timed(*a, **k):
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                acc[0] += 1
                acc[1] += time.thread_time() - t
        setattr(obj, name, timed)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("row", help="a row of vllm_side_by_side.py: articles, hybrid, hybrid32, chat, control")
    ap.add_argument("--blocks", type=int, default=None, help="the budget in vLLM blocks (default the row's first)")
    ap.add_argument("--stock", default="{}", help="stock's extra engine arguments (JSON)")
    ap.add_argument("--jenga", default="{}", help="jenga's extra engine arguments (JSON)")
    ap.add_argument("--chunk", type=int, default=128, help="max_num_batched_tokens, both engines")
    ap.add_argument("--hits", action="store_true", help="each request's hit per engine (and jenga's per group)")
    args = ap.parse_args(argv)
    sbs._need_vllm()
    from vllm_support import close, engine, model_dir

    family, kw, rounds_fn, budgets = sbs.rows(False)[args.row]
    blocks = args.blocks or budgets[0]
    path = model_dir(family, Path(tempfile.mkdtemp(prefix="jenga-vllm-calls-")))
    counters: list[Timed] = []
    sbs.Counters = lambda sched: counters.append(Timed(sched, args.hits)) or counters[-1]
    per_step = {}
    for side, extra in (("stock", json.loads(args.stock)), ("jenga", json.loads(args.jenga))):
        llm = engine(path, jenga=side == "jenga", num_blocks=blocks, max_model_len=sbs.longest(rounds_fn),
                     **{"dtype": "float32", "max_num_batched_tokens": args.chunk, **kw, **extra})
        r = sbs.run(llm, rounds_fn())
        close(llm)
        c = counters[-1]
        per_step[side] = r["sched_us"]
        print(f"{args.row} {blocks} {side}: {c.steps} steps, scheduler {r['sched_us']:.0f} µs/step; prompt computed "
              f"{r['computed']}/{r['prompt']}, preempt {r['preempt']}, hits per round {r['rounds']}")
        for label, (n, s) in sorted(c.calls.items(), key=lambda kv: -kv[1][1]):
            if n:
                print(f"    {label:34s} {n:7d} calls {1e3 * s:9.1f} ms {1e6 * s / n:8.1f} µs/call")
        if args.hits:
            pairs = sorted((n, hit) for n, hit, _ in c.hits.values())
            print(f"    hits (prompt, hit), {sum(h for _, h in pairs)} tokens: {pairs}")
            for n, hit, groups in sorted(c.hits.values(), key=lambda v: v[:2]):
                if groups is not None and any(g != hit for g in groups):
                    print(f"    prompt {n}: hit {hit}, longest cached prefix per group {list(groups)}")
        sys.stdout.flush()
    print(f"{args.row} {blocks}: scheduler CPU per step jenga / stock {per_step['jenga'] / per_step['stock']:.2f}x")


if __name__ == "__main__":
    main()
