"""The pool of free large pages, lowest id first: a range of never-taken ids plus a heap.

At start every large page is free and most allocations take pages no one has used yet, so
the pool keeps those as one range ``[lo, hi)`` and only pages given back in a heap.  Every
heap id lies outside the range (below ``lo`` or at or above ``hi``: an id inside is free
already), so ``take(m)`` pops heap ids while they are below ``lo`` and then slices the range:
the same ids in the same order as ``m`` pops of one heap of all free pages, without a
``heappop`` per page (a one-page-per-large-page model carves one large page per page).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left

SORT_TAKE = 32  # a take of at least this many ids, from a heap at least this big and at most 8x as big, sorts it


class FreePool:
    """Free large page ids (module doc): ``len``, iteration (any order), ``pop`` / ``take``
    the lowest, ``push`` / ``push_many`` given-back ids, ``clear``."""

    __slots__ = ("heap", "lo", "hi")

    def __init__(self, n: int):
        self.heap: list[int] = []
        self.lo, self.hi = 0, n

    def __len__(self) -> int:
        return len(self.heap) + self.hi - self.lo

    def __iter__(self):
        yield from self.heap
        yield from range(self.lo, self.hi)

    def pop(self) -> int:
        """Remove and return the lowest free id (the pool is not empty)."""
        heap = self.heap
        if heap and (heap[0] < self.lo or self.lo >= self.hi):
            return heapq.heappop(heap)
        assert self.lo < self.hi, "pop from an empty pool of large pages"
        self.lo += 1
        return self.lo - 1

    def take(self, m: int) -> list[int]:
        """The ``m`` lowest free ids, removed, lowest first (the pool holds at least ``m``)."""
        heap, out = self.heap, []
        if m >= SORT_TAKE and SORT_TAKE <= len(heap) <= 8 * m:  # (a sort costs ~ a pop per 8 ids)
            return self._take_sorted(m)
        while len(out) < m:
            if heap and (heap[0] < self.lo or self.lo >= self.hi):
                out.append(heapq.heappop(heap))
                continue
            # every heap id is at or above hi now: the range's ids come first
            c = min(m - len(out), self.hi - self.lo)
            assert c > 0, "take from a pool of large pages too small"
            out.extend(range(self.lo, self.lo + c))
            self.lo += c
        return out

    def _take_sorted(self, m: int) -> list[int]:
        """``take`` of many ids from a big heap: one sort (a sorted list is a heap) and slices,
        not a ``heappop`` per id.  Heap ids below ``lo`` come first, then the range, then the
        heap ids at or above ``hi``."""
        heap = self.heap
        heap.sort()
        below = bisect_left(heap, self.lo)
        t = min(m, below)
        out = heap[:t]
        c = min(m - t, self.hi - self.lo)
        out.extend(range(self.lo, self.lo + c))
        self.lo += c
        r = m - t - c
        assert r <= len(heap) - below, "take from a pool of large pages too small"
        out.extend(heap[below:below + r])
        del heap[below:below + r]
        del heap[:t]
        return out

    def push(self, large: int) -> None:
        """``large`` is free again."""
        if large == self.lo - 1:  # next to the range: it grows (the heap stays small)
            self.lo = large
        else:
            heapq.heappush(self.heap, large)

    def push_many(self, larges: list[int]) -> None:
        """``push`` each of the distinct ``larges``."""
        heap = self.heap
        if len(larges) > len(heap) // 8 + 8:
            heap.extend(larges)
            heapq.heapify(heap)
        else:
            for large in larges:
                heapq.heappush(heap, large)

    def clear(self) -> None:
        self.heap.clear()
        self.lo = self.hi
