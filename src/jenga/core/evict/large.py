"""Evicting many whole large pages at once (an allocation that needs ``m`` fresh large pages)
in exactly the order of ``m`` calls of ``LargePageAllocator.evict_large``.

Where a group's head is a run of pages released together (``RunHeap``), a stretch of it that
comes before everything else is evicted in bulk, merged across groups with numpy; otherwise
(a single element at the head, e.g. a page released alone, or a short stretch of a run) the
smallest head is popped one at a time, looking again only at the group that changed, and each
group's pops are evicted together at the end.

``LargeEviction`` is a part the evictor (:class:`jenga.core.evict.evictor.PrefixEvictor`) owns: it
holds the per-group orders of fully evictable large pages (``heaps``, one ``RunHeap`` each) and
each large page's version (``ver``: an entry is valid while its large page is in ``E`` at the
version it entered with); the evictor pushes entries and bumps versions.  It picks; the evictor
forgets and the allocator frees: ``pick_one`` returns a popped large page, ``pick_many`` yields the
picks in batches of one group (a list, or an int array from a merge), each evicted before the next
is picked, so every pick sees the state the evictions before it left.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from jenga.core.alloc.page_states import PageViews
from jenga.core.evict.run_heap import RunHeap
from jenga.core.flat_arrays import view, zeros
from jenga.core.prefix.index import PrefixIndex

BULK_RUN = 16  # a run's pages go to bulk eviction when at least this many come next in the order


class LargeEviction:
    """The orders of fully evictable large pages and their eviction (module doc)."""

    def __init__(self, pages: PageViews, index: PrefixIndex):
        self.index = index  # its KV events, if on, keep each group's picks apart
        self.pages = pages  # read in place
        # per group: fully evictable large pages by key; an element is valid while the large
        # page's version is the one it entered E with (ties go to the lower large page id)
        self.ver = zeros(pages.num_large)
        self.heaps = [RunHeap(self.valid, self.valid_many, reads="ig") for _ in pages.small_per_large]

    def valid(self, large, t, n, v) -> bool:
        """Whether an entry of ``large`` at version ``v`` is current."""
        return self.ver[large] == v and self.pages.in_e[large] == 1

    def valid_many(self, larges, ts, ns, vs) -> np.ndarray:
        """``valid`` for arrays of entries."""
        return (view(self.ver)[larges] == vs) & (view(self.pages.in_e)[larges] == 1)

    def pick_one(self, group: int | None = None) -> tuple[int, int] | None:
        """For ``PrefixEvictor.pick_large``: the large page with the smallest key (of ``group``
        only, when given), popped, with its group; ``None`` when there is none."""
        heaps = self.heaps
        if group is None:
            tops = [(e, g) for g in range(len(heaps)) if heaps[g] and (e := heaps[g].top()) is not None]
            if not tops:
                return None
            _, g = min(tops)
        else:
            if heaps[group].top() is None:
                return None
            g = group
        return g, heaps[g].pop()[2]

    def pick_many(self, m: int, out: list[int]) -> Iterator[tuple[int, list[int] | np.ndarray]]:
        """For ``pick_large()`` up to ``m`` times: yields ``(group, larges)`` batches to evict (each
        before the next is picked); ``out`` gets the large pages in eviction order.

        One element at a time: the smallest of the groups' heads is popped and only its group
        is looked at again.  Where the head is a run's element and a stretch of at least
        ``BULK_RUN`` of it comes before everything else, the stretches of every group's head
        run below the next entry of any group's heap are merged with numpy instead (a run
        whose stretch was too short is looked at again after ``BULK_RUN`` more pops).  A popped
        large page is evicted later, with its group's other picks in one batch: popping a valid
        element leaves every other element's validity as it was (each large page has one current
        version, and groups own distinct large pages), so the picks are the same.  With KV events (``index.events``) nothing is
        merged and a group's picks are evicted when the next pick is another group's, so the
        events keep the eviction order."""
        heaps = self.heaps
        events = self.index.events is not None
        picks: list[list[int]] = [[] for _ in heaps]  # per group: popped, not evicted yet
        tops = [(e, g) for g in range(len(heaps)) if heaps[g] and (e := heaps[g].top()) is not None]
        skip, wait = None, 0  # (group, run) whose stretch was too short for a merge; pops until a new look
        last = -1
        while len(out) < m and tops:
            if len(tops) == 2:  # (two groups: one comparison)
                j = 0 if tops[0] < tops[1] else 1
            else:
                j = 0 if len(tops) == 1 else min(range(len(tops)), key=tops.__getitem__)
            g = tops[j][1]
            heap = heaps[g]
            r = heap.heap[0][3]
            if r >= 0 and not events and m - len(out) >= BULK_RUN and (g, r) != skip:
                live = [h for _, h in tops]
                nexts = [min(e[:3] for e in heaps[h].heap[1:3]) for h in live if len(heaps[h]) > 1]
                cutoff = min(nexts) if nexts else None
                if any(heaps[h].run_ahead(BULK_RUN, cutoff) for h in live):
                    yield from self._flush(picks)
                    yield from self._pick_merged(m - len(out), live, [heaps[h].segment(cutoff) for h in live], out)
                    tops = [(e, h) for h in range(len(heaps)) if heaps[h] and (e := heaps[h].top()) is not None]
                    continue
                skip, wait = (g, r), BULK_RUN
            if events and g != last:
                yield from self._flush(picks)
                last = g
            large = heap.pop()[2]
            wait -= 1
            if not wait:
                skip = None
            out.append(large)
            picks[g].append(large)
            top = heap.top()
            if top is None:
                del tops[j]
            else:
                tops[j] = (top, g)
        yield from self._flush(picks)

    @staticmethod
    def _flush(picks: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        """Each group's popped large pages (``picks[g]``, in pick order) as a batch; then cleared."""
        for g, larges in enumerate(picks):
            if larges:
                yield g, larges
                picks[g] = []

    def _pick_merged(self, m: int, live: list[int], segs: list[tuple[np.ndarray, ...]],
                     out: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        """The first ``m`` valid elements of the merged ``segs`` (group ``live[j]``'s head run
        stretch is ``segs[j]``), one batch per group; ``out`` gets them in eviction order."""
        ts, ns, ids = (np.concatenate([seg[x] for seg in segs]) for x in range(3))
        valid = np.concatenate([self.valid_many(seg[2], seg[0], seg[1], seg[3]) for seg in segs])
        owner = np.repeat(np.arange(len(live)), [len(seg[2]) for seg in segs])
        order = np.lexsort((ids, ns, ts))
        taken = np.flatnonzero(valid[order])[:m]
        stop = int(taken[-1]) + 1 if len(taken) == m else len(order)
        counts = np.bincount(owner[order[:stop]], minlength=len(live))
        for j, g in enumerate(live):
            self.heaps[g].consume(int(counts[j]))
        picked = order[taken]
        larges, owners = ids[picked], owner[picked]
        for j, g in enumerate(live):
            mine = larges[owners == j]
            if len(mine):
                yield g, mine
        out.extend(larges.tolist())
