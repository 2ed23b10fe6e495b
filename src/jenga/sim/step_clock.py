"""Simulated seconds of a run whose loop drives a manager itself (``benchmarks/host_tier.py``).

The loop reports what each step computed -- per request the context end after the step and its
new tokens (:meth:`StepClock.computed`) -- and closes the step with the copy plan taken after the
step's allocations (:meth:`StepClock.step_done`).  A step costs what the simulator charges
(:mod:`jenga.sim.simulator`): the cost model's step time over the KV bytes the real model reads
(:class:`~jenga.sim.costing.StepCoster`; a one-token step of a request counts as decode), plus the
plan's copies on the GPU's host link, serial (:class:`~jenga.sim.host_copies.HostTierTotals`).
"""

from __future__ import annotations

import numpy as np

from jenga.core.specs import ModelSpec
from jenga.sim.host_copies import HostTierTotals
from jenga.sim.setup import Setup


class StepClock:
    """Seconds of the steps reported so far (:attr:`seconds`), of which copies :attr:`copies`.

    ``model`` is the manager's own spec (its page sizes price the plans' pages)."""

    def __init__(self, setup: Setup, model: ModelSpec):
        self.setup = setup
        self.copies = HostTierTotals(model, setup.cost)
        self.seconds = 0.0
        self.steps = 0
        self._end: list[int] = []
        self._new: list[int] = []

    def computed(self, end: int, new: int) -> None:
        """One request of the open step: ``new`` tokens computed, ``end`` tokens in context after them."""
        self._end.append(end)
        self._new.append(new)

    def step_done(self, plan=None) -> float:
        """Close the open step (with its copy plan, if any); returns its seconds."""
        t = self.copies.take(plan)
        if self._end:
            end, q = np.array(self._end, np.int64), np.array(self._new, np.int64)
            kv, flops = self.setup.coster.step(end, q, np.zeros_like(end))
            dec = q == 1
            t += self.setup.cost.step_time(int(q[~dec].sum()), int(dec.sum()), kv, attention_flops=flops,
                                           num_seqs=len(end))
            self.steps += 1
            self._end.clear()
            self._new.clear()
        self.seconds += t
        return t
