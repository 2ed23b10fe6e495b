"""The prefix-subset evictor: one global order by ``(last access, -prefix length)``.

*Balanced*: all groups of a request get the request's access time when it frees them.
*Aligned*: a page's prefix length is the token position of its end, the same in every
group, so on equal times the same tokens leave every group (the tail first).  A large
page's key is the largest key of its cached pages: it is evicted whole only when every
page in it is older than what other large pages hold.
"""

from __future__ import annotations

import heapq
from itertools import repeat

from jenga.allocator import CACHED, EvictionSource, LargePageAllocator
from jenga.prefix.index import PrefixIndex

Key = tuple[int, int]  # (last_access, -prefix_length)



def _push_all(heap: list, entries: list) -> None:
    """Add ``entries`` to ``heap``: one heapify for a batch larger than an eighth of it, else pushes."""
    if len(entries) > len(heap) // 8:
        heap.extend(entries)
        heapq.heapify(heap)
    else:
        push = heapq.heappush
        for e in entries:
            push(heap, e)

class PrefixEvictor(EvictionSource):
    """Holds the key of every CACHED page; evicts small pages per group and whole large pages."""

    def __init__(self, allocator: LargePageAllocator, index: PrefixIndex):
        self.alloc = allocator
        self.index = index
        n = len(allocator.k)
        self.keys: list[dict[int, Key]] = [{} for _ in range(n)]
        self._heaps: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        # per group: (t, -plen, large, version) of fully evictable large pages, lazily cleaned
        # (ties go to the lower large page id; the version only marks stale entries)
        self._large_heaps: list[list[tuple[int, int, int, int]]] = [[] for _ in range(n)]
        self._large_ver = [0] * allocator.num_large
        # entries pushed since each heap was last compacted, and its size right after
        self._pushed = [0] * n
        self._base = [0] * n
        self._large_pushed = [0] * n
        self._large_base = [0] * n
        # a group of one small page per large page never evicts small pages: a cached page's
        # large page has no used page, so it is always in E (``evict_small`` finds nothing)
        self._small_order = [k > 1 for k in allocator.k]
        self.num_evicted_pages = 0
        allocator.evictor = self

    # ------------------------------------------------------------ page moves
    def add(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        """A registered USED page whose last holder left becomes CACHED with this key."""
        self.add_many(group, [(page, prefix_len)], last_access)

    def add_many(self, group: int, pages: list[tuple[int, int]], last_access: int) -> None:
        """``add`` for many (page, prefix length) pairs with one access time."""
        self.add_run(group, [page for page, _ in pages], [-plen for _, plen in pages], last_access)

    def add_run(self, group: int, ids: list[int], negs, last_access: int) -> None:
        """``add_many`` for pages ``ids`` with ``-prefix length`` in ``negs`` (a sequence)."""
        keys = self.keys[group]
        prios = repeat(last_access) if self._plain else self.priorities_of(group, ids, last_access)
        keys.update(zip(ids, zip(prios, negs, strict=False), strict=True))  # prios may be repeat()
        if self._small_order[group]:
            heap = self._heaps[group]
            _push_all(heap, [(*keys[page], page) for page in ids])
            self._pushed[group] += len(ids)
            if self._pushed[group] > self._base[group] + 1024:  # drop stale entries now and then
                heap[:] = [(t, n, p) for t, n, p in heap if keys.get(p) == (t, n)]
                heapq.heapify(heap)
                self._pushed[group], self._base[group] = 0, len(heap)
        self.alloc.to_cached_many(group, ids)

    # ------------------------------------------------ eviction order hooks
    #: True when ``priority`` is the release time itself (plain LRU: the fast path)
    _plain = True

    def priority(self, group: int, page: int, last_access: int) -> int:
        """The first part of a page's key (smaller goes first): here its release time."""
        return last_access

    def priorities(self, group: int, pages: list[tuple[int, int]], last_access: int) -> list[int]:
        """``priority`` of each (page, prefix length) pair."""
        return [self.priority(group, page, last_access) for page, _ in pages]

    def priorities_of(self, group: int, ids: list[int], last_access: int) -> list[int]:
        """``priorities`` for page ids."""
        return self.priorities(group, [(page, 0) for page in ids], last_access)

    def release_time(self, group: int, page: int, key: Key) -> int:
        """The release time behind a key (``touch`` hands it back for an undo)."""
        return key[0]

    def release_keys(self, group: int, pages: list[int], keys: list[Key]) -> list[Key]:
        """``(release_time, -prefix length)`` of each of ``pages`` (``keys``: their keys)."""
        return keys

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        """The CACHED pages among ``pages`` whose key would change if they were held and
        given back now (their use counts changed); none here: the key is the release time."""
        return []

    def forget(self, group: int, page: int) -> None:
        """The page left the cache (hit or evicted)."""

    def touch(self, group: int, page: int) -> Key:
        """A CACHED page is hit: it becomes USED.  Returns its (release time, -prefix length)
        (to undo with ``add``)."""
        key = self.keys[group].pop(page)
        self.alloc.touch_cached(group, page)
        return self.release_time(group, page, key), key[1]

    def touch_many(self, group: int, pages: list[int]) -> list[Key]:
        """``touch`` for distinct CACHED ``pages``; their (release time, -prefix length)."""
        keys = self.keys[group]
        out = [keys.pop(page) for page in pages]
        self.alloc.touch_cached_many(group, pages)
        return self.release_keys(group, pages, out)

    def _drop(self, group: int, page: int) -> None:
        del self.keys[group][page]
        self.forget(group, page)
        self.index.drop(group, page)
        self.alloc.evict_cached(group, page)
        self.num_evicted_pages += 1

    # -------------------------------------------------- EvictionSource hooks
    def evict_small(self, group: int) -> int | None:
        if not self._small_order[group]:
            return None
        heap, keys, alloc = self._heaps[group], self.keys[group], self.alloc
        k = alloc.k[group]
        skipped = []
        found = None
        while heap:
            t, neg, page = heapq.heappop(heap)
            if keys.get(page) != (t, neg):
                continue  # stale entry
            if alloc.in_e[page // k]:
                skipped.append((t, neg, page))  # whole-large candidates stay whole
                continue
            found = page
            break
        for item in skipped:
            heapq.heappush(heap, item)
        if found is not None:
            self._drop(group, found)
        return found

    def _top(self, group: int) -> tuple[int, int, int, int] | None:
        """The valid smallest entry of a group's large-page heap (stale ones dropped)."""
        heap, ver, in_e = self._large_heaps[group], self._large_ver, self.alloc.in_e
        while heap:
            e = heap[0]
            if e[3] == ver[e[2]] and in_e[e[2]]:
                return e
            heapq.heappop(heap)
        return None

    def evict_large(self, group: int | None = None) -> int | None:
        if group is None:
            tops = [(e, g) for g in range(len(self._large_heaps)) if (e := self._top(g)) is not None]
            if not tops:
                return None
            _, g = min(tops)
        else:
            if self._top(group) is None:
                return None
            g = group
        return self._evict_top(g)

    def evict_large_many(self, m: int) -> list[int]:
        """``evict_large()`` up to ``m`` times; the freed large pages in eviction order."""
        out = []
        heaps, ngroups = self._large_heaps, range(len(self._large_heaps))
        while len(out) < m:
            best = None
            for g in ngroups:
                if heaps[g]:
                    e = self._top(g)
                    if e is not None and (best is None or (e, g) < best):
                        best = (e, g)
            if best is None:
                break
            out.append(self._evict_top(best[1]))
        return out

    def _evict_top(self, g: int) -> int:
        """Evict the large page at the top of group ``g``'s heap (checked valid)."""
        alloc = self.alloc
        found = heapq.heappop(self._large_heaps[g])[2]
        k = alloc.k[g]
        state, keys, index = alloc.state[g], self.keys[g], self.index
        for page in range(found * k, (found + 1) * k):
            if state[page] == CACHED:
                del keys[page]
                self.forget(g, page)
                index.drop(g, page)
                self.num_evicted_pages += 1
        alloc.evict_whole(found)
        return found

    def on_large_evictable(self, large: int) -> None:
        self.on_larges_evictable(self.alloc.group_of[large], (large,))

    def on_larges_evictable(self, group: int, larges) -> None:
        """``on_large_evictable`` for each of ``larges`` (all of ``group``)."""
        alloc, ver = self.alloc, self._large_ver
        k = alloc.k[group]
        state, keys = alloc.state[group], self.keys[group]
        heap = self._large_heaps[group]
        entries = []
        for large in larges:
            v = ver[large] = ver[large] + 1
            if k == 1:
                t, n = keys[large]
            else:
                t, n = max(keys[p] for p in range(large * k, (large + 1) * k) if state[p] == CACHED)
            entries.append((t, n, large, v))
        count = len(entries)
        _push_all(heap, entries)
        self._large_pushed[group] += count
        if self._large_pushed[group] > self._large_base[group] + 1024:  # drop stale entries now and then
            in_e = alloc.in_e
            heap[:] = [e for e in heap if e[3] == ver[e[2]] and in_e[e[2]]]
            heapq.heapify(heap)
            self._large_pushed[group], self._large_base[group] = 0, len(heap)

    def on_large_unevictable(self, large: int) -> None:
        self._large_ver[large] += 1

    def on_larges_unevictable(self, larges: list[int]) -> None:
        ver = self._large_ver
        for large in larges:
            ver[large] += 1

