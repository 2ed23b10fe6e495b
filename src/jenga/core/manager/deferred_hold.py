"""A lookup's hit, held lazily: recorded by ``lookup``, held once anything could see or change it.

``lookup`` promises that the pages of its hit stay put until ``allocate`` or ``free``.  Holding
them at once costs a reference, an evictor key and an allocator state change per page, and a
scheduler looks up a waiting long prompt on every step only to find it does not fit and free
it again (thousands of pages held and given back per step).  So ``lookup`` only records which
pages its hit holds (the policies' ``hold`` calls), and the manager holds them for real the
first time anything reads or changes its page structures (``alloc``, ``index``, ``evictor``,
``ref`` are properties that hold a pending hit first).  Two calls need not: an ``allocate`` of
that request that cannot fit even if every free and unpinned cached byte were its own returns
``None`` at once, and ``free`` (or a new ``lookup``) of it gives the hit back with the effect a
hold and its undo have: none (a hit let go before its allocate is not a use, so use counts and
keys stay as they were).
"""

from __future__ import annotations

import numpy as np

from jenga.core.flat_arrays import BULK, int64s, view
from jenga.core.request import GroupState, Request


class DeferredHold:
    """Mixin of :class:`jenga.core.manager.manager.KVCacheManager` (module doc)."""

    _pending: Request | None = None  # the request whose recorded hit is not held yet
    _recording: list | None = None  # while ``lookup`` runs the policies' ``hit``: the holds

    @property
    def alloc(self):
        if self._pending is not None:
            self._hold_pending()
        return self._alloc

    @alloc.setter
    def alloc(self, value) -> None:
        self._alloc = value

    @property
    def index(self):
        if self._pending is not None:
            self._hold_pending()
        return self._index

    @index.setter
    def index(self, value) -> None:
        self._index = value

    @property
    def evictor(self):
        if self._pending is not None:
            self._hold_pending()
        return self._evictor

    @evictor.setter
    def evictor(self, value) -> None:
        self._evictor = value

    @property
    def ref(self):
        if self._pending is not None:
            self._hold_pending()
        return self._ref

    @ref.setter
    def ref(self, value) -> None:
        self._ref = value

    def _record_hit(self, req: Request) -> None:
        """Run the policies' ``hit`` for ``req.hit`` tokens, recording their holds."""
        if self._pending is not None:
            self._hold_pending()
        rec: list = []
        self._recording = rec
        try:
            for pol, gs in zip(self.policies, req.groups, strict=True):
                pol.hit(req, gs, self._hit_of(pol, req), self)  # past req.hit: jenga.core.manager.shared_recompute
        finally:
            self._recording = None
        req.reserve = rec or None
        req.reserve_cached = None
        if rec:
            self._pending = req

    def _hold_pending(self) -> None:
        """Hold the pending hit for real (``req.pins`` gets the log to undo it)."""
        req, self._pending = self._pending, None
        self._log = log = []
        try:
            for group, pages in req.reserve:
                if type(pages) is list:
                    self.hold_run(group, pages)
                else:
                    self.hold(group, pages)
        finally:
            self._log = None
        req.pins, req.reserve = log, None

    def _forget_pending(self, req: Request) -> None:
        """Give back ``req``'s pending hit: what holding it and undoing the hold would do
        (nothing: a hit let go before its allocate is not a use, see ``_undo_holds``)."""
        self._pending = None
        req.reserve = None

    def _hit_cannot_fit(self, req: Request, end: int) -> bool:
        """True when the first ``allocate`` of ``req`` up to ``end`` surely fails: its new pages
        need more bytes than are free plus cached outside its pending hit and, for an admission
        while others hold pages, outside the protected pages (then holding the hit would be undone
        at once).  Reads the structures without holding the hit."""
        if req.images:
            return False  # image policies may hold cached pages while planning
        alloc, ref, keys = self._alloc, self._ref, self._evictor.keys
        pb = alloc.page_bytes
        need = 0
        for pol, gs in zip(self.policies, req.groups, strict=True):
            need += pol.plan(req, gs, end, self) * pb[pol.gi]
        free = alloc.num_free_large * alloc.large_bytes
        for g, p in enumerate(pb):
            free += alloc.free_small[g] * p
        if need <= free:  # free pages alone hold it (what is out of reach below is all cached)
            return False
        if req.reserve_cached is None:
            held = 0
            for group, pages in req.reserve:
                r = ref[group]
                if type(pages) is not list:
                    unheld = r[pages] == 0
                elif len(pages) > BULK:  # a long hit run: one gather
                    unheld = len(pages) - int(np.count_nonzero(view(r)[int64s(pages)]))
                else:
                    unheld = [r[p] for p in pages].count(0)
                held += unheld * pb[group]
            req.reserve_cached = held
        avail = free
        for g, p in enumerate(pb):
            avail += (alloc.hidden_free[g] + len(keys[g])) * p
        # out of reach: the hit's cached pages, and for an admission while others hold pages the
        # pages the evictor protects (``_quota_of``); the two may overlap, so the larger counts
        # (both lie in cached pages and the free slots of fully evictable large pages)
        out = req.reserve_cached
        prot = getattr(self._evictor, "protected_supply", None)
        pool = alloc.num_large * alloc.large_bytes
        if prot is not None and self._allocated and self._evictor.protected_bytes() <= self.protected_share * pool:
            outside, e_prot = prot()  # the same conditions as _quota_of's protection
            out = max(out, sum(o * p for o, p in zip(outside, pb, strict=True)) + e_prot * alloc.large_bytes)
        return need > avail - out

    def _undo_holds(self, log: list) -> None:
        """``_unhold`` for holds that did not become a use (a rolled-back plan, a hit let go
        before its allocate): the reuse counts they added are taken back."""
        index = self.index
        if index.uses is not None:
            for group, page, _key in log:
                if type(page) is list:  # a run from hold_run
                    index.uncount_uses(group, page)
                else:
                    index.uncount_use(group, page)
        self._unhold(log)

    def _release_hit(self, req: Request) -> None:
        if self._pending is req:
            self._forget_pending(req)
        elif req.pins:
            self._undo_holds(req.pins)
        req.pins = []
        req.groups = [GroupState() for _ in self.model.groups]
        req.hit = req.num_computed = 0
