"""What the allocator and the evictor it owns share: page states, the per-page arrays (``PageViews``,
made first: the allocator writes them, the evictor reads them), the supply an allocation may draw
on, and the evictor's interface (implemented by ``jenga.core.evict.evictor``)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterator
from functools import reduce
from typing import NamedTuple

FREE, USED, CACHED = 0, 1, 2


class EvictionSource(ABC):
    """What the allocator asks of the evictor it owns (implemented by ``jenga.core.evict.evictor``).

    The evictor picks and forgets (keys, index entries); the allocator frees: each ``pick_*``
    returns what it picked, its pages' keys dropped and still CACHED, and the allocator makes them
    FREE before it asks again.  The evictor never calls the allocator (it reads ``PageViews``)."""

    @abstractmethod
    def pick_large(self, group: int | None = None) -> tuple[int, int] | None:
        """The fully evictable large page with the smallest key (of ``group`` only, when given),
        popped from its order, every cached page of it forgotten: ``(its group, it)`` for the
        allocator to free whole (``evict_whole_many``); ``None`` if ``E`` (of ``group``) is empty."""

    def pick_large_many(self, m: int, out: list[int]) -> Iterator[tuple[int, list[int]]]:
        """``pick_large()`` up to ``m`` times, in batches ``(group, larges)``, each freed by the
        allocator before the next is picked; ``out`` gets the large pages in order."""
        while len(out) < m and (picked := self.pick_large()) is not None:
            out.append(picked[1])
            yield picked[0], [picked[1]]

    @abstractmethod
    def pick_small(self, group: int) -> int | None:
        """The cached page of ``group`` with the smallest key outside ``E``, forgotten, for the
        allocator to free (``evict_cached``); ``None`` when there is none."""

    @abstractmethod
    def drop_many(self, group: int, pages: list[int]) -> None:
        """The distinct CACHED ``pages`` of ``group`` are evicted out of order: their keys and index
        entries go (the allocator frees them next)."""

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
    """The per-page arrays of one pool, made before its allocator and its evictor (``of``): the
    allocator writes them, the evictor reads them in place (read only).  The evictor's heaps check,
    per entry, that a page is still CACHED and a large page still in ``E``; a call per check would
    cost more than the check."""

    state: list[bytearray]  # per group, per small page: FREE / USED / CACHED
    in_e: bytearray  # per large page: 1 while in E (fully evictable)
    group_of: list[int]  # per large page: the group it is carved for, -1 while free
    n_cached: object  # per large page: its CACHED small pages (an ``array('q')``)
    small_per_large: list[int]  # per group: small pages per large page (``k_g``)
    page_bytes: list[int]  # per group: bytes of a small page

    @classmethod
    def of(cls, page_bytes: list[int], num_large: int) -> PageViews:
        """The arrays of a pool of ``num_large`` large pages carved into small pages of
        ``page_bytes`` (per group), every page FREE."""
        assert page_bytes and all(p > 0 for p in page_bytes), f"bad page sizes {page_bytes}"
        large = reduce(math.lcm, page_bytes)
        k = [large // p for p in page_bytes]
        return cls([bytearray(num_large * kg) for kg in k], bytearray(num_large), [-1] * num_large,
                   array("q", bytes(8 * num_large)), k, list(page_bytes))

    @property
    def num_large(self) -> int:
        return len(self.in_e)


class Supply(NamedTuple):
    """Pages an allocation may draw on without breaking a whole large page."""

    free_small: tuple[int, ...]  # per group: free slots outside E
    cached_small: tuple[int, ...]  # per group: cached pages outside E
    whole_large: int  # free large pages + fully evictable large pages
