"""How the manager's pages change hands: fresh pages in, references held and dropped,
registered pages handed to the evictor at zero references, unregistered ones freed.

``PageLedger`` implements the ``PageOps`` the policies call; ``KVCacheManager`` is one.
It works on the manager's allocator, index, evictor and per-group reference counts.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable

import numpy as np

from jenga.core.flat_arrays import BULK, as_ids, int64s, view
from jenga.core.policy.base import PageOps

#: a run of at most this many pages is dropped element by element (cheaper than numpy's ~25 calls)
DROP_LOOP = 128


class PageLedger(PageOps):
    """Reference counts and the hand-offs between allocator, index and evictor."""

    def take(self, group: int) -> int:
        alloc = self.alloc
        before = alloc.num_carved
        page = alloc.allocate(group, self._tag, self._quota[group] > 0, self._shared[group])
        self._quota[group] -= alloc.num_carved - before
        self.ref[group][page] = 1
        return page

    def hold_run(self, group: int, pages: list[int]) -> None:
        """``hold`` each page (a hit on a run of distinct cached pages); the log gets one
        ``(group, pages, keys)`` entry for the run."""
        if self._recording is not None:  # a lookup: held later (``jenga.core.manager.deferred_hold``)
            self._recording.append((group, list(pages)))
            return
        ref, log = self.ref[group], self._log
        if self.index.uses is not None:
            self.index.count_uses(group, pages)
        if len(pages) > BULK:  # keys as three lists (was cached, release time, -prefix length)
            ids = as_ids(pages)
            refs = view(ref)
            free = refs[ids] == 0
            refs[ids] += 1
            kt, kn = np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=np.int64)
            if free.any():
                kt[free], kn[free] = self.evictor.touch_run(group, ids[free])
            keys = (free.tolist(), kt.tolist(), kn.tolist())
        else:
            cached = []  # the pages no live request held: a reference each now, then touched
            for page in pages:
                r = ref[page]
                ref[page] = r + 1
                if not r:
                    cached.append(page)
            if not cached:  # every page held by a live request already
                keys = [None] * len(pages)
            else:
                keys = self.evictor.touch_many(group, cached)
                if len(cached) != len(pages):
                    it = iter(keys)
                    keys = [next(it) if ref[page] == 1 else None for page in pages]
        if log is not None:
            log.append((group, list(pages), keys))

    def hold(self, group: int, page: int) -> None:
        if self._recording is not None:
            self._recording.append((group, page))
            return
        ref = self.ref[group]
        if self.index.uses is not None:
            self.index.count_use(group, page)
        key = self.evictor.touch(group, page) if ref[page] == 0 else None
        ref[page] += 1
        if self._log is not None:
            self._log.append((group, page, key))

    def drop(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        ref = self.ref[group]
        assert ref[page] > 0, f"drop of unreferenced page {group}:{page}"
        ref[page] -= 1
        if ref[page] > 0:
            if self.caching:
                self._released.put(group, page, (last_access, -prefix_len))
        else:
            if self._released:
                self._released.pop(group, page)
            self._dropped(group, page, last_access, prefix_len)

    def drop_run(self, group: int, pages: list[int | None], start: int, stop: int, last_access: int,
                 tokens_per_page: int) -> None:
        """``drop`` for ``pages[start:stop]`` (page ``i`` ends at token ``(i+1) * tokens_per_page``),
        setting them to None; cached pages handed to the evictor together (a long run in numpy)."""
        seg = pages[start:stop]
        pages[start:stop] = [None] * len(seg)
        if len(seg) <= DROP_LOOP:
            self._drop_short(group, seg, start, last_access, tokens_per_page)
            return
        try:  # every page held (the common case): one C pass, which refuses a None
            ids = int64s(seg)
            negs = np.arange(-(start + 1) * tokens_per_page, -(stop + 1) * tokens_per_page, -tokens_per_page)
        except struct.error:
            held = [p for p in seg if p is not None]
            if not held:
                return
            ids = int64s(held)
            pos = start + np.flatnonzero(np.fromiter((p is not None for p in seg), dtype=bool, count=len(seg)))
            negs = -(pos + 1) * tokens_per_page
        refs = view(self.ref[group])
        r = refs[ids] - 1
        shared = r.any()  # usually not: every page's last reference goes (then no check is needed)
        assert not shared or r.min() >= 0, f"drop of unreferenced pages of group {group}"
        refs[ids] = r
        if shared:  # still held by others: their keys are recorded for an undone pin
            held = r > 0
            if self.caching:  # ``put`` for those, ``forget`` for the rest, in one pass
                self._released.update_many(group, ids, held, last_access, negs)
            last = ~held
            ids, negs = ids[last], negs[last]
            if not self.caching:
                self._released.forget_many(group, ids)
        else:
            self._released.forget_many(group, ids)
        reg = view(self.index.flags[group])[ids] == 1
        if self.caching and reg.all():
            self.evictor.add_run(group, ids, negs, last_access)
            return
        if self.caching:
            self.evictor.add_run(group, ids[reg], negs[reg], last_access)
            ids = ids[~reg]
        else:
            for page in ids[reg].tolist():
                self.index.drop(group, page)
        self.alloc.release_many(group, ids)

    def _drop_short(self, group: int, seg: list[int | None], start: int, last_access: int,
                    tokens_per_page: int) -> None:
        """``drop_run`` of a short run, element by element; cached pages go to the evictor together."""
        ref, registered, caching, released = self.ref[group], self.index.flags[group], self.caching, self._released
        rel_on, rel_t, rel_n = released.on[group], released.t[group], released.n[group]
        cache_ids: list[int] = []
        cache_negs: list[int] = []
        to_free: list[int] = []
        neg = -start * tokens_per_page  # page i's -prefix length: -(i + 1) * tokens_per_page
        recorded = 0  # change of ``released.count``
        try:
            for page in seg:
                neg -= tokens_per_page
                if page is None:
                    continue
                r = ref[page] - 1
                if r > 0:  # others still hold it
                    ref[page] = r
                    if caching:  # ``released.put``, inline
                        if not rel_on[page]:
                            rel_on[page] = 1
                            recorded += 1
                        rel_t[page] = last_access
                        rel_n[page] = neg
                    continue
                assert r == 0, f"drop of unreferenced page {group}:{page}"
                ref[page] = 0
                if rel_on[page]:
                    rel_on[page] = 0
                    recorded -= 1
                if registered[page]:
                    if caching:
                        cache_ids.append(page)
                        cache_negs.append(neg)
                        continue
                    self.index.drop(group, page)
                to_free.append(page)
        finally:
            released.count += recorded
        if cache_ids:
            self.evictor.add_run(group, cache_ids, cache_negs, last_access)
        if to_free:
            self.alloc.release_many(group, to_free)

    def _dropped(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        """A page's last reference went: cached when registered (and caching), else free."""
        if self.caching and self.index.is_registered(group, page):
            self.evictor.add(group, page, last_access, prefix_len)
        else:
            if self.index.is_registered(group, page):
                self.index.drop(group, page)
            self.alloc.release(group, page)

    def take_run(self, group: int, n: int) -> list[int]:
        """``n`` fresh pages of ``group`` (``take`` in a loop, own large pages in bulk)."""
        pages, carved = self.alloc.allocate_many(group, self._tag, n, self._quota[group], self._shared[group])
        self._quota[group] -= carved
        ref = self.ref[group]
        m, lo = len(pages), pages[0]
        if m > 8 and pages[-1] - lo == m - 1 and pages == list(range(lo, lo + m)):  # a carve's: one slice
            ref[lo:lo + m] = array("q", [1]) * m
        else:
            for page in pages:
                ref[page] = 1
        return pages

    def retime_keys(self, group: int, keys: list[bytes], ends: list[int], last_access: int) -> None:
        found = list(map(self.index.table[group].get, keys))
        ref = self.ref[group]
        if len(found) <= BULK:
            picked = [(page, -end) for page, end in zip(found, ends, strict=True) if page is not None and not ref[page]]
            if picked:
                pages, negs = zip(*picked, strict=True)
                self.evictor.retime_run(group, list(pages), list(negs), last_access)
            return
        try:  # every key registered (the common case): one C pass, which refuses a None
            ids, negs = int64s(found), -int64s(ends)
        except struct.error:
            known = np.fromiter((page is not None for page in found), dtype=bool, count=len(found))
            ids = np.asarray([page for page in found if page is not None], dtype=np.int64)
            negs = -np.asarray(ends, dtype=np.int64)[known]
        free = view(ref)[ids] == 0  # unheld: CACHED
        if free.any():
            self.evictor.retime_run(group, ids[free], negs[free], last_access)

    def register(self, group: int, page: int, key: bytes) -> bool:
        return self.index.register(group, page, key)

    def register_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> None:
        self.index.register_many(group, pages, keys)

    def find(self, group: int, key: bytes) -> int | None:
        return self.index.get(group, key)

    def index_table(self, group: int) -> dict[bytes, int]:
        return self.index.table[group]

    def _unhold(self, log: Iterable[tuple[int, int, tuple[int, int] | None]]) -> None:
        """Undo ``hold`` calls (``key``: the evictor key the page had when it was held).

        Right after ``hold`` (a rolled-back allocate) this is exact.  A lookup's pins are
        undone later, after other requests may have held and dropped the same pages, so
        a page whose last reference goes gets the key of its latest release, else the key
        it had when pinned; a page still referenced keeps that key for its last holder.
        """
        batches: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (group, t) -> pages, -prefix lengths
        released = self._released
        now_key = (self.now, 0)
        for group, page, key in reversed(list(log)):
            ref = self.ref[group]
            if type(page) is list:  # a run from hold_run: (group, pages, keys)
                self._unhold_run(group, page, key, batches, now_key)
                continue
            ref[page] -= 1
            if ref[page] > 0:
                if key is not None:
                    released.put_default(group, page, key)  # a recorded key is newer
                continue
            key = released.pop(group, page) or key or now_key
            ids, negs = batches.setdefault((group, key[0]), ([], []))  # key is (t, -prefix_len)
            ids.append(page)
            negs.append(key[1])
        for (group, t), (ids, negs) in batches.items():
            self.evictor.add_run(group, ids, negs, t)

    def _unhold_run(self, group: int, pages: list[int], keys: list, batches: dict, now_key: tuple[int, int]) -> None:
        """The per-page rule of ``_unhold`` for one ``hold_run`` entry, last page first."""
        if type(keys) is tuple:  # a long run's keys (``hold_run``)
            self._unhold_long(group, pages, keys, batches, now_key)
            return
        ref, released = self.ref[group], self._released
        last_t, batch_ids, batch_negs = None, None, None
        for i in range(len(pages) - 1, -1, -1):
            page, key = pages[i], keys[i]
            r = ref[page] = ref[page] - 1
            if r > 0:
                if key is not None:
                    released.put_default(group, page, key)
                continue
            if released:
                key = released.pop(group, page) or key
            key = key or now_key
            t = key[0]
            if t != last_t:
                batch_ids, batch_negs = batches.setdefault((group, t), ([], []))
                last_t = t
            batch_ids.append(page)
            batch_negs.append(key[1])

    def _unhold_long(self, group: int, pages: list[int], keys: list, batches: dict, now_key: tuple[int, int]) -> None:
        """``_unhold_run`` of a long run with numpy (the same keys, batches in the same order)."""
        ids = np.asarray(pages[::-1], dtype=np.int64)
        has = np.asarray(keys[0][::-1], dtype=bool)
        kt = np.where(has, np.asarray(keys[1][::-1], dtype=np.int64), now_key[0])
        kn = np.where(has, np.asarray(keys[2][::-1], dtype=np.int64), now_key[1])
        refs = view(self.ref[group])
        r = refs[ids] - 1
        refs[ids] = r
        alive, rel = r > 0, self._released
        on, rt, rn = view(rel.on[group]), view(rel.t[group]), view(rel.n[group])
        keep = alive & has
        if keep.any():  # ``put_default``: a recorded key is newer
            fresh = keep & (on[ids] == 0)
            sel = ids[fresh]
            on[sel] = 1
            rt[sel], rn[sel] = kt[fresh], kn[fresh]
            rel.count += len(sel)
        dead = ~alive
        ids, kt, kn = ids[dead], kt[dead], kn[dead]
        if rel.count and len(ids):
            recorded = on[ids] == 1
            if recorded.any():
                sel = ids[recorded]
                kt[recorded], kn[recorded] = rt[sel], rn[sel]
                on[sel] = 0
                rel.count -= len(sel)
        if not len(ids):
            return
        times, first = np.unique(kt, return_index=True)
        for t in times[np.argsort(first)].tolist():  # batches in order of first appearance
            mine = kt == t
            batch_ids, batch_negs = batches.setdefault((group, t), ([], []))
            batch_ids.extend(ids[mine].tolist())
            batch_negs.extend(kn[mine].tolist())
