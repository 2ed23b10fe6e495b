"""Two-level allocator: LCM large pages carved into per-group small pages.

Knows pages and owners only: nothing about tokens, hashes or layers.

Large page ``L`` belongs to at most one group at a time; while it does, it is cut into
``k_g = S / P_g`` small pages.  Small page ``s`` of group ``g`` is slot ``s % k_g`` of
large page ``s // k_g``.  Each small page is FREE, USED (held by at least one live
request) or CACHED (evictable; the evictor owns its key).  A large page whose small
pages are all FREE goes straight back to the shared pool, so memory moves between
groups while serving.

Large pages with no USED page but at least one CACHED page are *fully evictable* (the
set ``E``).  Their free slots are hidden from steps 1 and 4 so that the feasibility
check can count each of them as one whole large page (see ``supply``).

Naming rule for page moves, here and in the evictor, the index and the ledger: ``verb(group,
page)`` moves one page; ``verb_many(group, pages)`` moves any pages of one group with the same
other arguments (a list, or an int array where numpy pays; the method picks its path);
``verb_run(group, ...)`` moves a *run*, one request's consecutive logical pages released or held
together, given as flat parallel sequences (ids and per-page key parts) or a slice of its page
list.  No other suffix; ``RunMoves.verb`` (numpy over a long run) is one path of ``verb_many``.

*Free space*: where an allocation finds room: free large pages, free slots of carved ones, and ``E``.
``FreePool``: the free large pages, lowest id first.  ``FreeSlots``: the free small-page slots of
carved large pages, per group, visible or hidden.  ``EvictableSet``: the set ``E`` of fully evictable
large pages (no USED page, at least one CACHED page), whose free slots are hidden so that the
feasibility check counts each as one whole large page.  Parts owned by
``LargePageAllocator``, each handed the arrays it moves.

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
from array import array

import numpy as np

from jenga.core.alloc.allocator_check import check_allocator
from jenga.core.alloc.page_states import CACHED, FREE, USED, EvictionSource, PageViews, Supply
from jenga.core.alloc.run_moves import RunMoves
from jenga.core.flat_arrays import BULK, view, zeros

CARVE_LOOP = 16  # up to this many large pages carved at once: a slice assignment each

__all__ = ["CACHED", "FREE", "USED", "EvictionSource", "LargePageAllocator", "PageViews", "Supply"]

class LargePageAllocator:
    """The large-page pool and per-group carving, with request tags: a façade over its parts, the
    free pool (``free_large``), the free slots (``slots``), the set ``E`` (``e``), the run moves
    (``moves``), which it builds on its flat arrays and calls, and the evictor it is handed (built
    first on the same ``views``; ``None``: nothing is ever cached)."""

    def __init__(self, views: PageViews, evictor: EvictionSource | None = None, caps: list[int] | None = None):
        self.views = views  # the per-page arrays, made first: written here, read in place by the evictor
        self.page_bytes = views.page_bytes
        self.small_per_large = views.small_per_large  # k_g of the module doc
        self.large_page_bytes = self.page_bytes[0] * self.small_per_large[0]
        self.num_large = n = views.num_large
        groups = len(self.page_bytes)
        self.group_of: list[int] = views.group_of
        self.tag_of: list[object] = [None] * n
        # per large page: used / cached small pages; per group: each small page's state
        # (flat arrays, with numpy views of the same memory for bulk changes)
        self.n_used = zeros(n)
        self.n_cached = views.n_cached
        self.state = views.state
        self.cached_small = [0] * groups  # cached pages outside E
        self.used_small = [0] * groups  # USED pages per group
        self.owned = [0] * groups  # large pages each group owns now
        self.caps = caps  # per-group caps on the large pages a group owns at once (the static baseline's)
        self.num_carved = 0  # large pages ever carved (the manager's per-request quota counts these)
        # the parts: each is handed the arrays it reads or moves
        self.free_large = FreePool(n)  # lowest id first
        self.slots = FreeSlots(groups, self.tag_of)
        self.in_e = views.in_e  # per large page: in E (the E part keeps the counts)
        self.evictor = evictor  # evicts through it (steps 3 and 5); ``E`` reports to it
        self.e = EvictableSet(self.in_e, self.small_per_large, self.group_of, self.tag_of, self.n_used, self.n_cached, self.cached_small,
                              self.owned, self.free_large, self.slots, evictor)
        self.moves = RunMoves(self.small_per_large, self.state, self.group_of, self.tag_of, self.n_used, self.n_cached,
                              self.used_small, self.cached_small, self.owned, self.free_large, self.slots, self.e)
        # the parts' counters, read by the manager's admission and stats (the same lists)
        self.free_small = self.slots.free_small  # visible free slots
        self.hidden_free = self.slots.hidden_free  # free slots inside E
        self.e_count = self.e.e_count  # fully evictable large pages per group

    # ------------------------------------------------------------------ queries
    @property
    def num_e(self) -> int:
        """Fully evictable large pages."""
        return self.e.count

    @property
    def num_free_large(self) -> int:
        return len(self.free_large)

    def supply(self) -> Supply:
        return Supply(tuple(self.slots.free_small), tuple(self.cached_small), len(self.free_large) + self.e.count)

    def large_of(self, group: int, page: int) -> int:
        return page // self.small_per_large[group]

    def used_pages(self, group: int) -> int:
        """USED small pages of ``group``."""
        return self.used_small[group]

    def used_bytes(self) -> int:
        """Bytes of the USED small pages of every group."""
        return sum(n * b for n, b in zip(self.used_small, self.page_bytes, strict=True))

    def free_slots(self, group: int) -> int:
        """Free slots of ``group``'s carved large pages outside ``E`` (visible to steps 1 and 4)."""
        return self.slots.free_small[group]

    def stranded_bytes(self) -> int:
        """Bytes of the free slots of carved large pages outside ``E`` (no other group can use them)."""
        return sum(n * b for n, b in zip(self.slots.free_small, self.page_bytes, strict=True))

    def free_bytes(self) -> int:
        """Bytes free without evicting: free large pages and the free slots outside ``E``."""
        free = len(self.free_large) * self.large_page_bytes
        for n, b in zip(self.slots.free_small, self.page_bytes, strict=True):
            free += n * b
        return free

    def free_counts(self) -> tuple:
        """Everything ``free_bytes`` and ``hidden_free_bytes`` read, as one value: equal values, equal
        answers (a memo's key, ``Admission.hit_cannot_fit``)."""
        return len(self.free_large), tuple(self.free_small), tuple(self.hidden_free)

    def hidden_free_bytes(self) -> int:
        """Bytes of the free slots inside ``E`` (freed with their large page's cached pages)."""
        free = 0
        for n, b in zip(self.slots.hidden_free, self.page_bytes, strict=True):
            free += n * b
        return free

    def owned_large(self, group: int) -> int:
        """Large pages carved for ``group`` now."""
        return self.owned[group]

    def evictable_large(self, group: int) -> int:
        """Fully evictable large pages (in ``E``) of ``group``."""
        return self.e.e_count[group]

    def page_states(self, group: int) -> bytes:
        """A copy of the state (FREE / USED / CACHED) of each small page of ``group`` (checks)."""
        return bytes(self.state[group])

    def snapshot(self) -> dict:
        """Plain copies of the pool and the free-slot structures (read-only view for tests)."""
        return dict(free_large=sorted(self.free_large), **self.slots.snapshot())

    # ------------------------------------------------------------- allocation
    def allocate(self, group: int, tag: object, may_take_large: bool, prefer_shared: bool = False) -> int:
        """Take one small page of ``group`` for request ``tag`` in the paper's order.

        1. a free page in a large page tagged ``tag``; 2. a new large page; 3. evict the
        fully evictable large page with the smallest key; 4. a free page in any large
        page; 5. evict one small page.  Steps 2-3 only when ``may_take_large`` (the
        per-request quota).  ``prefer_shared`` tries step 4 before step 2 (for a request's
        lone state page, where a fresh large page would stay mostly empty).  The caller has
        checked ``supply()``; running out is a bug.
        """
        tagged = self.slots.tagged(group, tag)
        if tagged:
            return self._take(group, min(tagged))
        if prefer_shared:
            large = self.slots.lowest_partial(group)
            if large is not None:
                return self._take(group, large)
        if may_take_large:
            capped = self.caps is not None and self.owned[group] >= self.caps[group]
            if self.free_large and not capped:
                return self._take(group, self._carve(group, tag))
            # at its cap a group may only recycle its own fully evictable large pages
            if self.evictor is not None and self.evict_large(group if capped else None) is not None:
                return self._take(group, self._carve(group, tag))
        large = self.slots.lowest_partial(group)
        if large is not None:
            return self._take(group, large)
        if self.evictor is not None:
            page = self.evict_small(group)
            if page is not None:
                large = page // self.small_per_large[group]
                if self.group_of[large] == group:
                    return self._take(group, large)
                return self._take(group, self._carve(group, tag))  # the large page emptied
        if self.free_large and (self.caps is None or self.owned[group] < self.caps[group]):
            # quota spent but a whole page is left: still correct
            return self._take(group, self._carve(group, tag))
        raise AssertionError(f"allocator out of pages for group {group}: supply {self.supply()}")

    def allocate_many(self, group: int, tag: object, n: int, quota: int, prefer_shared: bool = False
                      ) -> tuple[list[int], int]:
        """``allocate`` ``n`` times; returns the pages and how many large pages were carved.

        Steps 2-3 stop once ``quota`` large pages were carved.  Slots of the request's own
        large pages are taken in bulk.  Once at most a quarter of a large page's worth of
        pages is left to take, free slots of other large pages come before a fresh one
        (step 4 before 2): a fresh large page would strand most of its slots (a decode
        step's one page in a 133-slot large page).
        """
        out: list[int] = []
        carved = 0
        k = self.small_per_large[group]
        quarter = k // 4
        while len(out) < n:
            tagged = self.slots.tagged(group, tag)
            if tagged:
                self._take_many(group, min(tagged), n - len(out), out)
                continue
            whole = min((n - len(out)) // k, quota - carved)
            if whole > 0 and not prefer_shared and self.caps is None:
                # what steps 2 (or 3) + 1 do, k pages at a time: fresh large pages, else the
                # fully evictable ones in eviction order, each carved as it is freed
                if self.free_large:
                    whole = min(whole, len(self.free_large))
                    self._carve_whole(group, tag, self.free_large.take(whole), out)
                    carved += whole
                    continue
                if self.evictor is not None:
                    freed = self.evict_large_many(whole)
                    if freed:
                        assert sorted(freed) == sorted(self.free_large), "evicted pages are not all the free ones"
                        self.free_large.clear()
                        self._carve_whole(group, tag, freed, out)
                        carved += len(freed)
                        continue
            before = self.num_carved
            out.append(self.allocate(group, tag, carved < quota, prefer_shared or n - len(out) <= quarter))
            carved += self.num_carved - before
        return out, carved

    def _take_many(self, group: int, large: int, m: int, out: list[int]) -> None:
        """Take up to ``m`` free slots of ``large`` (lowest first) into ``out``."""
        taken = self.slots.take_many(group, large, m)
        base = large * self.small_per_large[group]
        state = self.state[group]
        c = len(taken)
        if c > 8 and taken[-1] - taken[0] == c - 1:  # ascending, distinct: consecutive slots
            lo = base + taken[0]  # (a freshly carved large page's): one slice each way
            assert state.count(FREE, lo, lo + c) == c, f"pages {group}:{lo}..{lo + c - 1} taken while not free"
            state[lo:lo + c] = bytes([USED]) * c
            out.extend(range(lo, lo + c))
        else:
            for slot in taken:
                page = base + slot
                assert state[page] == FREE, f"page {group}:{page} taken while {state[page]}"
                state[page] = USED
                out.append(page)
        self.n_used[large] += c
        self.used_small[group] += c

    def _carve_whole(self, group: int, tag: object, larges: list[int], out: list[int]) -> None:
        """Carve ``larges`` (just taken from the pool) for ``group`` and take all their pages."""
        k, state, m = self.small_per_large[group], self.state[group], len(larges)
        group_of, tag_of, n_used = self.group_of, self.tag_of, self.n_used
        if m > 1 and larges[-1] - larges[0] == m - 1 and larges == list(range(larges[0], larges[-1] + 1)):
            self._carve_range(group, tag, larges[0], m, out)  # ascending, consecutive: one slice each
            self.num_carved += m
            return
        if m > CARVE_LOOP and m * k > BULK:
            for large in larges:
                assert group_of[large] == -1, f"large page {large} popped while owned"
                group_of[large] = group
                tag_of[large] = tag
            self._carve_flat(group, np.asarray(larges, dtype=np.int64))
        elif k == 1:  # one page each: its state byte
            for large in larges:
                assert group_of[large] == -1, f"large page {large} popped while owned"
                assert state[large] == FREE, f"large page {large} carved with pages in use"
                group_of[large] = group
                tag_of[large] = tag
                n_used[large] = 1
                state[large] = USED
        else:  # one slice per large page: cheaper than numpy's index arrays for a few of them
            used = bytes([USED]) * k
            for large in larges:
                assert group_of[large] == -1, f"large page {large} popped while owned"
                group_of[large] = group
                tag_of[large] = tag
                n_used[large] = k
                base = large * k
                assert state.count(FREE, base, base + k) == k, f"large page {large} carved with pages in use"
                state[base:base + k] = used
        if k == 1:
            out.extend(larges)
        else:
            for large in larges:
                out.extend(range(large * k, large * k + k))
        self.num_carved += m
        self.owned[group] += m
        self.used_small[group] += m * k

    def _carve_flat(self, group: int, larges: np.ndarray) -> None:
        """The page state of large pages ``larges`` just carved for ``group``: all pages USED."""
        state, k = view(self.state[group]), self.small_per_large[group]
        pages = larges if k == 1 else (larges[:, None] * k + np.arange(k)).ravel()
        assert not state[pages].any(), "large pages carved with pages in use"
        state[pages] = USED
        view(self.n_used)[larges] = k

    def _carve_range(self, group: int, tag: object, lo: int, m: int, out: list[int]) -> None:
        """Carve the consecutive fresh large pages ``[lo, lo + m)`` for ``group`` and take all
        their pages: one slice assignment per array, the pages appended to ``out`` in order."""
        k, state, group_of, hi = self.small_per_large[group], self.state[group], self.group_of, lo + m
        assert group_of[lo:hi].count(-1) == m, f"large pages {lo}..{hi - 1} popped while owned"
        group_of[lo:hi] = [group] * m
        self.tag_of[lo:hi] = [tag] * m
        self.n_used[lo:hi] = array("q", [k]) * m
        assert state.count(FREE, lo * k, hi * k) == m * k, f"large pages {lo}..{hi - 1} carved with pages in use"
        state[lo * k:hi * k] = bytes([USED]) * (m * k)
        out.extend(range(lo * k, hi * k))
        self.owned[group] += m
        self.used_small[group] += m * k

    def _carve(self, group: int, tag: object) -> int:
        large = self.free_large.pop()
        self.num_carved += 1
        assert self.group_of[large] == -1, f"large page {large} popped while owned"
        k = self.small_per_large[group]
        self.group_of[large] = group
        self.owned[group] += 1
        self.tag_of[large] = tag
        self.slots.open(group, large, tag, k)
        return large

    def _take(self, group: int, large: int) -> int:
        page = large * self.small_per_large[group] + self.slots.take(group, large)
        assert self.state[group][page] == FREE, f"page {group}:{page} taken while {self.state[group][page]}"
        self.state[group][page] = USED
        self.n_used[large] += 1
        self.used_small[group] += 1
        return page

    # -------------------------------------------------------- state changes
    def release(self, group: int, page: int) -> None:
        """USED -> FREE.  The large page returns to the pool once all its pages are free."""
        assert self.state[group][page] == USED, f"release of {group}:{page} in state {self.state[group][page]}"
        large = page // self.small_per_large[group]
        self.state[group][page] = FREE
        self.n_used[large] -= 1
        self.used_small[group] -= 1
        self.slots.add(group, large, page % self.small_per_large[group])
        self.e.place(large)

    def release_many(self, group: int, pages) -> None:
        """``release`` for each of the distinct USED ``pages`` of ``group`` (a list or an int
        array); a long run in one pass (``RunMoves.release``)."""
        if self.small_per_large[group] == 1:  # each page fills its large page: back to the pool
            pages = pages.tolist() if type(pages) is np.ndarray else pages
            self.moves.release_whole(group, pages, len(pages) > BULK)
        elif len(pages) <= BULK:
            release = self.release
            for page in (pages.tolist() if type(pages) is np.ndarray else pages):
                release(group, page)
        else:
            self.moves.release(group, pages)

    def to_cached(self, group: int, page: int) -> None:
        """USED -> CACHED (the evictor has recorded its key)."""
        self.to_cached_many(group, (page,))

    def to_cached_many(self, group: int, pages, larges=None, counts=None) -> None:
        """USED -> CACHED for each page (one pass; large pages placed once at the end).
        ``larges``, ``counts``: the pages' distinct large pages ascending and how many pages each
        has (a caller that has them; else counted here)."""
        k = self.small_per_large[group]
        if len(pages) > BULK:
            self.moves.to_cached(group, np.asarray(pages, dtype=np.int64), larges, counts)
            return
        state, n_used, n_cached = self.state[group], self.n_used, self.n_cached
        if k == 1:  # each page its own large page: it enters E at once (``EvictableSet.enter_many``, inline)
            in_e = self.in_e
            for page in pages:
                assert state[page] == USED and not in_e[page], f"cache of {group}:{page} in state {state[page]}"
                state[page] = CACHED
                n_used[page] = 0
                n_cached[page] = 1
                in_e[page] = 1
            self.used_small[group] -= len(pages)
            self.cached_small[group] += len(pages)
            self.e.entered_whole(group, pages)
            return
        emptied = []
        for page in pages:
            assert state[page] == USED, f"cache of {group}:{page} in state {state[page]}"
            state[page] = CACHED
            large = page // k
            n_used[large] -= 1
            n_cached[large] += 1
            if n_used[large] == 0:
                emptied.append(large)
        self.used_small[group] -= len(pages)
        self.cached_small[group] += len(pages)
        if emptied:
            self.e.enter_many(group, emptied)  # they hold cached pages: fully evictable now

    def touch_cached(self, group: int, page: int) -> None:
        """CACHED -> USED (a prefix hit).  The caller removed it from the evictor."""
        assert self.state[group][page] == CACHED, f"touch of {group}:{page} in state {self.state[group][page]}"
        large = page // self.small_per_large[group]
        self.e.leave(large)
        self.state[group][page] = USED
        self.n_cached[large] -= 1
        self.n_used[large] += 1
        self.used_small[group] += 1
        self.cached_small[group] -= 1

    def touch_cached_many(self, group: int, pages: list[int]) -> None:
        """``touch_cached`` for each of ``pages`` (distinct)."""
        if len(pages) > BULK:
            self.moves.touch_cached(group, np.asarray(pages, dtype=np.int64))
            return
        state, k, n_used, n_cached, in_e = self.state[group], self.small_per_large[group], self.n_used, self.n_cached, self.in_e
        leaving = []
        for page in pages:
            assert state[page] == CACHED, f"touch of {group}:{page} in state {state[page]}"
            large = page // k
            if in_e[large]:
                in_e[large] = 0
                leaving.append(large)
        if leaving:
            self.e.left_many(group, leaving)
        for page in pages:
            state[page] = USED
            large = page // k
            n_cached[large] -= 1
            n_used[large] += 1
        self.used_small[group] += len(pages)
        self.cached_small[group] -= len(pages)

    def evict_cached(self, group: int, page: int) -> None:
        """CACHED -> FREE (called by the evictor, which has dropped the page's hash)."""
        assert self.state[group][page] == CACHED, f"evict of {group}:{page} in state {self.state[group][page]}"
        large = page // self.small_per_large[group]
        self.e.leave(large)
        self.state[group][page] = FREE
        self.n_cached[large] -= 1
        self.cached_small[group] -= 1
        self.slots.add(group, large, page % self.small_per_large[group])
        self.e.place(large)

    def evict_whole_many(self, group: int, larges) -> None:
        """Every CACHED page of each of the distinct fully evictable ``larges`` (all of ``group``)
        -> FREE at once, the large pages back to the pool in one ``push_many`` (the evictor has
        dropped their keys and index entries): an int array with numpy, a list in one loop."""
        self.moves.evict_whole(group, larges)

    # ------------------------------------------- through the evictor (it keys, it picks; moves are here)
    def cache_run(self, group: int, ids, negs, last_access: int) -> None:
        """USED -> CACHED for the distinct registered ``ids`` (a list or an int array) released at
        ``last_access``, ``-prefix length`` in ``negs``: the evictor keys them, then they move (and
        ``E`` tells it of the large pages that entered)."""
        evictor = self.evictor
        ids, larges, counts = evictor.key_run(group, ids, negs, last_access)
        self.to_cached_many(group, ids, larges, counts)
        evictor.keyed()

    def hit(self, group: int, page: int) -> tuple[int, int]:
        """CACHED -> USED (a prefix hit), its key leaving the evictor: ``(release time, -prefix
        length)``, to undo with ``cache_run``."""
        self.touch_cached(group, page)
        return self.evictor.unkey(group, page)

    def hit_many(self, group: int, pages: list[int]) -> list[tuple[int, int]]:
        """``hit`` for the distinct CACHED ``pages``."""
        self.touch_cached_many(group, pages)
        return self.evictor.unkey_many(group, pages)

    def hit_run(self, group: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``hit_many`` for a long run: (release times, -prefix lengths) as arrays."""
        self.touch_cached_many(group, ids if len(ids) > BULK else ids.tolist())
        return self.evictor.unkey_run(group, ids)

    def evict_large(self, group: int | None = None) -> int | None:
        """Evict the fully evictable large page with the smallest key (of ``group`` only, when
        given): its cached pages FREE, it back to the pool.  Its id, or ``None`` if ``E`` is empty."""
        picked = self.evictor.pick_large(group)
        if picked is None:
            return None
        self.evict_whole_many(picked[0], [picked[1]])
        return picked[1]

    def evict_large_many(self, m: int) -> list[int]:
        """``evict_large()`` up to ``m`` times, in its order; the freed large pages in order."""
        out: list[int] = []
        for g, larges in self.evictor.pick_large_many(m, out):
            self.evict_whole_many(g, larges)
        return out

    def evict_small(self, group: int) -> int | None:
        """Evict the cached page of ``group`` with the smallest key outside ``E``; the now-FREE
        page, or ``None`` when there is none."""
        page = self.evictor.pick_small(group)
        if page is not None:
            self.evict_cached(group, page)
        return page

    def evict_many(self, group: int, pages: list[int]) -> None:
        """Evict the distinct CACHED ``pages`` now, out of order (a live page took over a key, a
        promoted copy nobody used): their keys dropped together, then each FREE."""
        self.evictor.drop_many(group, pages)
        for page in pages:
            self.evict_cached(group, page)

    def check_integrity(self) -> dict[str, int]:
        """Recount every page from ``state``; assert all counters agree.  Returns totals."""
        return check_allocator(self, self.free_large, self.slots.visible, self.slots.hidden)


# ---------------------------------------------------------------- free space (module doc: *Free space*)


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
