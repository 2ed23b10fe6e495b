"""Free small-page slots of carved large pages, per group: visible ones and hidden ones.

A carved large page with free slots keeps them as a heap (lowest slot first).  Outside ``E``
they are *visible*: found by the request that carved the large page (its tag, step 1 of the
allocator) or by anyone through a lazy heap of large ids (step 4, lowest large page first).
Inside ``E`` (fully evictable) they are *hidden*, so the feasibility check counts the large page
as one whole page.  A part owned by :class:`jenga.core.alloc.allocator.LargePageAllocator`.
"""

from __future__ import annotations

import heapq


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
