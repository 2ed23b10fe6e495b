"""The pool of free large pages, lowest id first: a range of never-taken ids plus a heap of runs.

At start every large page is free and most allocations take pages no one has used yet, so
the pool keeps those as one range ``[lo, hi)``.  Pages given back are kept as runs of
consecutive ids, ``(start, end)`` in a heap: a freed request's large pages come back mostly
consecutive (they were carved as ranges), so taking them again pops a few runs, not one id
each.  The runs are disjoint and every one lies outside the range (below ``lo`` or at or above
``hi``: an id inside is free already), so the run with the smallest start holds the lowest
ids, and ``take(m)`` consumes runs below ``lo``, then the range, then runs above ``hi``: the
same ids in the same order as ``m`` pops of one heap of all free pages.
"""

from __future__ import annotations

import heapq


class FreePool:
    """Free large page ids (module doc): ``len``, iteration (any order), ``pop`` / ``take``
    the lowest, ``push`` / ``push_many`` given-back ids, ``clear``."""

    __slots__ = ("runs", "lo", "hi", "n_runs")

    def __init__(self, n: int):
        self.runs: list[tuple[int, int]] = []  # heap of disjoint (start, end) runs of free ids
        self.n_runs = 0  # ids in the runs
        self.lo, self.hi = 0, n

    def __len__(self) -> int:
        return self.n_runs + self.hi - self.lo

    def __iter__(self):
        for start, end in self.runs:
            yield from range(start, end)
        yield from range(self.lo, self.hi)

    def pop(self) -> int:
        """Remove and return the lowest free id (the pool is not empty)."""
        runs = self.runs
        if runs and (runs[0][0] < self.lo or self.lo >= self.hi):
            start, end = runs[0]
            if end - start == 1:
                heapq.heappop(runs)
            else:
                heapq.heapreplace(runs, (start + 1, end))
            self.n_runs -= 1
            return start
        assert self.lo < self.hi, "pop from an empty pool of large pages"
        self.lo += 1
        return self.lo - 1

    def take(self, m: int) -> list[int]:
        """The ``m`` lowest free ids, removed, lowest first (the pool holds at least ``m``)."""
        runs, out = self.runs, []
        while len(out) < m:
            if runs and (runs[0][0] < self.lo or self.lo >= self.hi):
                start, end = runs[0]
                c = min(m - len(out), end - start)
                out.extend(range(start, start + c))
                self.n_runs -= c
                if start + c == end:
                    heapq.heappop(runs)
                else:  # the rest of the run stays the smallest
                    heapq.heapreplace(runs, (start + c, end))
                continue
            # every run lies at or above hi now: the range's ids come first
            c = min(m - len(out), self.hi - self.lo)
            assert c > 0, "take from a pool of large pages too small"
            out.extend(range(self.lo, self.lo + c))
            self.lo += c
        return out

    def push(self, large: int) -> None:
        """``large`` is free again."""
        if large == self.lo - 1:  # next to the range: it grows (the heap stays small)
            self.lo = large
        else:
            heapq.heappush(self.runs, (large, large + 1))
            self.n_runs += 1

    def push_many(self, larges: list[int]) -> None:
        """``push`` each of the distinct ``larges`` (consecutive ids become one run)."""
        if not larges:
            return
        ids = sorted(larges)
        new, start, prev = [], ids[0], ids[0]
        for large in ids[1:]:
            if large != prev + 1:
                new.append((start, prev + 1))
                start = large
            prev = large
        new.append((start, prev + 1))
        runs = self.runs
        if len(new) > len(runs) // 8 + 8:
            runs.extend(new)
            heapq.heapify(runs)
        else:
            for run in new:
                heapq.heappush(runs, run)
        self.n_runs += len(ids)

    def clear(self) -> None:
        self.runs.clear()
        self.n_runs = 0
        self.lo = self.hi
