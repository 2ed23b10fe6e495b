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

    def get(self, group: int, key: bytes) -> int | None:
        return self.table[group].get(key)

    def register(self, group: int, page: int, key: bytes) -> bool:
        """Record that ``page`` holds ``key``.  Returns False (and changes nothing) when
        another page already holds that key or the page is already registered."""
        table = self.table[group]
        if key in table or page in self.key_of[group]:
            return False
        table[key] = page
        self.key_of[group][page] = key
        if self.events is not None:
            self.events.stored(group, key)
        return True

    def is_registered(self, group: int, page: int) -> bool:
        return page in self.key_of[group]

    def drop(self, group: int, page: int) -> None:
        key = self.key_of[group].pop(page)
        del self.table[group][key]
        if self.events is not None:
            self.events.removed(group, key)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table)
