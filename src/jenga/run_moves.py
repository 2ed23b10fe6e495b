"""The allocator's page moves for a run of pages at once, with numpy over its flat arrays:
USED -> CACHED (a free), CACHED -> USED (a hit), whole one-page large pages evicted or carved.
Each does what the per-page loop in :class:`jenga.allocator.LargePageAllocator` does, in one
pass; used for runs longer than ``jenga.flat_arrays.BULK``.  A mixin of that class."""

from __future__ import annotations

import numpy as np

from jenga.eviction_source import CACHED, USED
from jenga.flat_arrays import unique_counts, view


class RunMoves:
    """Bulk page moves (module doc)."""

    def _to_cached_bulk(self, group: int, pages: np.ndarray) -> None:
        """``to_cached_many`` with numpy over distinct ``pages``."""
        state, k = view(self.state[group]), self.k[group]
        assert (state[pages] == USED).all(), f"cache of group {group} pages not all USED"
        state[pages] = CACHED
        if k == 1:  # each page its own large page: one used page becomes one cached page
            larges = pages
            view(self.n_used)[larges] = 0
            view(self.n_cached)[larges] = 1
        else:
            larges, counts = unique_counts(pages // k)
            view(self.n_used)[larges] -= counts
            view(self.n_cached)[larges] += counts
        self.used_small[group] -= len(pages)
        self.cached_small[group] += len(pages)
        emptied = larges if k == 1 else larges[view(self.n_used)[larges] == 0]
        if len(emptied):
            self._enter_e_many(group, emptied)

    def _touch_cached_bulk(self, group: int, pages: np.ndarray) -> None:
        """``touch_cached_many`` with numpy."""
        state, k = view(self.state[group]), self.k[group]
        assert (state[pages] == CACHED).all(), f"touch of group {group} pages not all CACHED"
        larges, counts = (pages, 1) if k == 1 else unique_counts(pages // k)
        in_e = view(self.in_e)
        leaving = larges[in_e[larges] == 1]
        if len(leaving):
            in_e[leaving] = 0
            self._left_e(group, leaving.tolist())
        state[pages] = USED
        view(self.n_cached)[larges] -= counts
        view(self.n_used)[larges] += counts
        self.used_small[group] += len(pages)
        self.cached_small[group] -= len(pages)

    def evict_whole_many(self, group: int, larges: np.ndarray) -> None:
        """``evict_whole`` for distinct ``larges`` of ``group``."""
        assert (view(self.in_e)[larges] == 1).all() and not view(self.n_used)[larges].any(), "not fully evictable"
        m, k = len(larges), self.k[group]
        ids = larges.tolist()
        view(self.in_e)[larges] = 0
        self.num_e -= m
        self.e_count[group] -= m
        if k == 1:  # a cached page fills its large page: no hidden free slot
            view(self.state[group])[larges] = 0  # FREE
        else:
            hidden = self._hidden
            for large in ids:
                hidden.pop(large, None)
            self.hidden_free[group] -= k * m - int(view(self.n_cached)[larges].sum())
            view(self.state[group])[(larges[:, None] * k + np.arange(k)).ravel()] = 0  # FREE
        view(self.n_cached)[larges] = 0
        self.owned[group] -= m
        group_of, tag_of = self.group_of, self.tag_of
        for large in ids:
            group_of[large] = -1
            tag_of[large] = None
        self._free_large.push_many(ids)

    def _carve_flat(self, group: int, larges: np.ndarray) -> None:
        """The page state of large pages ``larges`` just carved for ``group``: all pages USED."""
        state, k = view(self.state[group]), self.k[group]
        pages = larges if k == 1 else (larges[:, None] * k + np.arange(k)).ravel()
        assert not state[pages].any(), "large pages carved with pages in use"
        state[pages] = USED
        view(self.n_used)[larges] = k
