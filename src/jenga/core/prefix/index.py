"""The prefix index: which cached page holds which block hash, per group."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from itertools import compress, repeat

import numpy as np

from jenga.core.flat_arrays import BULK, as_ids, int64s, view, zeros


class PageKeys(Mapping):
    """A group's ``page -> key`` for its registered pages, read-only, in page order, over the
    index's flat arrays (a key per page in an object array, a registered flag per page)."""

    def __init__(self, keys: np.ndarray, flags: bytearray):
        self._keys, self._flags = keys, flags

    def __contains__(self, page: object) -> bool:
        return type(page) is int and 0 <= page < len(self._flags) and self._flags[page] == 1

    def __getitem__(self, page: int) -> bytes:
        if page not in self:
            raise KeyError(page)
        return self._keys[page]

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(view(self._flags)).tolist())

    def __len__(self) -> int:
        return self._flags.count(1)


class PrefixIndex:
    """``(group, key) -> page`` and back.  A page is *registered* while it is in the index.

    Registered pages may be USED (live requests share them) or CACHED (evictable).  One key,
    one page: a page computed again under a key that another page holds is refused, except
    when the holder is only CACHED (``held`` given to ``register_many``, read by the caller
    for ``register``).  Then the live page takes the key over: the caller evicts the cached
    duplicate first (its key leaves, a removed event, its use count kept in ``uses``) and
    registers the live page (a stored event, the count one more).  Else a request that
    recomputed a prefix whose cached copy was evicted later would hold pages the index no
    longer finds (a group's hit can be 0 while another group still caches the prefix).
    """

    def __init__(self, num_groups: int):
        self.table: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        # one more at every call that may change a table (register, drop and their batch forms):
        # a reader that saw the same version reads the same tables (a scheduler's repeated probe)
        self.version = 0
        self.events = None  # a ``jenga.core.prefix.events.EventLog`` told of every change, when enabled
        # Use counts (times a key's content was computed or hit), None = not tracked: a
        # registered key's in ``page_uses`` (per group and page; 0 = not counted, and 0 on
        # every unregistered page), a key no longer registered in ``uses`` (per group: key ->
        # count, kept after eviction; at most ``USES_KEPT`` keys, the longest gone first out).
        # So registering a fresh page costs no dict insert; its key enters ``uses`` when it leaves.
        self.uses: list[dict[bytes, int]] | None = None
        self.page_uses: list | None = None
        # per group and page: 1 while registered; and its key (an object array, None while not)
        self.flags: list[bytearray] = []
        self.keys: list[np.ndarray] = []
        self.key_of: list[PageKeys] = []  # per group: ``page -> key`` of registered pages (read-only)

    USES_KEPT = 1 << 20

    def track_uses(self, num_pages: list[int]) -> None:
        """Count uses from now on (``num_pages``: each group's page count)."""
        if self.uses is None:
            self.uses = [{} for _ in self.table]
            self.page_uses = [zeros(n) for n in num_pages]

    def track_pages(self, num_pages: list[int]) -> None:
        """Size the per-page arrays (``num_pages``: each group's page count; before any register)."""
        assert not len(self), "track_pages on a non-empty index"
        self.flags = [bytearray(n) for n in num_pages]
        self.keys = [np.full(n, None, dtype=object) for n in num_pages]
        self.key_of = [PageKeys(k, f) for k, f in zip(self.keys, self.flags, strict=True)]

    def uses_of(self, group: int, page: int) -> int:
        """The use count of registered ``page``'s key."""
        assert self.flags[group][page], f"uses_of unregistered page {group}:{page}"
        return self.page_uses[group][page]

    def seen(self, group: int, key: bytes) -> bool:
        """Whether ``key``'s content was computed or hit before (a use count, kept after eviction)."""
        page = self.table[group].get(key)
        return key in self.uses[group] if page is None else self.page_uses[group][page] > 0

    def counts(self, group: int) -> dict[bytes, int]:
        """Every key's use count (those of keys gone first, then the registered ones)."""
        out, page_uses = dict(self.uses[group]), self.page_uses[group]
        for page, key in self.key_of[group].items():
            assert key not in out, f"group {group}: a registered key also counted as gone"
            if page_uses[page]:
                out[key] = page_uses[page]
        return out

    def check_uses(self, group: int) -> None:
        """Assert the keys of ``uses`` are not registered and unregistered pages count 0."""
        table, page_uses = self.table[group], self.page_uses[group]
        assert table.keys().isdisjoint(self.uses[group]), f"group {group}: a registered key in uses"
        assert not view(page_uses)[view(self.flags[group]) == 0].any(), \
            f"group {group}: a use count on an unregistered page"
        assert all(n > 0 for n in self.uses[group].values()), f"group {group}: a count of 0 kept"

    def count_use(self, group: int, page: int) -> None:
        """A live request reuses registered ``page`` (a prefix hit)."""
        self.page_uses[group][page] += 1

    def count_use_many(self, group: int, pages: list[int]) -> None:
        """``count_use`` for each of ``pages`` (distinct; a long run in numpy)."""
        page_uses = self.page_uses[group]
        if len(pages) > BULK:
            view(page_uses)[int64s(pages)] += 1
            return
        for page in pages:
            page_uses[page] += 1

    def uncount_use(self, group: int, page: int) -> None:
        """Take back ``count_use`` (the hold did not become a use); never below 0."""
        page_uses = self.page_uses[group]
        if page_uses[page] > 0:
            page_uses[page] -= 1

    def uncount_use_many(self, group: int, pages: list[int]) -> None:
        """``uncount_use`` for each of ``pages`` (distinct; a long run in numpy)."""
        page_uses = self.page_uses[group]
        if len(pages) > BULK:
            ids = int64s(pages)
            counts = view(page_uses)[ids]
            view(page_uses)[ids] = np.maximum(counts - 1, 0)
            return
        for page in pages:
            if page_uses[page] > 0:
                page_uses[page] -= 1

    def get(self, group: int, key: bytes) -> int | None:
        return self.table[group].get(key)

    def register(self, group: int, page: int, key: bytes) -> bool:
        """Record that ``page`` holds ``key``.  Returns False (and changes nothing) when
        another page already holds that key or the page is already registered."""
        self.version += 1
        table, flags = self.table[group], self.flags[group]
        if key in table or flags[page]:
            if self.uses is not None and key in table:
                self.page_uses[group][table[key]] += 1  # computed again
            return False
        table[key] = page
        self.keys[group][page] = key
        flags[page] = 1
        if self.events is not None:
            self.events.stored(group, key)
        if self.uses is not None:
            self.page_uses[group][page] = self.uses[group].pop(key, 0) + 1
        return True

    def _gone(self, group: int, key: bytes, n: int) -> None:
        """``key`` (use count ``n`` > 0) left the index: remembered in ``uses``, the newest."""
        uses = self.uses[group]
        uses[key] = n
        if len(uses) > self.USES_KEPT:
            del uses[next(iter(uses))]  # the longest gone

    def register_many(self, group: int, pages: list[int | None], keys: list[bytes], held=None) -> list:
        """``register`` each (page, key) pair in order; ``None`` pages are skipped.  With
        ``held`` (per page: references), a pair whose key another page holds while
        ``held[that page] == 0`` (CACHED) is neither registered nor counted but returned, in
        order: the caller evicts that page and registers the pair (class doc)."""
        self.version += 1
        if len(pages) > 8 and len(keys) == len(pages) and self.events is None and self._fresh_run(group, pages, keys):
            return []
        taken: list = []
        table, flags, page_keys, events = self.table[group], self.flags[group], self.keys[group], self.events
        counting = self.uses is not None
        if counting:
            uses, page_uses = self.uses[group], self.page_uses[group]
        for page, key in zip(pages, keys, strict=True):
            if page is None:
                continue
            if key in table or flags[page]:
                if key in table and not flags[page] and held is not None and not held[table[key]]:
                    taken.append((page, key))  # its holder is only cached: taken over
                elif counting and key in table:
                    page_uses[table[key]] += 1  # computed again
                continue
            table[key] = page
            page_keys[page] = key
            flags[page] = 1
            if events is not None:
                events.stored(group, key)
            if counting:
                page_uses[page] = uses.pop(key, 0) + 1
        return taken

    def _fresh_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> bool:
        """The common case, a run of fresh pages with new keys: the table updated in one call,
        the flags, keys and page counts in one numpy pass each.  False (nothing changed) otherwise."""
        try:
            ids = int64s(pages)
        except struct.error:  # a None
            return False
        registered = view(self.flags[group])
        if registered[ids].any() or not self._insert_fresh(self.table[group], keys, pages):
            return False
        self.keys[group][ids] = keys
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
        """The uses of freshly registered ``keys`` (of pages ``ids``): one more than each had
        when it left the index (it leaves ``uses``), else 1 (the usual case: one probe each, or
        none while ``uses`` is empty)."""
        uses = self.uses[group]
        if uses and not uses.keys().isdisjoint(keys):  # some were counted before (evicted since)
            view(self.page_uses[group])[ids] = np.fromiter(map(uses.pop, keys, repeat(0)), dtype=np.int64,
                                                           count=len(keys)) + 1
        else:
            view(self.page_uses[group])[ids] = 1

    def is_registered(self, group: int, page: int) -> bool:
        return self.flags[group][page] == 1

    def drop(self, group: int, page: int) -> None:
        self.version += 1
        flags = self.flags[group]
        assert flags[page], f"drop of unregistered page {group}:{page}"
        key = self.keys[group][page]
        del self.table[group][key]
        flags[page] = 0
        self.keys[group][page] = None
        if self.uses is not None:
            page_uses = self.page_uses[group]
            if page_uses[page]:
                self._gone(group, key, page_uses[page])
                page_uses[page] = 0
        if self.events is not None:
            self.events.removed(group, key)

    def drop_many(self, group: int, pages) -> None:
        """``drop`` each of ``pages`` (distinct; a list or an int array; a long run in one numpy
        pass each for the flags, keys and counts)."""
        self.version += 1
        if len(pages) <= BULK:
            for page in pages:
                self.drop(group, page)
            return
        ids = as_ids(pages)
        registered = view(self.flags[group])
        assert registered[ids].all(), f"drop of unregistered pages of group {group}"
        page_keys = self.keys[group]
        keys = page_keys[ids].tolist()
        table = self.table[group]
        for key in keys:
            del table[key]
        registered[ids] = 0
        page_keys[ids] = None
        if self.uses is not None:
            page_uses = view(self.page_uses[group])
            counts = page_uses[ids]
            counted = counts > 0
            if counted.any():  # ``_gone`` for each, in order; the longest gone trimmed after
                uses = self.uses[group]
                uses.update(zip(compress(keys, counted.tolist()), counts[counted].tolist(), strict=True))
                page_uses[ids] = 0
                while len(uses) > self.USES_KEPT:
                    del uses[next(iter(uses))]
        if self.events is not None:
            for key in keys:
                self.events.removed(group, key)

    def unregister(self, group: int, page: int) -> None:
        """A page registered before it was written leaves the index unwritten (its fill was
        aborted): it never counted as a use."""
        if self.uses is not None:
            self.uncount_use(group, page)
        self.drop(group, page)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table)
