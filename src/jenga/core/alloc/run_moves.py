"""The allocator's page moves for a run of pages at once, with numpy over its flat arrays:
USED -> CACHED (a free), CACHED -> USED (a hit), USED -> FREE (a free without caching, or of
unregistered pages), whole fully evictable large pages evicted.
Each does what the per-page loop in :class:`jenga.core.alloc.allocator.LargePageAllocator` does, in one
pass; used for runs longer than ``jenga.core.flat_arrays.BULK``.  Also without numpy: the eviction
of a few whole large pages of one group (one loop).  A part owned by that class (which carves
large pages itself)."""

from __future__ import annotations

import numpy as np

from jenga.core.alloc.page_states import CACHED, FREE, USED
from jenga.core.flat_arrays import as_ids, unique_counts, view


class RunMoves:
    """Bulk page moves (module doc).  Holds no state of its own: it is handed the allocator's
    flat arrays and per-group counters (``small_per_large``, ``state``, ``group_of``, ``tag_of``, ``n_used``,
    ``n_cached``, ``used_small``, ``cached_small``, ``owned``), its free pool, free slots and ``E``
    (the allocator's ``FreePool``, ``FreeSlots`` and ``EvictableSet``: its module owns them, so none is imported here)
    at construction and changes them as the per-page moves would.  The caller has checked each
    move's preconditions that are not asserted here (distinct pages, of one group)."""

    __slots__ = ("small_per_large", "state", "group_of", "tag_of", "n_used", "n_cached", "used_small", "cached_small", "owned",
                 "pool", "slots", "e")

    def __init__(self, k: list[int], state: list[bytearray], group_of: list[int], tag_of: list, n_used, n_cached,
                 used_small: list[int], cached_small: list[int], owned: list[int], pool,
                 slots, e):
        self.small_per_large, self.state, self.group_of, self.tag_of = k, state, group_of, tag_of
        self.n_used, self.n_cached, self.used_small, self.cached_small = n_used, n_cached, used_small, cached_small
        self.owned, self.pool, self.slots, self.e = owned, pool, slots, e

    def to_cached(self, group: int, pages: np.ndarray, larges: np.ndarray | None = None,
                  counts: np.ndarray | None = None) -> None:
        """USED -> CACHED for distinct ``pages`` (``larges``, ``counts``: their large pages
        ascending and pages per large page, when the caller has them)."""
        state, k = view(self.state[group]), self.small_per_large[group]
        assert (state[pages] == USED).all(), f"cache of group {group} pages not all USED"
        state[pages] = CACHED
        if k == 1:  # each page its own large page: one used page becomes one cached page
            larges = pages
            view(self.n_used)[larges] = 0
            view(self.n_cached)[larges] = 1
        else:
            if larges is None:
                larges, counts = unique_counts(pages // k)
            view(self.n_used)[larges] -= counts
            view(self.n_cached)[larges] += counts
        self.used_small[group] -= len(pages)
        self.cached_small[group] += len(pages)
        emptied = larges if k == 1 else larges[view(self.n_used)[larges] == 0]
        if len(emptied):
            self.e.enter_many(group, emptied)

    def release(self, group: int, pages) -> None:
        """USED -> FREE for the distinct ``pages`` of ``group`` (k > 1): the same state as one
        release per page, each large page placed once after all its pages (before that its
        place changes nothing: it still has a USED page, so it is not in E), large pages that
        end all free back to the pool together."""
        k = self.small_per_large[group]
        ids = as_ids(pages)
        state = view(self.state[group])
        assert (state[ids] == USED).all(), f"release of group {group} pages not all USED"
        state[ids] = FREE
        self.used_small[group] -= len(ids)
        ids = ids[np.argsort(ids // k, kind="stable")]
        larges, counts = unique_counts(ids // k)
        n_used = view(self.n_used)
        n_used[larges] -= counts
        ends = np.cumsum(counts).tolist()
        empty = ((n_used[larges] == 0) & (view(self.n_cached)[larges] == 0)).tolist()
        freed = (ids % k).tolist()
        slots, place, group_of, tag_of = self.slots, self.e.place, self.group_of, self.tag_of
        lo, back = 0, []
        for large, hi, whole in zip(larges.tolist(), ends, empty, strict=True):
            new = freed[lo:hi]
            lo = hi
            if whole:  # every slot free: what showing its new slots and settling it leaves
                slots.close(group, large)
                group_of[large] = -1
                tag_of[large] = None
                back.append(large)
                continue
            slots.add_many(group, large, new)
            place(large)
        if back:
            self.owned[group] -= len(back)
            self.pool.push_many(back)

    def release_whole(self, group: int, pages: list[int], bulk: bool) -> None:
        """USED -> FREE for a one-page-per-large-page group: each large page held only by its
        page goes straight back to the pool (no slot to show and hide again); with ``bulk``, state
        and counts with numpy."""
        group_of, tag_of = self.group_of, self.tag_of
        if bulk:
            ids = as_ids(pages)
            state, n_used = view(self.state[group]), view(self.n_used)
            assert (state[ids] == USED).all() and (n_used[ids] == 1).all() and not view(self.n_cached)[ids].any(), \
                f"release of group {group} pages not all USED, each its large page's only one"
            state[ids] = FREE
            n_used[ids] = 0
        else:
            state, n_used, n_cached = self.state[group], self.n_used, self.n_cached
            for page in pages:
                assert state[page] == USED and n_used[page] == 1 and not n_cached[page], \
                    f"release of {group}:{page} in state {state[page]}"
                state[page] = FREE
                n_used[page] = 0
        for page in pages:
            group_of[page] = -1
            tag_of[page] = None
        self.used_small[group] -= len(pages)
        self.owned[group] -= len(pages)
        self.pool.push_many(pages)

    def touch_cached(self, group: int, pages: np.ndarray) -> None:
        """CACHED -> USED for distinct ``pages`` (a prefix hit; the evictor let them go)."""
        state, k = view(self.state[group]), self.small_per_large[group]
        assert (state[pages] == CACHED).all(), f"touch of group {group} pages not all CACHED"
        larges, counts = (pages, 1) if k == 1 else unique_counts(pages // k)
        in_e = view(self.e.in_e)
        leaving = larges[in_e[larges] == 1]
        if len(leaving):
            in_e[leaving] = 0
            self.e.left_many(group, leaving.tolist())
        state[pages] = USED
        view(self.n_cached)[larges] -= counts
        view(self.n_used)[larges] += counts
        self.used_small[group] += len(pages)
        self.cached_small[group] -= len(pages)

    def evict_whole(self, group: int, larges) -> None:
        """Every CACHED page of the distinct fully evictable ``larges`` (all of ``group``) ->
        FREE: an int array with numpy, a list in one loop; back to the pool in one ``push_many``."""
        if type(larges) is not np.ndarray:
            self._evict_whole_loop(group, larges)
            return
        assert (view(self.e.in_e)[larges] == 1).all() and not view(self.n_used)[larges].any(), "not fully evictable"
        m, k = len(larges), self.small_per_large[group]
        ids = larges.tolist()
        self.e.evicted_many(group, larges)
        if k == 1:  # a cached page fills its large page: no hidden free slot
            view(self.state[group])[larges] = 0  # FREE
        else:
            self.slots.forget_hidden(group, ids, k * m - int(view(self.n_cached)[larges].sum()))
            view(self.state[group])[(larges[:, None] * k + np.arange(k)).ravel()] = 0  # FREE
        view(self.n_cached)[larges] = 0
        self.owned[group] -= m
        group_of, tag_of = self.group_of, self.tag_of
        for large in ids:
            group_of[large] = -1
            tag_of[large] = None
        self.pool.push_many(ids)

    def _evict_whole_loop(self, group: int, larges: list[int]) -> None:
        """``evict_whole`` of a list, in one loop."""
        k, state, in_e, n_used, n_cached = self.small_per_large[group], self.state[group], self.e.in_e, self.n_used, self.n_cached
        group_of, tag_of = self.group_of, self.tag_of
        m = len(larges)
        n_free = 0
        free = bytes(k)
        for large in larges:
            assert in_e[large] and n_used[large] == 0 and group_of[large] == group, \
                f"large {large} is not fully evictable"
            if k == 1:  # a cached page fills its large page: no hidden free slot
                state[large] = FREE
            else:
                n_free += k - n_cached[large]
                state[large * k:(large + 1) * k] = free  # all FREE
            n_cached[large] = 0
            group_of[large] = -1
            tag_of[large] = None
        self.e.evicted_many(group, larges)
        if k > 1:
            self.slots.forget_hidden(group, larges, n_free)
        self.pool.push_many(larges)
        self.owned[group] -= m
