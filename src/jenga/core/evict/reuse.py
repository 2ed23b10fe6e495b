"""A scan-resistant evictor: pages whose content proved reusable outlive one-off pages, and
among those a stable subset stays resident when the reused set is larger than the pool.

Plain LRU (:class:`~jenga.core.evict.evictor.PrefixEvictor`) thrashes on a cyclic working set
bigger than the pool: every page is evicted just before its next use.  Here each block
hash has a *use count* (computed or hit; kept by :class:`~jenga.core.prefix.index.PrefixIndex`
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

import numpy as np

from jenga.core.evict.evictor import PrefixEvictor
from jenga.core.evict.run_heap import SMALL
from jenga.core.flat_arrays import BULK, as_ids, unique_counts, view, zeros
from jenga.core.policy.base import held_window_time

PROTECTED = 1 << 61  # priorities of class 3 are PROTECTED - release time


class ReuseEvictor(PrefixEvictor):
    """``PrefixEvictor`` with use-count classes (module doc)."""

    _plain = False

    counts_uses = True

    def __init__(self, pages, index, listener=None):
        super().__init__(pages, index, listener)
        # per group: each cached page's release time (its key's first part may be a class)
        self.times = [zeros(pages.num_large * k) for k in pages.small_per_large]
        self._flags = [bytearray(pages.num_large * k) for k in pages.small_per_large]  # 1: a class-3 page
        self._num_prot = [0] * len(pages.small_per_large)
        self.protected = [ProtectedPages(f, self._num_prot, g) for g, f in enumerate(self._flags)]  # class 3
        self._prot_in = zeros(pages.num_large)  # per large page: class-3 pages in it
        self._prot_out = [0] * len(pages.small_per_large)  # per group: class-3 pages outside E
        self._e_prot = [0] * len(pages.small_per_large)  # per group: large pages in E holding a class-3 page

    # class-3 pages are counted per large page, so an admission can ask what it may evict
    # without touching them (``protected_supply``) in O(groups)
    def _protect(self, group: int, pages, on: bool) -> None:
        """Flag ``pages`` (distinct) as class 3 (``on``) or not; pages already so are left."""
        if not on and not self._num_prot[group]:
            return  # nothing to clear
        flags, k, in_e, prot_in = self._flags[group], self.pages.small_per_large[group], self.pages.in_e, self._prot_in
        if len(pages) <= BULK:
            for page in pages:
                if flags[page] == on:
                    continue
                flags[page] = on
                self._num_prot[group] += 1 if on else -1
                large = page // k
                n = prot_in[large] = prot_in[large] + (1 if on else -1)
                if not in_e[large]:
                    self._prot_out[group] += 1 if on else -1
                elif n == (1 if on else 0):
                    self._e_prot[group] += 1 if on else -1
            return
        ids = as_ids(pages)
        ids = ids[view(flags)[ids] != on]
        if not len(ids):
            return
        view(flags)[ids] = on
        self._num_prot[group] += len(ids) if on else -len(ids)
        larges, counts = (ids, 1) if k == 1 else unique_counts(ids // k)
        counts = np.broadcast_to(counts, larges.shape)
        pin = view(prot_in)
        before = pin[larges]
        after = before + counts if on else before - counts
        pin[larges] = after
        e = view(in_e)[larges] == 1
        self._prot_out[group] += (1 if on else -1) * int(counts[~e].sum())
        self._e_prot[group] += int((e & (before == 0)).sum()) if on else -int((e & (after == 0)).sum())

    def record_times(self, group: int, ids, last_access: int) -> None:
        """Each page's last access (per run: one numpy store past ``BULK`` pages)."""
        if len(ids) > BULK:
            view(self.times[group])[ids] = last_access
        else:
            times = self.times[group]
            for page in ids:
                times[page] = last_access

    def priorities_of(self, group: int, ids, last_access: int, negs=None):
        self.record_times(group, ids, last_access)
        if last_access < 0:
            return last_access
        page_uses = self.index.page_uses[group]
        last_access, held_window = held_window_time(last_access)
        # a window its holder's prefix needs: last of class 3
        protected = PROTECTED if held_window else PROTECTED - last_access
        if len(ids) > BULK:
            reused = view(page_uses)[ids] >= 2
            if not reused.any():
                return last_access
            self._protect(group, ids[reused], True)  # pages being cached: their large page is not in E
            return np.where(reused, protected, last_access)
        reused = [page_uses[p] >= 2 for p in ids]
        if True not in reused:
            return last_access
        self._protect(group, [p for p, r in zip(ids, reused, strict=True) if r], True)
        return [protected if r else last_access for r in reused]

    def key_run(self, group: int, ids, negs, last_access: int) -> tuple:
        """``PrefixEvictor.key_run``; a short run (a list) in one loop: ``priorities_of``, the
        keys, the class-3 counts and, for a group of one page per large page, the large-page
        entries, which the allocator's ``on_evictable_many`` for exactly these pages pushes."""
        if type(ids) is not list or len(ids) > BULK:
            return super().key_run(group, ids, negs, last_access)
        k = self.pages.small_per_large[group]
        times, kt, kn, ver = self.times[group], self.key_t[group], self.key_n[group], self.large.ver
        t, protected, page_uses = last_access, None, self.index.page_uses[group]
        if last_access >= 0:
            t, held_window = held_window_time(last_access)
            protected = PROTECTED if held_window else PROTECTED - t
        flags, prot_in, in_e = self._flags[group], self._prot_in, self.pages.in_e
        out, reused = [], 0  # k == 1: large-page entries; else each page's key time
        for page, neg in zip(ids, negs, strict=True):
            times[page] = last_access
            prio = t
            if protected is not None and page_uses[page] >= 2:
                prio = protected
                reused += 1
                if flags[page] != 1:  # ``_protect``
                    flags[page] = 1
                    self._num_prot[group] += 1
                    large = page // k
                    n = prot_in[large] = prot_in[large] + 1
                    if not in_e[large]:
                        self._prot_out[group] += 1
                    elif n == 1:
                        self._e_prot[group] += 1
            kt[page] = prio
            kn[page] = neg
            if k == 1:
                v = ver[page] = ver[page] + 1
                out.append((prio, neg, page, -1 - v))
            else:
                out.append(prio)
        self.num_keys[group] += len(ids)
        if k > 1:
            self._heaps[group].push(out, negs, ids, ids)  # (``_small_order``)
            return ids, None, None
        self._short = (ids, out, reused)
        return ids, None, None

    def keyed(self) -> None:
        super().keyed()
        self._short = None

    #: ``(ids, large-page entries, class-3 pages)`` of the short run ``key_run`` keyed (one page
    #: per large page), until the allocator's call back (``keyed``); else None
    _short = None

    def release_time(self, group: int, page: int, key: tuple[int, int]) -> int:
        self._protect(group, (page,), False)
        return self.times[group][page]

    def release_stamps(self, group: int, pages) -> list[int]:
        """``PrefixEvictor.release_stamps`` from the release times (a key here may be a class)."""
        times = self.times[group]
        return [held_window_time(times[page])[0] for page in pages]

    def release_keys(self, group: int, pages: list[int], keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        self._protect(group, pages, False)
        if len(pages) > BULK:
            times = view(self.times[group])[as_ids(pages)].tolist()
        else:
            times = [self.times[group][p] for p in pages]
        return [(t, key[1]) for t, key in zip(times, keys, strict=True)]

    def release_times(self, group: int, ids: np.ndarray, ts: np.ndarray) -> np.ndarray:
        self._protect(group, ids, False)
        return view(self.times[group])[ids]

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        keys, page_uses = self.keys[group], self.index.page_uses[group]
        out = []
        for page in pages:
            key = keys.get(page)
            if key is None or key[0] < 0 or key[0] > PROTECTED // 2:
                continue  # held by others, aged, or protected already (use counts only grow)
            if page_uses[page] >= 2:
                out.append(page)
        return out

    def forget_many(self, group: int, pages) -> None:
        self._protect(group, pages, False)

    def on_evictable_many(self, group: int, larges) -> None:
        short = self._short
        if short is not None and larges is short[0]:  # ``key_run``'s pages, keyed and versioned
            _, entries, reused = short
            if reused:  # ``_move_protected``: each class-3 page's large page enters E
                self._prot_out[group] -= reused
                self._e_prot[group] += reused
            if len(entries) <= SMALL:
                self.large.heaps[group].push_singles(entries)
            else:  # (t, n, id, version) columns
                ts, ns, ids, gs = zip(*entries, strict=True)
                self.large.heaps[group].push(list(ts), list(ns), list(ids), [-1 - g for g in gs])
            return
        self._move_protected(group, larges, -1)
        super().on_evictable_many(group, larges)

    def on_unevictable(self, large: int) -> None:
        self.on_unevictable_many(self.pages.group_of[large], (large,))

    def on_unevictable_many(self, group: int, larges) -> None:
        self._move_protected(group, larges, 1)
        super().on_unevictable_many(group, larges)

    def _move_protected(self, group: int, larges, sign: int) -> None:
        """``larges`` left E (``sign`` 1) or entered it (-1): their class-3 pages move in or
        out of the group's count, and each holding one out of or into ``_e_prot``."""
        if not self._num_prot[group]:
            return
        if len(larges) <= BULK:
            prot_in = self._prot_in
            for large in larges:
                n = prot_in[large]
                if n:
                    self._prot_out[group] += sign * n
                    self._e_prot[group] -= sign
            return
        n = view(self._prot_in)[as_ids(larges)]
        self._prot_out[group] += sign * int(n.sum())
        self._e_prot[group] -= sign * int(np.count_nonzero(n))

    def protected_supply(self, groups=None) -> tuple[list[int], int]:
        """(per group: class-3 pages outside fully evictable large pages, fully evictable
        large pages holding a class-3 page): what ``supply()`` counts that an allocation
        must leave alone to evict no page reused at least twice.  ``groups``: only those
        groups' class-3 pages (the others count none); default every group."""
        if groups is None:
            return self._prot_out, sum(self._e_prot)
        out = [0] * len(self._prot_out)
        for g in groups:
            out[g] = self._prot_out[g]
        return out, sum(self._e_prot[g] for g in groups)

    def protected_bytes(self) -> int:
        """Bytes of class-3 pages."""
        out = 0
        for n, b in zip(self._num_prot, self.pages.page_bytes, strict=True):  # len(self.protected[g]), each g
            out += n * b
        return out

    def check(self) -> None:
        """Recount the class-3 counters (for ``check_integrity``)."""
        super().check()
        assert [f.count(1) for f in self._flags] == self._num_prot, "class-3 page counts"
        inside, out, e = {}, [0] * len(self.protected), [set() for _ in self.protected]
        for g, pages in enumerate(self.protected):
            k = self.pages.small_per_large[g]
            for page in pages:
                assert page in self.keys[g] and self.keys[g][page][0] >= PROTECTED // 2, f"{g}:{page} not class 3"
                inside[page // k] = inside.get(page // k, 0) + 1
                if self.pages.in_e[page // k]:
                    e[g].add(page // k)
                else:
                    out[g] += 1
        for g in range(len(self.index.key_of)):
            self.index.check_uses(g)
        recorded = {large: n for large, n in enumerate(self._prot_in) if n}
        e_counts = [len(larges) for larges in e]
        assert inside == recorded and out == self._prot_out and e_counts == self._e_prot, \
            f"class-3 counters {recorded, self._prot_out, self._e_prot} != {inside, out, e_counts}"


class ProtectedPages:
    """A group's class-3 pages as a read-only set (iteration, ``len``, ``in``) over its flags."""

    __slots__ = ("_flags", "_counts", "_g")

    def __init__(self, flags: bytearray, counts: list[int], g: int):
        self._flags, self._counts, self._g = flags, counts, g

    def __contains__(self, page) -> bool:
        return type(page) is int and 0 <= page < len(self._flags) and self._flags[page] == 1

    def __len__(self) -> int:
        return self._counts[self._g]

    def __iter__(self):
        return iter(np.flatnonzero(view(self._flags)).tolist())
