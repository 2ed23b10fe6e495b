"""``CopyPlan``: the page copies between the device and host tiers an engine runs before a step.

The manager records pairs as pages move (``PendingCopies``) and hands them out once per step
(``KVCacheManager.take_copy_plan``, after the step's allocations).  The engine runs every demote,
then every promote, before the step's forward: a device page listed in a demote may already be
handed out again (its new content is written after the copy), and a promote may read a host page
a demote of the same plan writes.  Page ids are small-page ids of their group, as in ``PageTables``;
a host ``KVLayout`` of the same model addresses host pages exactly as the device layout does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _pairs(d: dict[tuple[int, int], int], key_first: bool) -> dict[int, np.ndarray]:
    """Per group, (n, 2) int64 pairs sorted by their first column."""
    out: dict[int, list[tuple[int, int]]] = {}
    for (g, a), b in d.items():
        out.setdefault(g, []).append((a, b) if key_first else (b, a))
    return {g: np.array(sorted(rows), dtype=np.int64).reshape(-1, 2) for g, rows in sorted(out.items())}


@dataclass(frozen=True)
class CopyPlan:
    """``demote[g]``: rows (device page, host page); ``promote[g]``: rows (host page, device page);
    ``bytes``: the bytes all of them copy (each page its group's small-page bytes)."""

    demote: dict[int, np.ndarray] = field(default_factory=dict)
    promote: dict[int, np.ndarray] = field(default_factory=dict)
    bytes: int = 0

    @property
    def empty(self) -> bool:
        return not self.demote and not self.promote

    @property
    def num_pages(self) -> int:
        return sum(len(a) for a in self.demote.values()) + sum(len(a) for a in self.promote.values())


class PendingCopies:
    """The pairs recorded since the last plan: a demote keyed by its host page, a promote by its
    device page (a promoted page the device evicts again before the plan is taken loses its pair)."""

    def __init__(self, page_bytes: list[int]):
        self.page_bytes = page_bytes
        self.demote: dict[tuple[int, int], int] = {}  # (group, host page) -> device page
        self.promote: dict[tuple[int, int], int] = {}  # (group, device page) -> host page

    def take(self) -> CopyPlan:
        """The plan of everything recorded; the record starts empty again."""
        pb = self.page_bytes
        nbytes = sum(pb[g] for g, _ in self.demote) + sum(pb[g] for g, _ in self.promote)
        plan = CopyPlan(_pairs(self.demote, False), _pairs(self.promote, False), nbytes)
        self.demote, self.promote = {}, {}
        return plan
