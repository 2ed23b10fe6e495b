"""The prefix index: which cached page holds which block hash, per group."""

from __future__ import annotations


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

    USES_KEPT = 1 << 20

    def track_uses(self) -> None:
        if self.uses is None:
            self.uses = [{} for _ in self.table]

    def uses_of(self, group: int, page: int) -> int:
        return self.uses[group].get(self.key_of[group][page], 0)

    def count_use(self, group: int, page: int) -> None:
        """A live request reuses registered ``page`` (a prefix hit)."""
        uses, key = self.uses[group], self.key_of[group][page]
        uses[key] = uses.get(key, 0) + 1

    def count_uses(self, group: int, pages: list[int]) -> None:
        """``count_use`` for each of ``pages``."""
        uses, key_of = self.uses[group], self.key_of[group]
        for page in pages:
            key = key_of[page]
            uses[key] = uses.get(key, 0) + 1

    def uncount_use(self, group: int, page: int) -> None:
        """Take back ``count_use`` (the hold did not become a use)."""
        uses, key = self.uses[group], self.key_of[group][page]
        n = uses.get(key, 0) - 1
        if n > 0:
            uses[key] = n
        else:
            uses.pop(key, None)

    def uncount_uses(self, group: int, pages: list[int]) -> None:
        """``uncount_use`` for each of ``pages``."""
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
                self.uses[group][key] = self.uses[group].get(key, 0) + 1  # computed again
            return False
        table[key] = page
        self.key_of[group][page] = key
        if self.events is not None:
            self.events.stored(group, key)
        if self.uses is not None:
            uses = self.uses[group]
            uses[key] = uses.pop(key, 0) + 1  # re-inserted: the newest key
            if len(uses) > self.USES_KEPT:
                del uses[next(iter(uses))]
        return True

    def register_many(self, group: int, pages: list[int | None], keys: list[bytes]) -> None:
        """``register`` each (page, key) pair in order; ``None`` pages are skipped."""
        table, key_of, events = self.table[group], self.key_of[group], self.events
        uses = self.uses[group] if self.uses is not None else None
        kept = self.USES_KEPT
        for page, key in zip(pages, keys, strict=True):
            if page is None:
                continue
            if key in table or page in key_of:
                if uses is not None and key in table:
                    uses[key] = uses.get(key, 0) + 1  # computed again
                continue
            table[key] = page
            key_of[page] = key
            if events is not None:
                events.stored(group, key)
            if uses is not None:
                uses[key] = uses.pop(key, 0) + 1  # re-inserted: the newest key
                if len(uses) > kept:
                    del uses[next(iter(uses))]

    def is_registered(self, group: int, page: int) -> bool:
        return page in self.key_of[group]

    def drop(self, group: int, page: int) -> None:
        key = self.key_of[group].pop(page)
        del self.table[group][key]
        if self.events is not None:
            self.events.removed(group, key)

    def unregister(self, group: int, page: int) -> None:
        """A page registered before it was written leaves the index unwritten (its fill was
        aborted): it never counted as a use."""
        if self.uses is not None:
            self.uncount_use(group, page)
        self.drop(group, page)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table)
