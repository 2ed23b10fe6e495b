"""``EvictionListener``: told of the cached pages an evictor is about to drop (the host tier)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class EvictionListener(ABC):
    """What an evictor tells the part that keeps evicted content elsewhere (a second tier)."""

    @abstractmethod
    def evicting(self, evictor, group: int, pages: list[int]) -> None:
        """``pages`` (CACHED pages of ``group``) are about to be evicted by ``evictor`` (the
        :class:`~jenga.core.evict.evictor.PrefixEvictor` this listener was handed to at its
        construction).

        Called before they leave the index and the evictor's order: each is still registered
        under its key and still has its evictor key.  It must not change the evictor, the index
        or the allocator it is called from."""
