"""The prefix index: which cached page holds which block hash, per group."""

from __future__ import annotations

import struct
from itertools import compress, repeat

import numpy as np

from jenga.flat_arrays import BULK, int64s, view, zeros


class PrefixIndex:
    """``(group, key) -> page`` and back.  A page is *registered* while it is in the index.

    Registered pages may be USED (live requests share them) or CACHED (evictable).
    """

    def __init__(self, num_groups: int):
        self.table: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        self.key_of: list[dict[int, bytes]] = [{} for _ in range(num_groups)]
        self.events = None  # a ``jenga.events.EventLog`` told of every change, when enabled
        # per group: key -> times its content was computed or hit, kept after eviction
        # (at most ``USES_KEPT`` keys, the oldest first out); None = not tracked
        self.uses: list[dict[bytes, int]] | None = None
        # per group and registered page: its key's use count (for bulk reads; the newer one where
        # ``stale``: bulk counts of hits change only this, ``uses`` takes it when the page leaves)
        self.page_uses: list | None = None
        # per group and registered page: 1 while ``uses`` holds an older count than ``page_uses``
        self.stale: list[bytearray] | None = None
        # per group and page: 1 while registered (``key_of`` as flags, for bulk reads); None = not kept
        self.flags: list[bytearray] | None = None

    USES_KEPT = 1 << 20

    def track_uses(self, num_pages: list[int]) -> None:
        """Count uses from now on (``num_pages``: each group's page count)."""
        if self.uses is None:
            self.uses = [{} for _ in self.table]
            self.page_uses = [zeros(n) for n in num_pages]
            self.stale = [bytearray(n) for n in num_pages]

    def track_pages(self, num_pages: list[int]) -> None:
        """Keep ``flags`` from now on (``num_pages``: each group's page count; call while empty)."""
        assert not len(self), "track_pages on a non-empty index"
        self.flags = [bytearray(n) for n in num_pages]

    def uses_of(self, group: int, page: int) -> int:
        key = self.key_of[group][page]
        return self.page_uses[group][page] if self.stale[group][page] else self.uses[group].get(key, 0)

    def counts(self, group: int) -> dict[bytes, int]:
        """A copy of ``uses`` with every count current (the stale ones from ``page_uses``)."""
        out, page_uses, stale = dict(self.uses[group]), self.page_uses[group], self.stale[group]
        for page, key in self.key_of[group].items():
            if stale[page]:
                assert key in out and page_uses[page] > 0, f"group {group}: a stale count of an uncounted key"
                out[key] = page_uses[page]
        return out

    def count_use(self, group: int, page: int) -> None:
        """A live request reuses registered ``page`` (a prefix hit)."""
        uses, key = self.uses[group], self.key_of[group][page]
        uses[key] = self.page_uses[group][page] = self.page_uses[group][page] + 1
        self.stale[group][page] = 0

    def count_uses(self, group: int, pages: list[int]) -> None:
        """``count_use`` for each of ``pages`` (distinct).  A long run in numpy: the counts
        change in ``page_uses`` only and the pages turn ``stale`` (``uses`` takes their counts
        when they leave the index; a counted key keeps its place there either way); keys not
        counted (dropped by ``USES_KEPT``) enter ``uses`` in page order, as one at a time."""
        uses, key_of, page_uses = self.uses[group], self.key_of[group], self.page_uses[group]
        if len(pages) > BULK:
            ids = int64s(pages)
            counts = view(page_uses)[ids] + 1
            view(page_uses)[ids] = counts
            fresh = counts == 1
            if fresh.any():
                uses.update(zip(map(key_of.__getitem__, compress(pages, fresh.tolist())), repeat(1)))
                ids = ids[~fresh]
            view(self.stale[group])[ids] = 1
            return
        stale = self.stale[group]
        for page in pages:
            uses[key_of[page]] = page_uses[page] = page_uses[page] + 1
            stale[page] = 0

    def uncount_use(self, group: int, page: int) -> None:
        """Take back ``count_use`` (the hold did not become a use)."""
        uses, key = self.uses[group], self.key_of[group][page]
        n = self.page_uses[group][page] - 1
        if n > 0:
            uses[key] = n
        else:
            uses.pop(key, None)
        self.page_uses[group][page] = max(n, 0)
        self.stale[group][page] = 0

    def uncount_uses(self, group: int, pages: list[int]) -> None:
        """``uncount_use`` for each of ``pages`` (distinct; a long run in numpy, as ``count_uses``)."""
        uses, key_of, page_uses = self.uses[group], self.key_of[group], self.page_uses[group]
        if len(pages) > BULK:
            ids = int64s(pages)
            counts = view(page_uses)[ids] - 1
            gone = counts <= 0
            if gone.any():  # counts down to 0: the keys leave ``uses``
                for key in map(key_of.__getitem__, compress(pages, gone.tolist())):
                    uses.pop(key, None)
                counts[gone] = 0
                view(self.stale[group])[ids[gone]] = 0
                view(self.stale[group])[ids[~gone]] = 1
            else:
                view(self.stale[group])[ids] = 1
            view(page_uses)[ids] = counts
            return
        for page in pages:
            self.uncount_use(group, page)

    def get(self, group: int, key: bytes) -> int | None:
        return self.table[group].get(key)

    def register(self, group: int, page: int, key: bytes) -> bool:
        """Record that ``page`` holds ``key``.  Returns False (and changes nothing) when
        another page already holds that key or the page is already registered."""
        table = self.table[group]
        if key in table or page in self.key_of[group]:
            if self.uses is not None and key in table:
                self._use_again(group, key)  # computed again
            return False
        table[key] = page
        self.key_of[group][page] = key
        if self.flags is not None:
            self.flags[group][page] = 1
        if self.events is not None:
            self.events.stored(group, key)
        if self.uses is not None:
            self._first_use(group, page, key)
        return True

    def _use_again(self, group: int, key: bytes) -> None:
        """Registered ``key`` was computed again (by a page that is not registered)."""
        uses, page_uses, holder = self.uses[group], self.page_uses[group], self.table[group][key]
        uses[key] = page_uses[holder] = page_uses[holder] + 1
        self.stale[group][holder] = 0

    def _first_use(self, group: int, page: int, key: bytes) -> None:
        """``page`` was just registered with ``key``: count the use (the newest key of ``uses``)."""
        uses = self.uses[group]
        uses[key] = self.page_uses[group][page] = uses.pop(key, 0) + 1
        if len(uses) > self.USES_KEPT:
            self._drop_oldest_use(group)

    def _drop_oldest_use(self, group: int) -> None:
        uses = self.uses[group]
        old = next(iter(uses))
        del uses[old]
        holder = self.table[group].get(old)
        if holder is not None:
            self.page_uses[group][holder] = 0
            self.stale[group][holder] = 0

    def register_many(self, group: int, pages: list[int | None], keys: list[bytes]) -> None:
        """``register`` each (page, key) pair in order; ``None`` pages are skipped."""
        table, key_of, events = self.table[group], self.key_of[group], self.events
        if len(pages) > 8 and len(keys) == len(pages) and events is None and self._fresh_run(group, pages, keys):
            return
        counting = self.uses is not None
        if counting:
            uses, page_uses, kept = self.uses[group], self.page_uses[group], self.USES_KEPT
        for page, key in zip(pages, keys, strict=True):
            if page is None:
                continue
            if key in table or page in key_of:
                if counting and key in table:
                    self._use_again(group, key)
                continue
            table[key] = page
            key_of[page] = key
            if self.flags is not None:
                self.flags[group][page] = 1
            if events is not None:
                events.stored(group, key)
            if counting:
                uses[key] = page_uses[page] = uses.pop(key, 0) + 1  # re-inserted: the newest key
                if len(uses) > kept:
                    self._drop_oldest_use(group)

    def _fresh_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> bool:
        """The common case, a run of fresh pages with new keys: each dict updated in one call,
        the flags and page counts in one numpy pass.  False (nothing changed) otherwise."""
        table, key_of, flags = self.table[group], self.key_of[group], self.flags
        if flags is None:
            if None in pages or any(map(key_of.__contains__, pages)) or not self._insert_fresh(table, keys, pages):
                return False
            key_of.update(zip(pages, keys, strict=True))
            if self.uses is not None:
                self._count_first_uses(group, keys, int64s(pages))
            return True
        try:
            ids = int64s(pages)
        except struct.error:  # a None
            return False
        registered = view(flags[group])
        if registered[ids].any() or not self._insert_fresh(table, keys, pages):
            return False
        key_of.update(zip(pages, keys, strict=True))
        registered[ids] = 1
        if self.uses is not None:
            self._count_first_uses(group, keys, ids)
        return True

    @staticmethod
    def _insert_fresh(table: dict[bytes, int], keys: list[bytes], pages: list[int]) -> bool:
        """Insert every (key, page) when no key is in ``table`` and the keys are distinct (one
        probe per key: ``setdefault``); else change nothing and return False.  The caller made
        sure no page is registered, so a key already in ``table`` never maps to its own page."""
        n = len(table)
        got = list(map(table.setdefault, keys, pages))
        if len(table) - n == len(keys):
            return True
        for key, page, was in zip(keys, pages, got, strict=True):
            if was == page:  # inserted here: taken out again (a repeated key: once)
                table.pop(key, None)
        return False

    def _count_first_uses(self, group: int, keys: list[bytes], ids: np.ndarray) -> None:
        """The uses of freshly registered ``keys`` (of pages ``ids``): each re-inserted into
        ``uses`` as the newest, one use more (``_first_use`` for each, in order).  Keys never
        counted before (the usual case: ``uses`` has none of them) enter in order with 1."""
        uses = self.uses[group]
        if not uses.keys().isdisjoint(keys):  # some were counted before (maybe evicted since): pop, re-insert all
            counts = np.fromiter(map(uses.pop, keys, repeat(0)), dtype=np.int64, count=len(keys)) + 1
            uses.update(zip(keys, counts.tolist(), strict=True))
            view(self.page_uses[group])[ids] = counts
        else:
            uses.update(zip(keys, repeat(1)))
            view(self.page_uses[group])[ids] = 1
        while len(uses) > self.USES_KEPT:
            self._drop_oldest_use(group)

    def is_registered(self, group: int, page: int) -> bool:
        return page in self.key_of[group]

    def drop(self, group: int, page: int) -> None:
        key = self.key_of[group].pop(page)
        del self.table[group][key]
        if self.stale is not None and self.stale[group][page]:  # the newer count goes to ``uses``
            self.uses[group][key] = self.page_uses[group][page]
            self.stale[group][page] = 0
        if self.flags is not None:
            self.flags[group][page] = 0
        if self.events is not None:
            self.events.removed(group, key)

    def drop_many(self, group: int, pages: list[int]) -> None:
        """``drop`` each of ``pages``."""
        key_of, table, events = self.key_of[group], self.table[group], self.events
        flags = self.flags[group] if self.flags is not None else None
        stale = self.stale[group] if self.stale is not None else None
        for page in pages:
            key = key_of.pop(page)
            del table[key]
            if stale is not None and stale[page]:  # the newer count goes to ``uses``
                self.uses[group][key] = self.page_uses[group][page]
                stale[page] = 0
            if flags is not None:
                flags[page] = 0
            if events is not None:
                events.removed(group, key)

    def unregister(self, group: int, page: int) -> None:
        """A page registered before it was written leaves the index unwritten (its fill was
        aborted): it never counted as a use."""
        if self.uses is not None:
            self.uncount_use(group, page)
        self.drop(group, page)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table)
