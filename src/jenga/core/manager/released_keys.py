"""The evictor key of the latest release of each page still held by others, in flat per-group
arrays: when a pin (a lookup hit) is undone after those others have left, the page gets that
key back (``jenga.core.manager.ledger``).  One set of arrays instead of a dict of ``(group, page)`` tuples,
so a free of a shared run records its keys in one numpy pass."""

from __future__ import annotations

import numpy as np

from jenga.core.flat_arrays import view, zeros

Key = tuple[int, int]  # (release time, -prefix length)


class ReleasedKeys:
    """Per group and page: a recorded key or none (module doc)."""

    __slots__ = ("t", "n", "on", "count")

    def __init__(self, sizes: list[int]):
        self.t = [zeros(s) for s in sizes]
        self.n = [zeros(s) for s in sizes]
        self.on = [bytearray(s) for s in sizes]
        self.count = 0  # pages with a recorded key

    def __bool__(self) -> bool:
        return self.count > 0

    def get(self, group: int, page: int) -> Key | None:
        return (self.t[group][page], self.n[group][page]) if self.on[group][page] else None

    def put(self, group: int, page: int, key: Key) -> None:
        """Record ``key`` (replacing an older one)."""
        on = self.on[group]
        if not on[page]:
            on[page] = 1
            self.count += 1
        self.t[group][page], self.n[group][page] = key

    def put_default(self, group: int, page: int, key: Key) -> None:
        """Record ``key`` unless one is recorded (a recorded key is newer)."""
        if not self.on[group][page]:
            self.put(group, page, key)

    def pop(self, group: int, page: int) -> Key | None:
        """The recorded key (forgotten now), or None."""
        on = self.on[group]
        if not on[page]:
            return None
        on[page] = 0
        self.count -= 1
        return self.t[group][page], self.n[group][page]

    def forget_many(self, group: int, pages: np.ndarray) -> None:
        """Forget the keys recorded for distinct ``pages``."""
        if self.count:
            on = view(self.on[group])
            self.count -= int(np.count_nonzero(on[pages]))
            on[pages] = 0

    def update_many(self, group: int, pages: np.ndarray, held: np.ndarray, t: int, negs: np.ndarray) -> None:
        """After distinct ``pages`` were dropped: ``put`` ``(t, negs[i])`` where ``held[i]`` (others
        still hold the page), forget the key of the rest (their last reference went)."""
        on = view(self.on[group])
        keep = held.view(np.uint8)
        self.count += int(np.count_nonzero(keep)) - int(np.count_nonzero(on[pages]))
        on[pages] = keep
        mine = pages[held]
        view(self.t[group])[mine] = t
        view(self.n[group])[mine] = negs[held]
