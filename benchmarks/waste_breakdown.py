"""Which pages make up jenga's waste on a ``vs_vllm_manager.py`` row, and the page floor.

Runs jenga's side of the same loop (``vs_vllm_manager.simulate``, same trace, budget and
``manager_traces.needed_bytes``) and, at every measurement (after the step's allocations),
splits the bytes live requests hold:

* state groups: work pages (the one state per request the definition needs), hit pages
  still held (``read``), and checkpoint pages the step writes, by position: junction, prompt
  end, tail (1, 2, 4, ... blocks before the end), periodic;
* attention groups: the *page floor* — per live request and group, the unused slots of the
  16-token block holding its first needed token (below the window start) and of the block
  holding its last.  No manager whose pages are 16-token blocks aligned at multiples of 16
  can hold less than needed + floor; the rest of attention's waste is duplicate copies.

    PYTHONPATH=src python benchmarks/waste_breakdown.py --rows llama-3.1-8b:short,jamba-1.5-mini:short

Figures are percentages of the bytes held (jenga's waste = 1 - needed / held).
"""

from __future__ import annotations

import argparse
from collections import Counter
from contextlib import contextmanager

import vs_vllm_manager as bench
from manager_sides import JengaSide
from manager_traces import BLOCK, BlockTrie

STATE_ROLES = ("work", "read", "junction", "prompt end", "tail", "periodic")


def checkpoint_role(req, pos: int, every: int) -> str:
    if pos == req.junction:
        return "junction"
    if pos == req.prompt_len // BLOCK * BLOCK:
        return "prompt end"
    return "periodic" if pos % every == 0 else "tail"


class Breakdown(JengaSide):
    """``JengaSide`` that tallies the held bytes by role at each measurement."""

    def __init__(self, model, memory: int):
        super().__init__(model, memory)
        self.acc: Counter = Counter()

    def held_bytes(self) -> tuple[int, int]:
        held, stranded = super().held_bytes()
        mgr, acc = self.mgr, self.acc
        acc["held"] += held
        pb = mgr.pool.page_bytes
        for req in mgr.requests.values():
            hi = req.num_computed + req.num_scheduled
            for gi, (g, gs) in enumerate(zip(mgr.model.groups, req.groups, strict=True)):
                s = g.spec
                if s.kind == "mamba":
                    acc["work"] += pb[gi] * (gs.work is not None)
                    acc["read"] += pb[gi] * (gs.read is not None)
                    for pos in gs.checkpoints:
                        acc[checkpoint_role(req, pos, s.checkpoint_interval)] += pb[gi]
                    continue
                lo = max(0, req.num_computed - s.window + 1) if s.kind == "sliding" else 0
                slack = (lo - lo // BLOCK * BLOCK) + (-(-hi // BLOCK) * BLOCK - hi)
                acc["page floor"] += slack * pb[gi] // g.tokens_per_page
        return held, stranded


@contextmanager
def counting_needed(acc: Counter):
    """Also add each measurement's needed bytes to ``acc`` (the loop's own function)."""
    orig = bench.needed_bytes

    def needed(model, live):
        n = orig(model, live)
        acc["needed"] += n
        return n

    bench.needed_bytes = needed
    try:
        yield
    finally:
        bench.needed_bytes = orig


def run(row: str, a) -> list[str]:
    from jenga.core.specs import ModelSpec
    name, trace = row.split(":")
    model = ModelSpec.from_hf_config(name, vision=False)
    memory, _ = bench.budget_of(name, None)
    reqs = bench.scaled(trace, a.scale)
    BlockTrie(reqs)
    side = Breakdown(model, memory)
    with counting_needed(side.acc):
        m = bench.simulate(side, model, reqs, a.budget, a.max_running)
    acc, held = side.acc, side.acc["held"]

    def pct(x):
        return f"{100 * x / held:.2f} %"

    waste = held - acc["needed"]
    state_extra = sum(acc[r] for r in STATE_ROLES[1:])
    duplicate = waste - state_extra - acc["page floor"]
    return [row, f"{100 * m['hit'] / max(m['query'], 1):.1f} %", str(m["steps"]), pct(waste)] + \
        [pct(acc[r]) for r in STATE_ROLES[1:]] + [pct(acc["page floor"]), pct(duplicate)]


HEADER = ["model:trace", "hit", "steps", "waste", "state: hit page held", "junction ckpt", "prompt-end ckpt",
          "tail ckpts", "periodic ckpts", "attention page floor", "rest (duplicate copies)"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="jamba-1.5-mini:short,jamba-1.5-mini:articles16,jamba-1.5-mini:articles64,"
                   "jamba-1.5-mini:long,llama-3.1-8b:short,ministral-8b:short")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--budget", type=int, default=8192)
    p.add_argument("--max-running", type=int, default=256)
    a = p.parse_args(argv)
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER), flush=True)
    for row in a.rows.split(","):
        print("| " + " | ".join(run(row, a)) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
