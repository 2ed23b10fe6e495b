"""A heap of sorted runs: pops in exactly the order a heap of one ``(t, n, id)`` entry per
element would, at one heap entry per *run* of elements released together.

A free hands the evictor thousands of pages at once; one tuple and one heap push per page
was most of its cost.  Here a batch becomes one run (numpy arrays sorted by ``(t, n, id)``
and a cursor); the heap holds ``(t, n, id, run)`` of each run's next element.  A heap of
several sorted sequences keyed by their heads pops the same elements in the same order as
one heap of all their elements (a merge), so the eviction order is unchanged.

Elements go stale (the page was hit, evicted or re-released): the owner says which are
still valid (``check`` for one, ``check_many`` for a numpy slice; ``g`` is what the owner
stored with the element, e.g. a version).  Stale elements are skipped when they reach the
head, and runs with nothing valid left are dropped now and then (``compact``).  Batches of
at most ``SMALL`` elements are pushed as single entries (``run`` = -1 - g): a decode step's
one page costs a tuple, not a run.

Pushes are lazy: a push is queued as it was called and the queue is replayed, in order, by
the first call that reads the heap (``top``, ``len``, ``compact`` ...; ``flush``).  A reader
sees the heap the eager pushes would have built, up to stale elements dropped at the
replay's compactions, which drop only elements no later push can make valid again (an
element is valid again only when the owner pushes it anew).  A free whose pages are never
evicted costs a list append per batch, not a heap push per element.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np

SMALL = 32
_EMPTY = np.zeros(0, dtype=np.int64)


class RunHeap:
    """Sorted runs behind one heap (module doc)."""

    __slots__ = ("heap", "runs", "check", "check_many", "reads", "_next", "_pushed", "_base", "_queue", "_queued")

    def __init__(self, check: Callable[[int, int, int, int], bool],
                 check_many: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 reads: str = "tnig"):
        self.heap: list[tuple[int, int, int, int]] = []
        self.runs: dict[int, list] = {}  # run number -> [ts, ns, ids, gs, pos]
        self.check, self.check_many = check, check_many
        self.reads = [x for x, name in enumerate("tnig") if name in reads]  # what check_many looks at
        self._next = 0
        self._pushed = 0  # elements pushed since the last compaction
        self._base = 0  # elements left right after it
        self._queue: list[tuple] = []  # pushes not replayed yet: (method, arguments)
        self._queued = 0  # their elements

    def __len__(self) -> int:
        """Heap entries (runs and single elements), stale ones included."""
        if self._queue:
            self.flush()
        return len(self.heap)

    def _defer(self, method, args: tuple, m: int) -> None:
        """Queue a push of ``m`` elements (replayed at once when the queue outgrows the heap)."""
        self._queue.append((method, args))
        self._queued += m
        if self._queued > 2 * self._base + 4096:
            self.flush()

    def flush(self) -> None:
        """Replay the queued pushes in order (every reader calls this first)."""
        queue, self._queue, self._queued = self._queue, [], 0
        for method, args in queue:
            method(self, *args)

    def push(self, ts, ns, ids, gs) -> None:
        """Add elements ``(ts[i], ns[i], ids[i])`` with owner data ``gs[i]`` (sequences of ints,
        any order; not changed by the caller afterwards)."""
        self._defer(RunHeap._push_now, (ts, ns, ids, gs), len(ids))

    def _push_now(self, ts, ns, ids, gs) -> None:
        m = len(ids)
        if m == 0:
            return
        if self._pushed + m > 2 * self._base + 1024:
            self.compact()  # before the push: the new elements need no check
        if m <= SMALL:
            push, heap = heapq.heappush, self.heap
            if not all(type(x) is list for x in (ts, ns, ids, gs)):
                ts, ns, ids, gs = ([int(v) for v in x] for x in (ts, ns, ids, gs))
            for t, n, i, g in zip(ts, ns, ids, gs, strict=True):
                push(heap, (t, n, i, -1 - g))
        else:
            ts, ns, ids, gs = (np.asarray(x, dtype=np.int64) for x in (ts, ns, ids, gs))
            if _in_order(ts, ns, ids):
                ts, ns, ids, gs = (np.ascontiguousarray(x) for x in (ts, ns, ids, gs))
            else:
                order = np.lexsort((ids, ns, ts))
                ts, ns, ids, gs = ts[order], ns[order], ids[order], gs[order]
            self._push_run([ts, ns, ids, gs, 0])
        self._pushed += m

    def push_made(self, make: Callable[[], tuple], m: int) -> None:
        """``push`` of the ``(ts, ns, ids, gs)`` that ``make()`` returns when the queue is
        replayed (at most ``m`` elements): the owner computes the keys of only the elements
        still valid then, each of which has kept the key it had now."""
        self._defer(RunHeap._push_made_now, (make,), m)

    def _push_made_now(self, make: Callable[[], tuple]) -> None:
        self._push_now(*make())

    def push_sorted(self, ts: np.ndarray, ns: np.ndarray, ids: np.ndarray, gs: np.ndarray) -> None:
        """``push`` of more than ``SMALL`` elements given as contiguous int64 arrays already in
        ``(t, n, id)`` order (the caller has checked it): one run, no order check, no copy."""
        assert len(ids) > SMALL, "push_sorted of a short batch"
        self._defer(RunHeap._push_sorted_now, (ts, ns, ids, gs), len(ids))

    def _push_sorted_now(self, ts: np.ndarray, ns: np.ndarray, ids: np.ndarray, gs: np.ndarray) -> None:
        m = len(ids)
        if self._pushed + m > 2 * self._base + 1024:
            self.compact()
        self._push_run([ts, ns, ids, gs, 0])
        self._pushed += m

    def push_singles(self, entries: list[tuple[int, int, int, int]]) -> None:
        """``push`` of at most ``SMALL`` elements given as ``(t, n, id, -1 - g)`` tuples (Python ints)."""
        assert len(entries) <= SMALL
        self._defer(RunHeap._push_singles_now, (entries,), len(entries))

    def _push_singles_now(self, entries: list[tuple[int, int, int, int]]) -> None:
        if self._pushed + len(entries) > 2 * self._base + 1024:
            self.compact()
        push, heap = heapq.heappush, self.heap
        for e in entries:
            push(heap, e)
        self._pushed += len(entries)

    def _push_run(self, run: list) -> None:
        r = self._next
        self._next += 1
        self.runs[r] = run
        ts, ns, ids, _, pos = run
        heapq.heappush(self.heap, (ts.item(pos), ns.item(pos), ids.item(pos), r))

    def _advance(self, r: int, pos: int) -> None:
        """Run ``r``'s head (just popped) moves to ``pos``; the run is re-entered or dropped."""
        run = self.runs[r]
        ts, ns, ids = run[0], run[1], run[2]
        if pos >= len(ids):
            del self.runs[r]
            return
        run[4] = pos
        heapq.heappush(self.heap, (ts.item(pos), ns.item(pos), ids.item(pos), r))

    def top(self) -> tuple[int, int, int] | None:
        """``(t, n, id)`` of the smallest valid element (stale heads are dropped on the way)."""
        if self._queue:
            self.flush()
        heap, check = self.heap, self.check
        while heap:
            t, n, i, r = heap[0]
            if r < 0:
                if check(i, t, n, -1 - r):
                    return t, n, i
                heapq.heappop(heap)
                continue
            run = self.runs[r]
            ts, ns, ids, gs, pos = run
            if check(i, t, n, gs.item(pos)):
                return t, n, i
            heapq.heappop(heap)
            end = len(ids)
            pos += 1
            while pos < end and not check(ids.item(pos), ts.item(pos), ns.item(pos), gs.item(pos)):
                pos += 1
            self._advance(r, pos)
        return None

    def pop(self) -> tuple[int, int, int, int]:
        """Remove the head element (call after ``top``); ``(t, n, id, g)``."""
        if self._queue:
            self.flush()
        t, n, i, r = heapq.heappop(self.heap)
        if r < 0:
            return t, n, i, -1 - r
        run = self.runs[r]
        g = run[3].item(run[4])
        self._advance(r, run[4] + 1)
        return t, n, i, g

    def run_ahead(self, j: int, bound: tuple[int, int, int] | None) -> bool:
        """True when the head's run has an element ``j`` places after the head that is still
        smaller than ``bound`` (a bulk ``segment`` is worth its numpy calls)."""
        if self._queue:
            self.flush()
        r = self.heap[0][3]
        if r < 0:
            return False
        ts, ns, ids, _, pos = self.runs[r]
        pos += j
        return pos < len(ids) and (bound is None or (ts.item(pos), ns.item(pos), ids.item(pos)) < bound)

    def segment(self, bound: tuple[int, int, int] | None) -> tuple[np.ndarray, ...]:
        """``(ts, ns, ids, gs)`` of the head's run from the head on, as far as its elements are
        smaller than ``bound`` (maybe none); call after ``top``, then ``consume``."""
        if self._queue:
            self.flush()
        t, n, i, r = self.heap[0]
        if r < 0:
            if bound is not None and (t, n, i) >= bound:
                return _EMPTY, _EMPTY, _EMPTY, _EMPTY
            return (np.array([t], dtype=np.int64), np.array([n], dtype=np.int64), np.array([i], dtype=np.int64),
                    np.array([-1 - r], dtype=np.int64))
        ts, ns, ids, gs, pos = self.runs[r]
        end = len(ids) if bound is None else pos + _count_below(ts[pos:], ns[pos:], ids[pos:], bound)
        return ts[pos:end], ns[pos:end], ids[pos:end], gs[pos:end]

    def consume(self, count: int) -> None:
        """Move the head's run ``count`` elements on (elements ``segment`` returned)."""
        if self._queue:
            self.flush()
        if count:
            r = self.heap[0][3]
            heapq.heappop(self.heap)
            if r >= 0:
                self._advance(r, self.runs[r][4] + count)

    def take(self, m: int, bound: tuple[int, int, int] | None) -> np.ndarray:
        """Remove up to ``m`` valid elements from the head's run, in order, all smaller than
        ``bound`` (the next candidate elsewhere); their ids.  Call after ``top``; takes at
        least the head."""
        if self._queue:
            self.flush()
        t, n, i, r = self.heap[0]
        if r < 0:
            self.pop()
            return np.array([i], dtype=np.int64)
        heapq.heappop(self.heap)
        run = self.runs[r]
        ts, ns, ids, gs, pos = run
        end = len(ids)
        if bound is not None:
            end = pos + _count_below(ts[pos:], ns[pos:], ids[pos:], bound)
        seg = slice(pos, max(end, pos + 1))
        idx = np.flatnonzero(self.check_many(ids[seg], ts[seg], ns[seg], gs[seg]))[:m]
        out = ids[seg][idx]
        self._advance(r, pos + int(idx[-1]) + 1 if len(idx) == m else seg.stop)
        return out

    def compact(self) -> None:
        """Drop stale singles and runs with no valid element left; skip to each run's first
        valid element.  One ``check_many`` over all singles and one over every run's rest."""
        if self._queue:
            self.flush()
        singles = [e for e in self.heap if e[3] < 0]
        heap = []
        if singles:
            t, n, i, r = (np.fromiter((e[x] for e in singles), dtype=np.int64, count=len(singles))
                          if x in self.reads else None for x in range(4))
            ok = self.check_many(i, t, n, None if r is None else -1 - r)
            heap = [e for e, v in zip(singles, ok.tolist(), strict=True) if v]
        live = len(heap)
        runs = {}
        rs = [e[3] for e in self.heap if e[3] >= 0]
        if rs:
            rests = [self.runs[r] for r in rs]
            ts, ns, ids, gs = (np.concatenate([run[x][run[4]:] for run in rests]) if x in self.reads else None
                               for x in range(4))  # (what the check does not read: not gathered)
            sizes = np.fromiter((len(run[2]) - run[4] for run in rests), dtype=np.int64, count=len(rests))
            starts = np.cumsum(sizes) - sizes
            valid = np.flatnonzero(self.check_many(ids, ts, ns, gs))
            lo = np.searchsorted(valid, starts)  # per run: its first valid element, how many
            counts = np.diff(np.append(lo, len(valid)))
            firsts = valid[np.minimum(lo, len(valid) - 1)] - starts if len(valid) else lo
            for r, run, c, f in zip(rs, rests, counts.tolist(), firsts.tolist(), strict=True):
                if c:
                    run[4] = pos = run[4] + f
                    runs[r] = run
                    live += c
                    heap.append((run[0].item(pos), run[1].item(pos), run[2].item(pos), r))
        heapq.heapify(heap)
        self.heap, self.runs = heap, runs
        self._pushed, self._base = 0, live


def _in_order(ts: np.ndarray, ns: np.ndarray, ids: np.ndarray) -> bool:
    """Whether ``(ts, ns, ids)`` is sorted (a free's pages, last page first, usually are)."""
    if not (ts[1:] >= ts[:-1]).all():
        return False
    rise_n = ns[1:] > ns[:-1]
    if rise_n.all():
        return True
    return bool(((ts[1:] > ts[:-1]) | rise_n | ((ns[1:] == ns[:-1]) & (ids[1:] >= ids[:-1]))).all())


def _count_below(ts: np.ndarray, ns: np.ndarray, ids: np.ndarray, bound: tuple[int, int, int]) -> int:
    """How many leading elements of the sorted ``(ts, ns, ids)`` are smaller than ``bound``."""
    bt, bn, bi = bound
    lo = int(np.searchsorted(ts, bt, "left"))
    hi = int(np.searchsorted(ts, bt, "right"))
    if lo == hi:
        return lo
    a = lo + int(np.searchsorted(ns[lo:hi], bn, "left"))
    b = lo + int(np.searchsorted(ns[lo:hi], bn, "right"))
    return a + int(np.searchsorted(ids[a:b], bi, "left"))
