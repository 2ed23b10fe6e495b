"""The set ``E`` of fully evictable large pages (no USED page, at least one CACHED page).

Their free slots are hidden from steps 1 and 4 of the allocator (:class:`FreeSlots`), so the
feasibility check can count each of them as one whole large page; the evictor is told of every
entry and exit (its large-page order).  A part owned by
:class:`jenga.core.alloc.allocator.LargePageAllocator`.
"""

from __future__ import annotations

import numpy as np

from jenga.core.alloc.free_pool import FreePool
from jenga.core.alloc.free_slots import FreeSlots
from jenga.core.flat_arrays import view


class EvictableSet:
    """``E`` membership and the counters it moves.

    Owns ``count`` (the size of ``E``) and ``e_count[g]`` (per group); ``evictor`` (set by the
    allocator) hears ``on_evictable`` / ``on_unevictable``.  ``in_e`` (one flag per large page) is a
    flat array of the allocator's, like ``k``, ``group_of``, ``n_used`` and ``n_cached``, handed
    over at construction: the allocator's per-page loops may flip flags themselves and then report
    the large pages that ``entered_whole`` or ``left_many``.  Moves the allocator's
    ``cached_small`` counters (pages cached outside ``E``); ``settle`` also gives an all-free large
    page back (``tag_of``, ``owned``, ``pool``).
    """

    __slots__ = ("in_e", "count", "e_count", "evictor", "slots", "k", "group_of", "tag_of", "n_used", "n_cached",
                 "cached_small", "owned", "pool")

    def __init__(self, in_e: bytearray, k: list[int], group_of: list[int], tag_of: list, n_used, n_cached,
                 cached_small: list[int], owned: list[int], pool: FreePool, slots: FreeSlots):
        self.in_e = in_e
        self.count = 0
        self.e_count = [0] * len(k)
        self.evictor = None
        self.slots, self.k, self.group_of, self.tag_of = slots, k, group_of, tag_of
        self.n_used, self.n_cached, self.cached_small, self.owned, self.pool = n_used, n_cached, cached_small, owned, pool

    def settle(self, large: int) -> None:
        """Return an all-free large page to the pool; keep ``E`` membership exact."""
        group = self.group_of[large]
        if self.n_used[large] == 0 and self.n_cached[large] == 0:
            self.leave(large)
            closed = self.slots.close(group, large)
            assert closed == self.k[group], f"large {large} empty but {closed} free slots"
            self.group_of[large] = -1
            self.owned[group] -= 1
            self.tag_of[large] = None
            self.pool.push(large)
        elif self.n_used[large] == 0:
            self.enter(large)
        else:
            self.leave(large)

    def enter(self, large: int) -> None:
        """``large`` has no USED page left (and a CACHED one): it joins ``E`` (if not in it)."""
        if self.in_e[large]:
            return
        group = self.group_of[large]
        self.in_e[large] = 1
        self.count += 1
        self.e_count[group] += 1
        self.cached_small[group] -= self.n_cached[large]
        self.slots.hide(group, large)
        if self.evictor is not None:
            self.evictor.on_evictable(large)

    def enter_many(self, group: int, larges) -> None:
        """``enter`` for large pages of ``group`` that have no USED page left (a list, or an int
        array from a long run: flags and counts in numpy)."""
        in_e, n_cached, slots_of = self.in_e, self.n_cached, self.slots.visible[group]
        if self.k[group] == 1:  # one page each, just cached: no free slot, not in E yet
            if type(larges) is np.ndarray:
                flags = view(in_e)
                assert not flags[larges].any(), "large pages entering E twice"
                flags[larges] = 1
            else:
                for large in larges:
                    assert not in_e[large] and n_cached[large] == 1, f"large {large} entering E twice"
                    in_e[large] = 1
            self.count += len(larges)
            self.e_count[group] += len(larges)
            self.cached_small[group] -= len(larges)
            if self.evictor is not None:
                self.evictor.on_evictable_many(group, larges)
            return
        entered = []
        cached = 0
        if type(larges) is np.ndarray:
            flags = view(in_e)
            entered = larges[flags[larges] == 0]
            flags[entered] = 1
            cached = int(view(n_cached)[entered].sum())
            partly_free = []
            if slots_of:  # the entering large pages with free slots, in order (a large page
                # with visible free slots was not in E: one flagged now has just entered)
                free = np.fromiter(slots_of, dtype=np.int64, count=len(slots_of))
                partly_free = np.sort(free[flags[free] == 1]).tolist()
        else:
            for large in larges:
                if in_e[large]:
                    continue
                in_e[large] = 1
                entered.append(large)
                cached += n_cached[large]
            partly_free = [large for large in entered if large in slots_of]
        if partly_free:
            self.slots.hide_many(group, partly_free)
        self.count += len(entered)
        self.e_count[group] += len(entered)
        self.cached_small[group] -= cached
        if self.evictor is not None and len(entered):
            self.evictor.on_evictable_many(group, entered)

    def leave(self, large: int) -> None:
        """``large`` has a USED page again, or none cached: it leaves ``E`` (if in it)."""
        if not self.in_e[large]:
            return
        group = self.group_of[large]
        self.in_e[large] = 0
        self.count -= 1
        self.e_count[group] -= 1
        self.cached_small[group] += self.n_cached[large]
        self.slots.unhide(group, large)
        if self.evictor is not None:
            self.evictor.on_unevictable(large)

    def entered_whole(self, group: int, larges: list[int]) -> None:
        """Large pages of a one-page-per-large-page ``group`` whose page was just cached entered
        ``E``: their flags are set already (no free slot to hide); count them, tell the evictor."""
        self.count += len(larges)
        self.e_count[group] += len(larges)
        self.cached_small[group] -= len(larges)
        if self.evictor is not None:
            self.evictor.on_evictable_many(group, larges)

    def left_many(self, group: int, leaving: list[int]) -> None:
        """``leave`` for the distinct large pages of ``group`` whose ``E`` flag was just cleared."""
        n_cached = self.n_cached
        cached = 0
        for large in leaving:
            cached += n_cached[large]
        self.slots.unhide_many(group, leaving)
        self.count -= len(leaving)
        self.e_count[group] -= len(leaving)
        self.cached_small[group] += cached
        if self.evictor is not None:
            self.evictor.on_unevictable_many(group, leaving)

    def evicted_many(self, group: int, larges) -> None:
        """Large pages of ``group``, all in ``E``, were evicted whole (the evictor dropped them
        already): clear their flags (an int array with numpy, or a list) without telling it."""
        if type(larges) is np.ndarray:
            view(self.in_e)[larges] = 0
        else:
            in_e = self.in_e
            for large in larges:
                in_e[large] = 0
        self.count -= len(larges)
        self.e_count[group] -= len(larges)
