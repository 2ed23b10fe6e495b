"""How the manager's pages change hands: fresh pages in, references held and dropped,
registered pages handed to the evictor at zero references, unregistered ones freed.

``PageLedger`` implements the ``PageOps`` the policies call; ``KVCacheManager`` is one.
It works on the manager's allocator, index, evictor and per-group reference counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import compress

from jenga.prefix.policy import PageOps


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
        if self._recording is not None:  # a lookup: held later (``jenga.deferred_hold``)
            self._recording.append((group, list(pages)))
            return
        ref, log = self.ref[group], self._log
        if self.index.uses is not None:
            self.index.count_uses(group, pages)
        cached = [page for page in pages if ref[page] == 0]
        keys = self.evictor.touch_many(group, cached) if cached else []
        if len(cached) != len(pages):
            it = iter(keys)
            keys = [next(it) if ref[page] == 0 else None for page in pages]
        for page in pages:
            ref[page] += 1
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
                self._released_key[(group, page)] = (last_access, -prefix_len)
        else:
            if self._released_key:
                self._released_key.pop((group, page), None)
            if self.caching and self.index.is_registered(group, page):
                self.evictor.add(group, page, last_access, prefix_len)
            else:
                if self.index.is_registered(group, page):
                    self.index.drop(group, page)
                self.alloc.release(group, page)

    def drop_run(self, group: int, pages: list[int | None], start: int, stop: int, last_access: int,
                 tokens_per_page: int) -> None:
        """``drop`` for ``pages[start:stop]`` (page ``i`` ends at token ``(i+1) * tokens_per_page``),
        setting them to None; one pass, cached pages handed to the evictor together."""
        ref, key_of, caching = self.ref[group], self.index.key_of[group], self.caching
        released = self._released_key
        to_cache: list[tuple[int, int]] = []
        to_free: list[int] = []
        seg = pages[start:stop]
        pages[start:stop] = [None] * len(seg)
        if caching and not released and seg and None not in seg \
                and list(map(ref.__getitem__, seg)).count(1) == len(seg):
            # the common free: every page's last reference; registered ones go to the evictor
            for page in seg:
                ref[page] = 0
            negs = range(-(start + 1) * tokens_per_page, -(stop + 1) * tokens_per_page, -tokens_per_page)
            reg = list(map(key_of.__contains__, seg))
            if reg.count(True) == len(seg):
                self.evictor.add_run(group, seg, negs, last_access)
                return
            self.evictor.add_run(group, list(compress(seg, reg)), list(compress(negs, reg)), last_access)
            release = self.alloc.release
            for page, r in zip(seg, reg, strict=True):
                if not r:
                    release(group, page)
            return
        for i, page in enumerate(seg, start):
            if page is None:
                continue
            r = ref[page] - 1
            assert r >= 0, f"drop of unreferenced page {group}:{page}"
            ref[page] = r
            if r:
                if caching:
                    released[(group, page)] = (last_access, -(i + 1) * tokens_per_page)
                continue
            if released:
                released.pop((group, page), None)
            if page in key_of:
                if caching:
                    to_cache.append((page, (i + 1) * tokens_per_page))
                    continue
                self.index.drop(group, page)
            to_free.append(page)
        if to_cache:
            self.evictor.add_many(group, to_cache, last_access)
        release = self.alloc.release
        for page in to_free:
            release(group, page)

    def take_run(self, group: int, n: int) -> list[int]:
        """``n`` fresh pages of ``group`` (``take`` in a loop, own large pages in bulk)."""
        pages, carved = self.alloc.allocate_many(group, self._tag, n, self._quota[group], self._shared[group])
        self._quota[group] -= carved
        ref = self.ref[group]
        for page in pages:
            ref[page] = 1
        return pages

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
        batches: dict[tuple[int, int], list[tuple[int, int]]] = {}
        released = self._released_key
        now_key = (self.now, 0)
        for group, page, key in reversed(list(log)):
            ref = self.ref[group]
            if type(page) is list:  # a run from hold_run: (group, pages, keys)
                self._unhold_run(group, page, key, batches, now_key)
                continue
            ref[page] -= 1
            if ref[page] > 0:
                if key is not None:
                    released.setdefault((group, page), key)  # a recorded key is newer
                continue
            key = released.pop((group, page), None) or key or now_key
            batches.setdefault((group, key[0]), []).append((page, -key[1]))  # key is (t, -prefix_len)
        for (group, t), pages in batches.items():
            self.evictor.add_many(group, pages, t)

    def _unhold_run(self, group: int, pages: list[int], keys: list, batches: dict, now_key: tuple[int, int]) -> None:
        """The per-page rule of ``_unhold`` for one ``hold_run`` entry, last page first."""
        ref, released = self.ref[group], self._released_key
        last_t, batch = None, None
        for i in range(len(pages) - 1, -1, -1):
            page, key = pages[i], keys[i]
            r = ref[page] = ref[page] - 1
            if r > 0:
                if key is not None:
                    released.setdefault((group, page), key)
                continue
            if released:
                key = released.pop((group, page), None) or key
            key = key or now_key
            t = key[0]
            if t != last_t:
                batch = batches.setdefault((group, t), [])
                last_t = t
            batch.append((page, -key[1]))
