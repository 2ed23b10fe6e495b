"""The set ``E`` of fully evictable large pages (no USED page, at least one CACHED page).

Their free slots are hidden from steps 1 and 4 of the allocator, so the feasibility check can
count each of them as one whole large page; the evictor is told of every entry and exit
(its large-page order).  A mixin of :class:`jenga.core.alloc.allocator.LargePageAllocator`.
"""

from __future__ import annotations

import numpy as np

from jenga.core.flat_arrays import view


class EvictableSet:
    """``E`` membership and the counters it moves (see the module doc)."""

    def _settle(self, large: int) -> None:
        """Return an all-free large page to the pool; keep ``E`` membership exact."""
        group = self.group_of[large]
        if self.n_used[large] == 0 and self.n_cached[large] == 0:
            self._leave_e(large)
            slots = self._slots[group].get(large)
            assert slots is not None and len(slots) == self.k[group], f"large {large} empty but slots {slots}"
            self._hide_slots(group, large)
            self.free_small[group] -= self.k[group]
            self.group_of[large] = -1
            self.owned[group] -= 1
            self.tag_of[large] = None
            self._free_large.push(large)
        elif self.n_used[large] == 0:
            self._enter_e(large)
        else:
            self._leave_e(large)

    def _enter_e(self, large: int) -> None:
        if self.in_e[large]:
            return
        group = self.group_of[large]
        self.in_e[large] = 1
        self.num_e += 1
        self.e_count[group] += 1
        self.cached_small[group] -= self.n_cached[large]
        slots = self._slots[group].get(large)
        if slots is not None:
            self._hide_slots(group, large)
            self._hidden[large] = slots
            self.free_small[group] -= len(slots)
            self.hidden_free[group] += len(slots)
        if self.evictor is not None:
            self.evictor.on_evictable(large)

    def _enter_e_many(self, group: int, larges: list[int]) -> None:
        """``_enter_e`` for large pages of ``group`` that have no USED page left."""
        in_e, n_cached, slots_of, hidden = self.in_e, self.n_cached, self._slots[group], self._hidden
        if self.k[group] == 1:  # one page each, just cached: no free slot, not in E yet
            if type(larges) is np.ndarray:
                flags = view(self.in_e)
                assert not flags[larges].any(), "large pages entering E twice"
                flags[larges] = 1
            else:
                for large in larges:
                    assert not in_e[large] and n_cached[large] == 1, f"large {large} entering E twice"
                    in_e[large] = 1
            self.num_e += len(larges)
            self.e_count[group] += len(larges)
            self.cached_small[group] -= len(larges)
            if self.evictor is not None:
                self.evictor.on_evictable_many(group, larges)
            return
        entered = []
        cached = hidden_slots = 0
        if type(larges) is np.ndarray:  # a long run (``jenga.core.alloc.run_moves``): flags and counts in numpy
            flags = view(self.in_e)
            entered = larges[flags[larges] == 0]
            flags[entered] = 1
            cached = int(view(self.n_cached)[entered].sum())
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
        for large in partly_free:
            slots = self._hide_slots(group, large)
            hidden[large] = slots
            hidden_slots += len(slots)
        self.num_e += len(entered)
        self.e_count[group] += len(entered)
        self.cached_small[group] -= cached
        self.free_small[group] -= hidden_slots
        self.hidden_free[group] += hidden_slots
        if self.evictor is not None and len(entered):
            self.evictor.on_evictable_many(group, entered)

    def _leave_e(self, large: int) -> None:
        if not self.in_e[large]:
            return
        group = self.group_of[large]
        self.in_e[large] = 0
        self.num_e -= 1
        self.e_count[group] -= 1
        self.cached_small[group] += self.n_cached[large]
        slots = self._hidden.pop(large, None)
        if slots is not None:
            self._show_slots(group, large, slots)
            self.free_small[group] += len(slots)
            self.hidden_free[group] -= len(slots)
        if self.evictor is not None:
            self.evictor.on_unevictable(large)

    def _left_e(self, group: int, larges: list[int]) -> None:
        """``_leave_e`` for large pages of ``group`` whose E flag was just cleared."""
        n_cached, hidden, show = self.n_cached, self._hidden, self._show_slots
        cached = shown = 0
        for large in larges:
            cached += n_cached[large]
            slots = hidden.pop(large, None)
            if slots is not None:
                show(group, large, slots)
                shown += len(slots)
        self.num_e -= len(larges)
        self.e_count[group] -= len(larges)
        self.cached_small[group] += cached
        self.free_small[group] += shown
        self.hidden_free[group] -= shown
        if self.evictor is not None:
            self.evictor.on_unevictable_many(group, larges)
