"""Who holds which page: fresh pages in, references held and dropped, registered pages cached
(keyed by the evictor) at zero references, unregistered ones freed.

``PageLedger`` is the ``PageOps`` the policies call.  It owns the per-group reference counts, the
keys of releases by other holders (:mod:`jenga.core.manager.holds`), the log of holds an
allocation may have to undo, the current allocation's grant and a lookup's deferred holds; the
manager hands it the allocator, the index and the evictor it works on, and the clock it reads.  A page cached, hit or
evicted out of order moves through the allocator (``cache_run``, ``hit*``, ``evict_many``), which
has its evictor key or forget it; the ledger asks the evictor directly only what moves no page
(re-timing kept pages, release times).

*A lookup's hit is held lazily (its holds deferred).*  ``lookup`` promises that the pages of its hit stay put until
``allocate`` or ``free``.  Holding them at once costs a reference, an evictor key and an allocator
state change per page, and a scheduler looks up a waiting long prompt on every step only to find
it does not fit and free it again (thousands of pages held and given back per step).  So while
``lookup`` runs the policies' ``hit`` (``_deferring``), ``hold`` / ``hold_run`` only record which
pages the hit holds, and ``settle`` holds them for real.  The page moves below assume nothing is
deferred: the manager settles once at the entry of each call that reads or moves pages
(``KVCacheManager._settle``), never here.  Three calls of the deferred request itself need not:
an ``allocate`` of it that cannot fit even if every free and unheld cached byte were its own
returns ``None`` at once (``Admission.hit_cannot_fit``), and ``free`` (or a new ``lookup``) of it
gives the hit back with the effect a hold and its undo have: none (``unhold_deferred``: a hit let
go before its allocate is not a use, so use counts and keys stay as they were).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass

import numpy as np

from jenga.core.alloc.allocator import LargePageAllocator
from jenga.core.clock import Clock
from jenga.core.evict.evictor import PrefixEvictor
from jenga.core.flat_arrays import BULK, as_ids, int64s, view, zeros
from jenga.core.manager.holds import ReleasedKeys, unhold_log
from jenga.core.policy.base import OUT_OF_WINDOW_AGE, PageOps
from jenga.core.prefix.index import PrefixIndex
from jenga.core.request import Request

#: a run of at most this many pages is dropped element by element (cheaper than numpy's ~25 calls)
DROP_LOOP = 128


@dataclass(slots=True)
class Grant:
    """What one ``allocate`` may take (a value the manager hands the ledger for its ``grow``):
    ``tag`` names the request whose large pages are preferred, ``quota[g]`` is how many fresh or
    evicted large pages group ``g`` may still carve, ``shared[g]`` whether it fills other
    requests' large pages first (``Admission.prefer_shared``)."""

    tag: object
    quota: list[int]
    shared: list[bool]


class PageLedger(PageOps):
    """Reference counts and the hand-offs between allocator, index and evictor (module doc)."""

    def __init__(self, alloc: LargePageAllocator, index: PrefixIndex, evictor: PrefixEvictor, *, caching: bool,
                 out_of_window_age: int = OUT_OF_WINDOW_AGE, clock: Clock | None = None):
        self.alloc, self.index, self.evictor = alloc, index, evictor
        self.caching = caching
        self.out_of_window_age = out_of_window_age
        self.clock = Clock() if clock is None else clock  # the manager's: one tick per allocate
        self.ref = [zeros(alloc.num_large * k) for k in alloc.small_per_large]  # per group and page: references
        self.released = ReleasedKeys([alloc.num_large * k for k in alloc.small_per_large])  # keys for undone holds
        self.deferred: Request | None = None  # the request whose recorded hit is not held yet
        self._deferring: list | None = None  # while ``lookup`` runs the policies' ``hit``: the holds
        self._log: list | None = None  # holds to undo if the allocation is rolled back
        self._grant: Grant | None = None  # the allocation being grown

    now = property(lambda self: self.clock.now, doc="The clock's time (``PageOps.now``).")

    # ------------------------------------------------------------ hit, log and grant
    def settle(self) -> None:
        """Hold the deferred hit for real, if any (``req.hit_holds`` gets the log to undo it).  A plan's
        log open meanwhile stays open, without the hit's holds: undoing the plan leaves the hit held."""
        req = self.deferred
        if req is None:
            return
        self.deferred = None
        outer, self._log = self._log, []
        log = self._log
        try:
            for group, pages in req.deferred_holds:
                if type(pages) is list:
                    self.hold_run(group, pages)
                else:
                    self.hold(group, pages)
        finally:
            self._log = outer
        req.hit_holds, req.deferred_holds = log, None

    def record_hit(self, req: Request, policies: list, hit_of) -> None:
        """Run the policies' ``hit`` (``hit_of(policy, req)`` tokens each) recording their holds:
        they are done by the next ``settle``."""
        rec: list = []
        self._deferring = rec
        try:
            for pol, gs in zip(policies, req.groups, strict=True):
                pol.hit(req, gs, hit_of(pol, req), self)
        finally:
            self._deferring = None
        req.deferred_holds = rec or None
        req.deferred_cached_bytes = None
        if rec:
            self.deferred = req

    def unhold_deferred(self, req: Request) -> None:
        """Give back ``req``'s deferred hit: what holding it and undoing the hold would do
        (nothing: a hit let go before its allocate is not a use, see ``unhold``)."""
        self.deferred = None
        req.deferred_holds = None

    def start_log(self) -> list:
        """Log the holds from now on (``end_log`` stops): the allocation may be rolled back."""
        self._log = log = []
        return log

    def end_log(self) -> None:
        self._log = None

    def grant(self, grant: Grant | None) -> None:
        """The allocation whose ``grow`` takes pages now (``None`` once it is done)."""
        self._grant = grant

    def unhold(self, log: list) -> None:
        """``unhold_log`` for holds that did not become a use (a rolled-back plan, a hit let go
        before its allocate): the reuse counts they added are taken back."""
        index = self.index
        if index.uses is not None:
            for group, page, _key in log:
                if type(page) is list:  # a run from hold_run
                    index.uncount_use_many(group, page)
                else:
                    index.uncount_use(group, page)
        unhold_log(log, self.ref, self.released, self.alloc, self.now)

    # ------------------------------------------------------------ page moves (PageOps)
    def take(self, group: int) -> int:
        alloc, grant = self.alloc, self._grant
        before = alloc.num_carved
        page = alloc.allocate(group, grant.tag, grant.quota[group] > 0, grant.shared[group])
        grant.quota[group] -= alloc.num_carved - before
        self.ref[group][page] = 1
        return page

    def hold_run(self, group: int, pages: list[int]) -> None:
        """``hold`` each page (a hit on a run of distinct cached pages); the log gets one
        ``(group, pages, keys)`` entry for the run."""
        if self._deferring is not None:  # a lookup: held later (module doc)
            self._deferring.append((group, list(pages)))
            return
        ref, log = self.ref[group], self._log
        if self.index.uses is not None:
            self.index.count_use_many(group, pages)
        if len(pages) > BULK:  # keys as three lists (was cached, release time, -prefix length)
            ids = as_ids(pages)
            refs = view(ref)
            free = refs[ids] == 0
            refs[ids] += 1
            kt, kn = np.zeros(len(ids), dtype=np.int64), np.zeros(len(ids), dtype=np.int64)
            if free.any():
                kt[free], kn[free] = self.alloc.hit_run(group, ids[free])
            keys = (free.tolist(), kt.tolist(), kn.tolist())
        else:
            cached = []  # the pages no live request held: a reference each now, then touched
            for page in pages:
                r = ref[page]
                ref[page] = r + 1
                if not r:
                    cached.append(page)
            if not cached:  # every page held by a live request already
                keys = [None] * len(pages)
            else:
                keys = self.alloc.hit_many(group, cached)
                if len(cached) != len(pages):
                    it = iter(keys)
                    keys = [next(it) if ref[page] == 1 else None for page in pages]
        if log is not None:
            log.append((group, list(pages), keys))

    def hold(self, group: int, page: int) -> None:
        if self._deferring is not None:
            self._deferring.append((group, page))
            return
        ref = self.ref[group]
        if self.index.uses is not None:
            self.index.count_use(group, page)
        key = self.alloc.hit(group, page) if ref[page] == 0 else None
        ref[page] += 1
        if self._log is not None:
            self._log.append((group, page, key))

    def drop(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        ref = self.ref[group]
        assert ref[page] > 0, f"drop of unreferenced page {group}:{page}"
        ref[page] -= 1
        if ref[page] > 0:
            if self.caching:
                self.released.put(group, page, (last_access, -prefix_len))
        else:
            if self.released:
                self.released.pop(group, page)
            self._dropped(group, page, last_access, prefix_len)

    def drop_pages(self, group: int, pages: list[int], last_access: int, prefix_lens: list[int]) -> None:
        """``drop`` for each of ``pages`` in turn (a page may repeat), each with its own prefix
        length; the registered pages whose last reference goes are cached together, in one
        ``cache_run`` (the same keys as one ``drop`` each)."""
        ref, caching, index = self.ref[group], self.caching, self.index
        ids: list[int] = []
        negs: list[int] = []
        for page, n in zip(pages, prefix_lens, strict=True):
            r = ref[page] - 1
            assert r >= 0, f"drop of unreferenced page {group}:{page}"
            ref[page] = r
            if r:
                if caching:
                    self.released.put(group, page, (last_access, -n))
                continue
            if self.released:
                self.released.pop(group, page)
            if caching and index.is_registered(group, page):
                ids.append(page)
                negs.append(-n)
            else:
                self._dropped(group, page, last_access, n)
        if ids:
            self.alloc.cache_run(group, ids, negs, last_access)

    def drop_run(self, group: int, pages: list[int | None], start: int, stop: int, last_access: int,
                 tokens_per_page: int) -> None:
        """``drop`` for ``pages[start:stop]`` (page ``i`` ends at token ``(i+1) * tokens_per_page``),
        setting them to None; cached pages handed to the evictor together (a long run in numpy)."""
        seg = pages[start:stop]
        pages[start:stop] = [None] * len(seg)
        if len(seg) <= DROP_LOOP:
            self._drop_short(group, seg, start, last_access, tokens_per_page)
            return
        try:  # every page held (the common case): one C pass, which refuses a None
            ids = int64s(seg)
            negs = np.arange(-(start + 1) * tokens_per_page, -(stop + 1) * tokens_per_page, -tokens_per_page)
        except struct.error:
            held = [p for p in seg if p is not None]
            if not held:
                return
            ids = int64s(held)
            pos = start + np.flatnonzero(np.fromiter((p is not None for p in seg), dtype=bool, count=len(seg)))
            negs = -(pos + 1) * tokens_per_page
        refs = view(self.ref[group])
        r = refs[ids] - 1
        shared = r.any()  # usually not: every page's last reference goes (then no check is needed)
        assert not shared or r.min() >= 0, f"drop of unreferenced pages of group {group}"
        refs[ids] = r
        if shared:  # still held by others: their keys are recorded for an undone hold
            held = r > 0
            if self.caching:  # ``put`` for those, ``forget`` for the rest, in one pass
                self.released.update_many(group, ids, held, last_access, negs)
            last = ~held
            ids, negs = ids[last], negs[last]
            if not self.caching:
                self.released.forget_many(group, ids)
        else:
            self.released.forget_many(group, ids)
        reg = view(self.index.flags[group])[ids] == 1
        if self.caching and reg.all():
            self.alloc.cache_run(group, ids, negs, last_access)
            return
        if self.caching:
            self.alloc.cache_run(group, ids[reg], negs[reg], last_access)
            ids = ids[~reg]
        else:
            for page in ids[reg].tolist():
                self.index.drop(group, page)
        self.alloc.release_many(group, ids)

    def _drop_short(self, group: int, seg: list[int | None], start: int, last_access: int,
                    tokens_per_page: int) -> None:
        """``drop_run`` of a short run, element by element; cached pages go to the evictor together."""
        ref, registered, caching, released = self.ref[group], self.index.flags[group], self.caching, self.released
        rel_on, rel_t, rel_n = released.on[group], released.t[group], released.n[group]
        cache_ids: list[int] = []
        cache_negs: list[int] = []
        to_free: list[int] = []
        neg = -start * tokens_per_page  # page i's -prefix length: -(i + 1) * tokens_per_page
        recorded = 0  # change of ``released.count``
        try:
            for page in seg:
                neg -= tokens_per_page
                if page is None:
                    continue
                r = ref[page] - 1
                if r > 0:  # others still hold it
                    ref[page] = r
                    if caching:  # ``released.put``, inline
                        if not rel_on[page]:
                            rel_on[page] = 1
                            recorded += 1
                        rel_t[page] = last_access
                        rel_n[page] = neg
                    continue
                assert r == 0, f"drop of unreferenced page {group}:{page}"
                ref[page] = 0
                if rel_on[page]:
                    rel_on[page] = 0
                    recorded -= 1
                if registered[page]:
                    if caching:
                        cache_ids.append(page)
                        cache_negs.append(neg)
                        continue
                    self.index.drop(group, page)
                to_free.append(page)
        finally:
            released.count += recorded
        if cache_ids:
            self.alloc.cache_run(group, cache_ids, cache_negs, last_access)
        if to_free:
            self.alloc.release_many(group, to_free)

    def _dropped(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        """A page's last reference went: cached when registered (and caching), else free."""
        if self.caching and self.index.is_registered(group, page):
            self.alloc.cache_run(group, [page], [-prefix_len], last_access)
        else:
            if self.index.is_registered(group, page):
                self.index.drop(group, page)
            self.alloc.release(group, page)

    def take_run(self, group: int, n: int) -> list[int]:
        """``n`` fresh pages of ``group`` (``take`` in a loop, own large pages in bulk)."""
        grant = self._grant
        pages, carved = self.alloc.allocate_many(group, grant.tag, n, grant.quota[group], grant.shared[group])
        grant.quota[group] -= carved
        ref = self.ref[group]
        m, lo = len(pages), pages[0]
        if m > 8 and pages[-1] - lo == m - 1 and pages == list(range(lo, lo + m)):  # a carve's: one slice
            ref[lo:lo + m] = array("q", [1]) * m
        else:
            for page in pages:
                ref[page] = 1
        return pages

    def retime_keys(self, group: int, keys: list[bytes], ends: list[int], last_access: int) -> None:
        found = list(map(self.index.table[group].get, keys))
        ref = self.ref[group]
        if len(found) <= BULK:
            picked = [(page, -end) for page, end in zip(found, ends, strict=True) if page is not None and not ref[page]]
            if picked:
                pages, negs = zip(*picked, strict=True)
                self.evictor.retime_run(group, list(pages), list(negs), last_access)
            return
        try:  # every key registered (the common case): one C pass, which refuses a None
            ids, negs = int64s(found), -int64s(ends)
        except struct.error:
            known = np.fromiter((page is not None for page in found), dtype=bool, count=len(found))
            ids = np.asarray([page for page in found if page is not None], dtype=np.int64)
            negs = -np.asarray(ends, dtype=np.int64)[known]
        free = view(ref)[ids] == 0  # unheld: CACHED
        if free.any():
            self.evictor.retime_run(group, ids[free], negs[free], last_access)

    def age_keys(self, group: int, keys: list[bytes], ends: list[int], stamp: int, max_uses: int | None = None) -> None:
        ref = self.ref[group]
        picked = [(page, -end) for page, end in zip(map(self.index.table[group].get, keys), ends, strict=True)
                  if page is not None and not ref[page]]
        uses = self.index.page_uses
        if picked and max_uses is not None and uses is not None:
            uses = uses[group]
            picked = [(page, neg) for page, neg in picked if uses[page] < max_uses]
        if not picked:
            return
        pages, negs = zip(*picked, strict=True)
        later = [t > stamp for t in self.evictor.release_stamps(group, pages)]
        if True in later:
            self.evictor.retime_run(group, [p for p, x in zip(pages, later, strict=True) if x],
                                    [n for n, x in zip(negs, later, strict=True) if x], stamp)

    def register(self, group: int, page: int, key: bytes) -> bool:
        """A key whose page is only CACHED goes to ``page``: the cached duplicate is evicted
        (``PrefixIndex``'s doc); a key held by a live page stays there (False)."""
        index = self.index
        holder = index.get(group, key)
        if holder is not None and holder != page and not self.ref[group][holder] \
                and not index.is_registered(group, page):
            self.alloc.evict_many(group, [holder])
        return index.register(group, page, key)

    def register_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> None:
        index = self.index
        taken = index.register_many(group, pages, keys, self.ref[group])
        if taken:  # keys of CACHED duplicates: evicted, the live pages registered (``register``)
            table, alloc = index.table[group], self.alloc
            for page, key in taken:
                alloc.evict_many(group, [table[key]])
                index.register(group, page, key)

    def find(self, group: int, key: bytes) -> int | None:
        return self.index.get(group, key)

    def index_table(self, group: int) -> dict[bytes, int]:
        return self.index.table[group]

    def unregister(self, group: int, page: int) -> None:
        """Take a page out of the index (an aborted fill: nobody writes it)."""
        self.index.unregister(group, page)

