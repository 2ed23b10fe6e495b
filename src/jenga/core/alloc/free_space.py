"""Where an allocation finds room: free large pages, free slots of carved ones, and ``E``.

``FreePool``: the free large pages, lowest id first.  ``FreeSlots``: the free small-page slots of
carved large pages, per group, visible or hidden.  ``EvictableSet``: the set ``E`` of fully evictable
large pages (no USED page, at least one CACHED page), whose free slots are hidden so that the
feasibility check counts each as one whole large page.  Parts owned by
:class:`jenga.core.alloc.allocator.LargePageAllocator`, each handed the arrays it moves.

*The pool.* A range of never-taken ids plus a heap of runs.

At start every large page is free and most allocations take pages no one has used yet, so
the pool keeps those as one range ``[lo, hi)``.  Pages given back are kept as runs of
consecutive ids, ``(start, end)`` in a heap: a freed request's large pages come back mostly
consecutive (they were carved as ranges), so taking them again pops a few runs, not one id
each.  The runs are disjoint and every one lies outside the range (below ``lo`` or at or above
``hi``: an id inside is free already), so the run with the smallest start holds the lowest
ids, and ``take(m)`` consumes runs below ``lo``, then the range, then runs above ``hi``: the
same ids in the same order as ``m`` pops of one heap of all free pages.

*The slots.* A carved large page with free slots keeps them as a heap (lowest slot first).
Outside ``E`` they are *visible*: found by the request that carved the large page (its tag, step 1
of the allocator) or by anyone through a lazy heap of large ids (step 4, lowest large page first).
Inside ``E`` they are *hidden*.

*E.* The evictor is told of every entry and exit (its large-page order).
"""

from __future__ import annotations

import heapq

import numpy as np

from jenga.core.flat_arrays import view


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


class FreeSlots:
    """Visible and hidden free slots with their counters.

    Public state (read by the allocator's parts and checks, written only here): ``visible[g]``
    maps a large page to its heap of free slots, ``hidden`` the same for large pages in ``E``;
    ``free_small[g]`` counts visible slots, ``hidden_free[g]`` hidden ones.  ``tag_of`` is the
    allocator's per-large-page tag array (read: a large page is found under its tag).
    """

    __slots__ = ("visible", "hidden", "free_small", "hidden_free", "tag_of", "_tagged", "_partial")

    def __init__(self, num_groups: int, tag_of: list):
        self.visible: list[dict[int, list[int]]] = [{} for _ in range(num_groups)]
        self.hidden: dict[int, list[int]] = {}
        self.free_small = [0] * num_groups
        self.hidden_free = [0] * num_groups
        self.tag_of = tag_of
        self._tagged: list[dict[object, set[int]]] = [{} for _ in range(num_groups)]
        self._partial: list[list[int]] = [[] for _ in range(num_groups)]  # lazy heaps of large ids

    # ------------------------------------------------------------------ queries
    def tagged(self, group: int, tag: object) -> set[int] | None:
        """The large pages of ``group`` carved for ``tag`` that have visible free slots."""
        return self._tagged[group].get(tag)

    def lowest_partial(self, group: int) -> int | None:
        """The lowest large page of ``group`` with visible free slots (drops stale heap entries)."""
        heap, slots = self._partial[group], self.visible[group]
        while heap:
            large = heap[0]
            if large in slots:
                return large
            heapq.heappop(heap)
        return None

    def snapshot(self) -> dict:
        """Plain copies of every structure (tests compare two allocators with it)."""
        return dict(slots=[{k: sorted(v) for k, v in s.items()} for s in self.visible],
                    hidden={k: sorted(v) for k, v in self.hidden.items()},
                    tag_larges=[{k: set(v) for k, v in t.items()} for t in self._tagged],
                    partial=[self.lowest_partial(g) for g in range(len(self.visible))])

    # ------------------------------------------------------------------ moves
    def open(self, group: int, large: int, tag: object, k: int) -> None:
        """``large`` was just carved for ``group`` and ``tag``: all its ``k`` slots are free."""
        self.visible[group][large] = list(range(k))
        self._tagged[group].setdefault(tag, set()).add(large)
        heapq.heappush(self._partial[group], large)
        self.free_small[group] += k

    def take(self, group: int, large: int) -> int:
        """Remove and return the lowest visible free slot of ``large``."""
        slots = self.visible[group][large]
        slot = heapq.heappop(slots)
        if not slots:
            self.drop(group, large)
        self.free_small[group] -= 1
        return slot

    def take_many(self, group: int, large: int, m: int) -> list[int]:
        """Remove and return up to ``m`` visible free slots of ``large``, lowest first."""
        slots = self.visible[group][large]
        if m >= len(slots):
            taken = sorted(slots)
            slots.clear()
        else:
            taken = [heapq.heappop(slots) for _ in range(m)]
        if not slots:
            self.drop(group, large)
        self.free_small[group] -= len(taken)
        return taken

    def add(self, group: int, large: int, slot: int) -> None:
        """``slot`` of ``large`` (outside ``E``) is free again."""
        slots = self.visible[group].get(large)
        if slots is None:
            self.show(group, large, [slot])
        else:
            heapq.heappush(slots, slot)
        self.free_small[group] += 1

    def add_many(self, group: int, large: int, new: list[int]) -> None:
        """The distinct ``new`` slots of ``large`` (outside ``E``) are free again."""
        self.free_small[group] += len(new)
        slots = self.visible[group].get(large)
        if slots is None:
            heapq.heapify(new)
            self.show(group, large, new)
        else:
            slots.extend(new)
            heapq.heapify(slots)

    def close(self, group: int, large: int) -> int:
        """``large`` leaves ``group`` (back to the pool): forget its visible slots; how many."""
        slots = self.visible[group].get(large)
        if slots is None:
            return 0
        self.drop(group, large)
        self.free_small[group] -= len(slots)
        return len(slots)

    def hide(self, group: int, large: int) -> None:
        """``large`` entered ``E``: its visible free slots (if any) become hidden."""
        slots = self.visible[group].get(large)
        if slots is not None:
            self.drop(group, large)
            self.hidden[large] = slots
            self.free_small[group] -= len(slots)
            self.hidden_free[group] += len(slots)

    def hide_many(self, group: int, larges) -> None:
        """``hide`` each of ``larges`` (all of which have visible free slots), in order."""
        hidden, n = self.hidden, 0
        for large in larges:
            slots = self.drop(group, large)
            hidden[large] = slots
            n += len(slots)
        self.free_small[group] -= n
        self.hidden_free[group] += n

    def unhide(self, group: int, large: int) -> int:
        """``large`` left ``E``: its hidden free slots (if any) become visible; how many."""
        slots = self.hidden.pop(large, None)
        if slots is None:
            return 0
        self.show(group, large, slots)
        self.free_small[group] += len(slots)
        self.hidden_free[group] -= len(slots)
        return len(slots)

    def unhide_many(self, group: int, larges: list[int]) -> None:
        """``unhide`` each of ``larges`` (of ``group``), in order."""
        hidden, show, n = self.hidden, self.show, 0
        for large in larges:
            slots = hidden.pop(large, None)
            if slots is not None:
                show(group, large, slots)
                n += len(slots)
        self.free_small[group] += n
        self.hidden_free[group] -= n

    def forget_hidden(self, group: int, larges, n_free: int) -> None:
        """Fully evictable ``larges`` of ``group`` were evicted whole: drop their hidden slots,
        ``n_free`` of them in all."""
        hidden = self.hidden
        for large in larges:
            hidden.pop(large, None)
        self.hidden_free[group] -= n_free

    def drop(self, group: int, large: int) -> list[int]:
        """Remove ``large`` from the visible structures (no counter changes); its slot heap."""
        slots = self.visible[group].pop(large)
        tag = self.tag_of[large]
        tagged = self._tagged[group].get(tag)
        if tagged is not None:
            tagged.discard(large)
            if not tagged:
                del self._tagged[group][tag]
        return slots

    def show(self, group: int, large: int, slots: list[int]) -> None:
        """Make the heap ``slots`` of ``large`` visible (no counter changes)."""
        self.visible[group][large] = slots
        self._tagged[group].setdefault(self.tag_of[large], set()).add(large)
        heapq.heappush(self._partial[group], large)


class EvictableSet:
    """``E`` membership and the counters it moves.

    Owns ``count`` (the size of ``E``) and ``e_count[g]`` (per group); ``evictor`` (the allocator's,
    handed over at construction) hears ``on_evictable`` / ``on_unevictable``.  ``in_e`` (one flag per large page) is a
    flat array of the allocator's, like ``small_per_large``, ``group_of``, ``n_used`` and ``n_cached``, handed
    over at construction: the allocator's per-page loops may flip flags themselves and then report
    the large pages that ``entered_whole`` or ``left_many``.  Moves the allocator's
    ``cached_small`` counters (pages cached outside ``E``); ``place`` also gives an all-free large
    page back (``tag_of``, ``owned``, ``pool``).
    """

    __slots__ = ("in_e", "count", "e_count", "evictor", "slots", "small_per_large", "group_of", "tag_of", "n_used", "n_cached",
                 "cached_small", "owned", "pool")

    def __init__(self, in_e: bytearray, k: list[int], group_of: list[int], tag_of: list, n_used, n_cached,
                 cached_small: list[int], owned: list[int], pool: FreePool, slots: FreeSlots, evictor):
        self.in_e = in_e
        self.count = 0
        self.e_count = [0] * len(k)
        self.evictor = evictor  # the allocator's (``EvictionSource``), or None
        self.slots, self.small_per_large, self.group_of, self.tag_of = slots, k, group_of, tag_of
        self.n_used, self.n_cached, self.cached_small, self.owned, self.pool = n_used, n_cached, cached_small, owned, pool

    def place(self, large: int) -> None:
        """Put ``large`` where its counts say: back to the pool when all free, in ``E`` when it holds
        cached pages but no used one, out of ``E`` else."""
        group = self.group_of[large]
        if self.n_used[large] == 0 and self.n_cached[large] == 0:
            self.leave(large)
            closed = self.slots.close(group, large)
            assert closed == self.small_per_large[group], f"large {large} empty but {closed} free slots"
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
        if self.small_per_large[group] == 1:  # one page each, just cached: no free slot, not in E yet
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
