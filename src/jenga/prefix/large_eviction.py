"""Evicting many whole large pages at once (an allocation that needs ``m`` fresh large pages)
in exactly the order of ``m`` calls of ``PrefixEvictor.evict_large``.

Where a group's head is a run of pages released together (``RunHeap``), a stretch of it that
comes before everything else is evicted in bulk, merged across groups with numpy; a single
element at the head (a page released alone: a decode step's page leaving the window) is
evicted one at a time, looking again only at the group that changed.  A mixin of
:class:`jenga.prefix.evictor.PrefixEvictor`.
"""

from __future__ import annotations

import numpy as np

from jenga.eviction_source import CACHED
from jenga.flat_arrays import view

BULK_RUN = 16  # a run's pages go to bulk eviction when at least this many come next in the order


class LargeEviction:
    """``evict_large_many`` (module doc)."""

    def evict_large_many(self, m: int) -> list[int]:
        """``evict_large()`` up to ``m`` times; the freed large pages in eviction order.  Runs
        are merged a stretch at a time: what every group's head run holds below the next
        entry of any group's heap comes before everything else."""
        out: list[int] = []
        heaps = self._large_heaps
        bulk = self.index.events is None  # (bulk would reorder KV events across groups)
        while len(out) < m:
            tops = [(e, g) for g in range(len(heaps)) if heaps[g] and (e := heaps[g].top()) is not None]
            if not tops:
                break
            if not bulk or m - len(out) < BULK_RUN or heaps[min(tops)[1]].heap[0][3] < 0:
                self._evict_each(m, out, tops, bulk)  # the next is a single element: one at a time
                continue
            live = [g for _, g in tops]
            nexts = [min(e[:3] for e in heaps[g].heap[1:3]) for g in live if len(heaps[g]) > 1]
            cutoff = min(nexts) if nexts else None
            if not bulk or m - len(out) < BULK_RUN or not any(heaps[g].run_ahead(BULK_RUN, cutoff) for g in live):
                out.append(self._evict_top(min(tops)[1]))  # a short stretch: one at a time
                continue
            out.extend(self._evict_merged(m - len(out), live, [heaps[g].segment(cutoff) for g in live]))
        return out

    def _evict_each(self, m: int, out: list[int], tops: list, bulk: bool) -> None:
        """``evict_large()`` into ``out`` while the smallest head (``tops``: each group's, as
        ``(element, group)``) is a single element (any head without ``bulk``): only the
        evicting group's head changes, so only it is looked at again.  A group's consecutive
        picks are evicted together (``_evict_larges``): popping a large page's element leaves
        every other element's validity as it was (each large page has one current version)."""
        heaps = self._large_heaps
        picked: list[int] = []
        last = -1
        while len(out) + len(picked) < m and tops:
            e, g = min(tops)
            heap = heaps[g]
            if bulk and m - len(out) - len(picked) >= BULK_RUN and heap.heap[0][3] >= 0:
                break  # a run's head: the caller may take a stretch of it in bulk
            if g != last:
                if picked:
                    self._evict_larges(last, picked)
                    out += picked
                    picked = []
                last = g
            picked.append(heap.pop()[2])
            top = heap.top()
            tops = [x for x in tops if x[1] != g]
            if top is not None:
                tops.append((top, g))
        if picked:
            self._evict_larges(last, picked)
            out += picked

    def _evict_larges(self, g: int, larges: list[int]) -> None:
        """Every cached page of each of the fully evictable ``larges`` (of group ``g``, popped
        from its order) leaves, dropped in one call; they are free."""
        alloc = self.alloc
        k = alloc.k[g]
        if k == 1:
            pages = larges
        else:
            st = alloc.state[g]
            pages = [p for large in larges for p in range(large * k, (large + 1) * k) if st[p] == CACHED]
        self._drop_pages(g, pages)
        alloc.evict_whole_each(g, larges)

    def _evict_merged(self, m: int, live: list[int], segs: list[tuple[np.ndarray, ...]]) -> list[int]:
        """Evict the first ``m`` valid elements of the merged ``segs`` (group ``live[j]``'s head
        run stretch is ``segs[j]``); the large page ids in eviction order."""
        ts, ns, ids = (np.concatenate([seg[x] for seg in segs]) for x in range(3))
        valid = np.concatenate([self._large_check_many(seg[2], seg[0], seg[1], seg[3]) for seg in segs])
        owner = np.repeat(np.arange(len(live)), [len(seg[2]) for seg in segs])
        order = np.lexsort((ids, ns, ts))
        taken = np.flatnonzero(valid[order])[:m]
        stop = int(taken[-1]) + 1 if len(taken) == m else len(order)
        counts = np.bincount(owner[order[:stop]], minlength=len(live))
        for j, g in enumerate(live):
            self._large_heaps[g].consume(int(counts[j]))
        picked = order[taken]
        larges, owners = ids[picked], owner[picked]
        alloc = self.alloc
        for j, g in enumerate(live):
            mine = larges[owners == j]
            if not len(mine):
                continue
            k = alloc.k[g]
            if k == 1:
                pages = mine
            else:  # the cached pages of each large page, in order
                block = (mine[:, None] * k + np.arange(k)).ravel()
                pages = block[view(alloc.state[g])[block] == CACHED]
            self._drop_pages(g, pages.tolist())
            alloc.evict_whole_many(g, mine)
        return larges.tolist()
