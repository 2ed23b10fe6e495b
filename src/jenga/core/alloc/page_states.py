"""What the allocator and the evictor tell each other: page states, the supply an allocation may
draw on, and the evictor's interface (implemented by ``jenga.core.evict.evictor``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

FREE, USED, CACHED = 0, 1, 2


class EvictionSource(ABC):
    """What the allocator asks of the evictor (implemented by ``jenga.core.evict.evictor``)."""

    @abstractmethod
    def evict_large(self, group: int | None = None) -> int | None:
        """Evict every cached page of the fully evictable large page with the smallest key
        (of ``group`` only, when given).

        Changes: the pages become FREE (through ``LargePageAllocator.evict_cached``), so
        the large page returns to the pool.  Returns its id, or ``None`` if ``E`` is empty.
        """

    def evict_large_many(self, m: int) -> list[int]:
        """``evict_large()`` up to ``m`` times; the freed large page ids in order."""
        out = []
        while len(out) < m and (large := self.evict_large()) is not None:
            out.append(large)
        return out

    @abstractmethod
    def evict_small(self, group: int) -> int | None:
        """Evict the cached page of ``group`` with the smallest key outside ``E``.

        Returns the now-FREE small page id, or ``None`` when there is none.
        """

    @abstractmethod
    def on_evictable(self, large: int) -> None:
        """``large`` entered ``E``."""

    def on_evictable_many(self, group: int, larges: list[int]) -> None:
        """Each of ``larges`` (of ``group``) entered ``E``."""
        for large in larges:
            self.on_evictable(large)

    def on_unevictable_many(self, group: int, larges: list[int]) -> None:
        """Each of ``larges`` (of ``group``) left ``E``."""
        for large in larges:
            self.on_unevictable(large)

    @abstractmethod
    def on_unevictable(self, large: int) -> None:
        """``large`` left ``E`` (a page was touched, or it was evicted / emptied)."""


class PageViews(NamedTuple):
    """The allocator's per-page arrays its evictor reads in place (read only: only the allocator
    writes them).  The evictor's heaps check, per entry, that a page is still CACHED and a large
    page still in ``E``; a call per check would cost more than the check."""

    state: list[bytearray]  # per group, per small page: FREE / USED / CACHED
    in_e: bytearray  # per large page: 1 while in E (fully evictable)
    group_of: list[int]  # per large page: the group it is carved for, -1 while free
    n_cached: object  # per large page: its CACHED small pages (an ``array('q')``)


class Supply(NamedTuple):
    """Pages an allocation may draw on without breaking a whole large page."""

    free_small: tuple[int, ...]  # per group: free slots outside E
    cached_small: tuple[int, ...]  # per group: cached pages outside E
    whole_large: int  # free large pages + fully evictable large pages
