"""A long run of pages the evictor has just keyed with one release time (a free's pages, or the
window pages a free re-times): what the run's own arrays tell about its keys, so the evictor's
orders need no gather of the pages' slots.

A free's run comes first to last (positions rise, ``-prefix lengths`` fall): reversed, it is
already in eviction order (``push_back``).  A large page whose cached pages are all in the run
has the run's time and the largest ``-prefix length`` of its pages there
(``FreshRun.largest_keys``); the others are looked up as usual.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jenga.core.evict.run_heap import SMALL, RunHeap
from jenga.core.flat_arrays import view


def push_back(heap: RunHeap, t: int, ns: np.ndarray, falling: bool, back: np.ndarray, gs: np.ndarray) -> None:
    """Push a run keyed ``(t, ns[i])`` (``ns`` first to last, ``back`` its ids last first,
    contiguous; ``falling``: ``ns`` falls strictly, so the reversal is in order)."""
    nb = ns[::-1].copy()
    ts = np.full(len(nb), t, dtype=np.int64)
    if falling and len(nb) > SMALL:
        heap.push_sorted(ts, nb, back, gs)
    else:
        heap.push(ts, nb, back, gs)


class FreshRun:
    """Pages ``ids`` of ``group`` keyed ``(t, negs[i])`` just now (``negs``: ``-prefix length``
    per page, in run order).  Where the pages' large pages (``ids // k``) never fall in run
    order, ``larges`` are those large pages, ascending, with ``counts`` pages each, the first at
    ``starts`` (the allocator's bookkeeping and the large-page keys share them); else None."""

    __slots__ = ("group", "t", "ids", "negs", "falling", "larges", "counts", "starts")

    def __init__(self, group: int, t: int, ids: np.ndarray, negs: np.ndarray, k: int):
        self.group, self.t, self.ids, self.negs = group, t, ids, negs
        self.falling = bool((negs[1:] < negs[:-1]).all())  # positions rise (a free's run)
        self.larges = self.counts = self.starts = None
        if k > 1:
            q = ids // k
            if (q[1:] >= q[:-1]).all():
                starts = np.flatnonzero(q[1:] != q[:-1]) + 1
                self.starts = np.concatenate((np.zeros(1, dtype=np.int64), starts))
                self.larges = q[self.starts]
                self.counts = np.diff(np.append(self.starts, len(q)))

    def largest_negs(self) -> np.ndarray:
        """Per large page of ``larges``: the largest ``-prefix length`` of its pages in the run."""
        return self.negs[self.starts] if self.falling else np.maximum.reduceat(self.negs, self.starts)

    def largest_keys(self, larges: np.ndarray, n_cached,
                     largest: Callable[[int, np.ndarray], tuple[np.ndarray, np.ndarray]]
                     ) -> tuple[np.ndarray, np.ndarray]:
        """The largest key of the cached pages of each of ``larges`` (ascending, in E; needs
        ``larges`` set): the run's where all of a large page's cached pages (``n_cached`` per
        large page) are in the run, else ``largest(group, those)``."""
        seg, counts, ns = self.larges, self.counts, self.largest_negs()
        if len(seg) != len(larges) or not (seg == larges).all():  # some large pages stay out of E
            idx = np.searchsorted(seg, larges)
            idx[idx == len(seg)] = 0
            inside = seg[idx] == larges
            counts, ns = counts[idx], ns[idx]
        else:
            inside = True
        only = inside & (view(n_cached)[larges] == counts)
        ts = np.full(len(larges), self.t, dtype=np.int64)
        if not only.all():
            rest = np.flatnonzero(~only)
            ts[rest], ns[rest] = largest(self.group, larges[rest])
        return ts, ns
