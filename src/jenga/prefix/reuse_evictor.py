"""A scan-resistant evictor: pages whose content proved reusable outlive one-off pages, and
among those a stable subset stays resident when the reused set is larger than the pool.

Plain LRU (:class:`~jenga.prefix.evictor.PrefixEvictor`) thrashes on a cyclic working set
bigger than the pool: every page is evicted just before its next use.  Here each block
hash has a *use count* (computed or hit; kept by :class:`~jenga.prefix.index.PrefixIndex`
beyond the page's eviction, like ARC's ghost lists).  Eviction order, first to last:

1. pages released aged (out of window or chunk: negative times), oldest first;
2. pages used once (a one-off prompt tail, or a prefix waiting for its second user), LRU:
   a new prefix keeps the time it needs for a second request to arrive;
3. pages used at least twice, most recently released first: when the reused set does not
   fit, the pages resident longest stay (they keep hitting) instead of each evicting the
   next one to be needed (in the spirit of LIRS / MRU for loops).

Within a class, ties go to the longer prefix first, as in the base evictor (aligned).
"""

from __future__ import annotations

from jenga.flat_arrays import as_ids, view, zeros
from jenga.prefix.evictor import PrefixEvictor
from jenga.prefix.run_heap import SMALL

PROTECTED = 1 << 61  # priorities of class 3 are PROTECTED - release time


class ReuseEvictor(PrefixEvictor):
    """``PrefixEvictor`` with use-count classes (module doc)."""

    _plain = False

    def __init__(self, allocator, index):
        super().__init__(allocator, index)
        # per group: each cached page's release time (its key's first part may be a class)
        self.times = [zeros(allocator.num_large * k) for k in allocator.k]
        self.protected: list[set[int]] = [set() for _ in allocator.k]  # cached pages of class 3
        self._prot_in: dict[int, int] = {}  # large page -> class-3 pages in it
        self._prot_out = [0] * len(allocator.k)  # per group: class-3 pages outside E
        self._e_prot = 0  # large pages in E holding a class-3 page
        index.track_uses([allocator.num_large * k for k in allocator.k])

    # class-3 pages are tracked per large page, so an admission can ask what it may evict
    # without touching them (``protected_supply``) in O(groups)
    def _mark(self, group: int, page: int, delta: int) -> None:
        large = page // self.alloc.k[group]
        n = self._prot_in.get(large, 0) + delta
        if n:
            self._prot_in[large] = n
        else:
            del self._prot_in[large]
        if self.alloc.in_e[large]:
            if n == 0 or (n == delta and delta > 0):
                self._e_prot += 1 if delta > 0 else -1
        else:
            self._prot_out[group] += delta

    def priorities_of(self, group: int, ids, last_access: int):
        if len(ids) > SMALL:
            view(self.times[group])[ids] = last_access
        else:
            times = self.times[group]
            for page in ids:
                times[page] = last_access
        if last_access < 0:
            return last_access
        page_uses = self.index.page_uses[group]
        if len(ids) > SMALL:
            reused = view(page_uses)[ids] >= 2
            if not reused.any():
                return last_access
            pages, reused = ids.tolist(), reused.tolist()
        else:
            pages = ids
            reused = [page_uses[p] >= 2 for p in ids]
            if True not in reused:
                return last_access
        protected = PROTECTED - last_access
        prot = self.protected[group]
        for page, r in zip(pages, reused, strict=True):
            if r and page not in prot:  # pages being cached: their large page is not in E
                prot.add(page)
                self._mark(group, page, 1)
        return [protected if r else last_access for r in reused]

    def _unprotect(self, group: int, page: int) -> None:
        prot = self.protected[group]
        if page in prot:
            prot.discard(page)
            self._mark(group, page, -1)

    def release_time(self, group: int, page: int, key: tuple[int, int]) -> int:
        self._unprotect(group, page)
        return self.times[group][page]

    def release_keys(self, group: int, pages: list[int], keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        if self.protected[group]:
            for page in pages:
                self._unprotect(group, page)
        if len(pages) > SMALL:
            times = view(self.times[group])[as_ids(pages)].tolist()
        else:
            times = [self.times[group][p] for p in pages]
        return [(t, key[1]) for t, key in zip(times, keys, strict=True)]

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        keys, uses, key_of = self.keys[group], self.index.uses[group], self.index.key_of[group]
        out = []
        for page in pages:
            key = keys.get(page)
            if key is None or key[0] < 0 or key[0] > PROTECTED // 2:
                continue  # held by others, aged, or protected already (use counts only grow)
            if uses.get(key_of[page], 0) >= 2:
                out.append(page)
        return out

    def forget_many(self, group: int, pages) -> None:
        if self.protected[group]:
            for page in pages:
                self._unprotect(group, page)

    def on_larges_evictable(self, group: int, larges) -> None:
        if self._prot_in:
            prot_in = self._prot_in
            for large in larges:
                n = prot_in.get(large, 0)
                if n:
                    self._prot_out[group] -= n
                    self._e_prot += 1
        super().on_larges_evictable(group, larges)

    def on_large_unevictable(self, large: int) -> None:
        self.on_larges_unevictable((large,))

    def on_larges_unevictable(self, larges) -> None:
        if self._prot_in:
            prot_in, group_of = self._prot_in, self.alloc.group_of
            for large in larges:
                n = prot_in.get(large, 0)
                if n:
                    self._prot_out[group_of[large]] += n
                    self._e_prot -= 1
        super().on_larges_unevictable(list(larges))

    def protected_supply(self) -> tuple[list[int], int]:
        """(per group: class-3 pages outside fully evictable large pages, fully evictable
        large pages holding a class-3 page): what ``supply()`` counts that an allocation
        must leave alone to evict no page reused at least twice."""
        return self._prot_out, self._e_prot

    def protected_bytes(self) -> int:
        """Bytes of class-3 pages."""
        pb = self.alloc.page_bytes
        return sum(len(p) * pb[g] for g, p in enumerate(self.protected))

    def check(self) -> None:
        """Recount the class-3 counters (for ``check_integrity``)."""
        alloc, inside, out, e = self.alloc, {}, [0] * len(self.protected), set()
        for g, pages in enumerate(self.protected):
            k = alloc.k[g]
            for page in pages:
                assert page in self.keys[g] and self.keys[g][page][0] >= PROTECTED // 2, f"{g}:{page} not class 3"
                inside[page // k] = inside.get(page // k, 0) + 1
                if alloc.in_e[page // k]:
                    e.add(page // k)
                else:
                    out[g] += 1
        for g, key_of in enumerate(self.index.key_of):
            uses, page_uses = self.index.uses[g], self.index.page_uses[g]
            assert all(page_uses[p] == uses.get(key, 0) for p, key in key_of.items()), f"group {g}: page use counts"
        assert inside == self._prot_in and out == self._prot_out and len(e) == self._e_prot, \
            f"class-3 counters {self._prot_in, self._prot_out, self._e_prot} != {inside, out, len(e)}"
