"""The host KV tier in the simulator: each step's copy plan costed on the GPU's host link.

:class:`HostTierTotals` takes the manager's copy plan of every step (``take_copy_plan()``) and
returns its seconds: ``demote bytes / link + promote bytes / link`` (:meth:`CostModel.host_copy_time`,
one direction at a time, not overlapped with the step; see :mod:`jenga.sim.simulator`).  At the
end it reads the manager's tier counters and prices the alternative the tier avoids: prefilling
the tokens served from host again (:attr:`recompute_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jenga.core.specs import ModelSpec
from jenga.sim.gpu import CostModel


@dataclass
class HostTierTotals:
    """Bytes and seconds of one simulation's host-tier copies."""

    model: ModelSpec = field(repr=False)
    cost: CostModel = field(repr=False)
    bytes_demoted: int = 0
    bytes_promoted: int = 0
    copy_s: float = 0.0
    copy_steps: int = 0  # steps with at least one copy
    host_hit_tokens: int = 0
    host_total_bytes: int = 0
    host_peak_used_bytes: int = 0
    recompute_s: float = 0.0

    def _bytes(self, pairs_by_group: dict) -> int:
        return sum(len(np.asarray(p).reshape(-1, 2)) * self.model.groups[g].page_bytes
                   for g, p in pairs_by_group.items())

    def take(self, plan) -> float:
        """Count ``plan``'s bytes; returns its seconds (0 for an empty plan)."""
        if plan is None or plan.empty:
            return 0.0
        down, up = self._bytes(plan.demote), self._bytes(plan.promote)
        self.bytes_demoted += down
        self.bytes_promoted += up
        t = self.cost.host_copy_time(down) + self.cost.host_copy_time(up)
        self.copy_s += t
        self.copy_steps += 1
        return t

    def observe(self, stats) -> None:
        """Track the host tier's peak use from a ``stats()`` sample."""
        self.host_peak_used_bytes = max(self.host_peak_used_bytes, stats.host_used_bytes)

    def close(self, stats) -> None:
        """Read the manager's final counters; price recomputing the host hits (one cold prefill)."""
        self.observe(stats)
        self.host_total_bytes = stats.host_total_bytes
        self.host_hit_tokens = stats.host_hit_tokens
        n = self.host_hit_tokens
        self.recompute_s = self.cost.step_time(n, 0, num_seqs=1) if n else 0.0

    def summary(self) -> dict:
        return {"host_total_bytes": self.host_total_bytes, "host_peak_used_bytes": self.host_peak_used_bytes,
                "host_hit_tokens": self.host_hit_tokens, "bytes_demoted": self.bytes_demoted,
                "bytes_promoted": self.bytes_promoted, "host_copy_s": self.copy_s,
                "host_recompute_s": self.recompute_s}
