"""``HostTier``: a second tier of KV pages in host memory, one per manager (``host_memory_bytes``).

It is the manager's part, built like the device tier from the same pieces: an LCM allocator of
its own large pages (the device's large-page size, so a host ``KVLayout`` addresses its pages as
the device layout does), a prefix index keyed exactly like the device's (salts included), a plain
LRU evictor and a ledger of references.  Every host page holds one key's content: it is CACHED
(evictable) or, while a copy from or into it is pending, pinned (USED).

*Demotion.*  The device evictor, built on the tier (``EvictionListener``), tells it of the cached
pages it is about to drop.  A page whose key the host already holds costs nothing (the host copy is
refreshed); a page its kind's policy says can still serve a hit (``TierRules.demotable``; every page
with ``policy="all-groups"``, what block-based offloaders store) gets a host page, taken in the
host's own eviction order when the host is full, and a (device, host) pair in the pending plan.
The host page stays pinned until the plan is taken (nothing may evict it before its copy ran;
and a large page with a pinned page is not fully evictable, so the step's demotions fill it
instead of each taking a large page of its own).
Host pages keep the device key's (release time, -prefix length), so the host evicts the deepest
page of the oldest prefix first, the device's prefix-subset order.

*Promotion.*  ``lookup`` sees both tiers (``jenga.core.tier.tier_view``); the host pages its hit
needs are copied back before the hit is held: each gets a fresh device page registered under its
key (pairs (host, device) in the plan), while the hit's device pages are held so that the
promotion cannot evict them.  The device pages come under admission's rule (the lookup is part of
an admission): its quota, and no protected (reused) page evicted while other requests run; a
promotion the rule refuses is not made, before any page moves, and the request waits for it
(``waits``: its first allocate answers no until its next lookup) rather than recompute its hit.  The host keeps its copy (an inclusive tier: demoting that page
again costs no copy); it stays pinned until the plan is taken.  A promoted page the device evicts
before the plan is taken loses its pair (nothing read it) and unpins its source.
"""

from __future__ import annotations

import numpy as np

from jenga.core.alloc.allocator import LargePageAllocator, PageViews
from jenga.core.alloc.page_states import CACHED, FREE, USED
from jenga.core.clock import Clock
from jenga.core.evict.evictor import PrefixEvictor
from jenga.core.evict.listener import EvictionListener
from jenga.core.flat_arrays import zeros
from jenga.core.manager.ledger import Grant, PageLedger
from jenga.core.prefix.index import PrefixIndex
from jenga.core.tier.copy_plan import CopyPlan, PendingCopies
from jenga.errors import InsufficientMemoryError, InvalidArgumentError

#: what a host tier keeps: the per-kind rule, or every evicted page of every group alike
HOST_POLICIES = ("per-kind", "all-groups")
UNLIMITED = 1 << 60


def host_page_count(host_bytes: int, large_page_bytes: int) -> int:
    """Large pages a host budget holds (no slack page: the host never carves past its pool)."""
    if type(host_bytes) is not int or host_bytes < 0:
        raise InvalidArgumentError(f"host_memory_bytes must be a byte count, got {host_bytes!r}")
    n = host_bytes // large_page_bytes
    if n < 1:
        raise InsufficientMemoryError(f"host_memory_bytes={host_bytes} holds no large page of {large_page_bytes} "
                                      f"bytes; give at least {large_page_bytes} bytes (or None: no host tier)")
    return n


class HostTier(EvictionListener):
    """The host tier of one manager (module doc), built before the device's evictor, which is
    handed it as its listener.  ``device_index``: the device's prefix index (the keys of what it
    evicts); ``clock``: the manager's; ``policies``: the device groups' policies;
    ``out_of_window_age``: the device ledger's.  What moves device pages (``promote``, ``forget``)
    is handed the device ledger by its caller."""

    def __init__(self, page_bytes: list[int], num_large: int, device_index: PrefixIndex, clock: Clock,
                 policies: list, *, out_of_window_age: int, policy: str = "per-kind"):
        if policy not in HOST_POLICIES:
            raise InvalidArgumentError(f"unknown host_policy {policy!r}; choose one of {list(HOST_POLICIES)}")
        self.policy = policy
        self.page_bytes = page_bytes
        pages = PageViews.of(page_bytes, num_large)
        self.index = index = PrefixIndex(len(page_bytes))
        index.track_pages([num_large * k for k in pages.small_per_large])
        self.evictor = evictor = PrefixEvictor(pages, index)
        self.alloc = alloc = LargePageAllocator(pages, evictor)
        self.ledger = PageLedger(alloc, index, evictor, caching=True)
        n = len(page_bytes)
        self._grant = Grant("host", [UNLIMITED] * n, [True] * n)  # free slots of carved pages first
        self.ledger.grant(self._grant)
        self.prefix = [zeros(num_large * k) for k in alloc.small_per_large]  # per host page: its prefix length
        self.device_index = device_index
        self.clock = clock
        self.out_of_window_age = out_of_window_age
        self.policies = policies
        self.pending = PendingCopies(page_bytes)
        self.listening = True
        self.promotions = self.demotions = self.bytes_promoted = self.bytes_demoted = 0
        self.hit_tokens = 0  # hit tokens served from host pages (counted at a request's first allocate)
        self._gains: dict[object, int] = {}  # per looked-up request: tokens its promotions added to the hit
        self._promoted_by: dict[object, list[tuple[int, int]]] = {}  # (group, device page) per request, until a plan
        self._promoter: dict[tuple[int, int], object] = {}  # per pending promotion's (group, device page): its request
        self._waiting: set[object] = set()  # requests whose last lookup's promotion was refused

    # ------------------------------------------------------------------ sizes
    @property
    def num_large(self) -> int:
        return self.alloc.num_large

    @property
    def total_bytes(self) -> int:
        return self.alloc.num_large * self.alloc.large_page_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes of host pages holding content (cached or pinned)."""
        return self.alloc.used_bytes() + sum(len(self.evictor.keys[g]) * b for g, b in enumerate(self.page_bytes))

    def group_used_bytes(self) -> list[int]:
        """Per group: bytes of host pages holding content (cached or pinned)."""
        return [(self.alloc.used_pages(g) + len(self.evictor.keys[g])) * b for g, b in enumerate(self.page_bytes)]

    def tables(self) -> list[dict[bytes, int]]:
        """Per group: the host index (read only)."""
        return self.index.table

    # ------------------------------------------------------------------ hits served
    def waits(self, request_id: object) -> bool:
        """Whether the last lookup of ``request_id`` was refused its promotion (``promote``): its
        first allocate waits (the admission would recompute what the host holds, or evict what
        the rule protects) until a new lookup, once others have finished."""
        return request_id in self._waiting

    def note_hit(self, request_id: object, gain: int) -> None:
        """The last lookup of ``request_id`` found ``gain`` tokens more than the device alone held."""
        self._waiting.discard(request_id)
        if gain > 0:
            self._gains[request_id] = gain
        else:
            self._gains.pop(request_id, None)

    def count_hit(self, request_id: object, hit: int) -> None:
        """The request's hit of ``hit`` tokens is final (its first allocate): count what the host served."""
        self.hit_tokens += min(hit, self._gains.pop(request_id, 0))

    def forget(self, device: PageLedger, request_id: object, never_ran: bool) -> None:
        """The request was freed (``device``: the device ledger).  When it ``never_ran`` (freed before its first allocate: an
        admission that did not fit), the pages its lookup promoted that nobody holds and whose copy
        has not been handed out yet are evicted again: their pair leaves the plan (no copy for a
        hit nobody used; the host still has them) and the device gets its pages back.  A page the
        device evicted since (its pair left the plan) and took again, even for another request's
        promotion, is no longer this request's: each pending pair is evicted once, by its own request."""
        self._gains.pop(request_id, None)
        self._waiting.discard(request_id)
        pages = self._promoted_by.pop(request_id, None)
        if not pages:
            return
        owner = self._promoter
        mine = [gp for gp in dict.fromkeys(pages) if owner.get(gp) == request_id]
        for gp in mine:
            del owner[gp]
        if not never_ran:
            return
        ref = device.ref
        unused: dict[int, list[int]] = {}
        for g, page in mine:
            if ref[g][page] == 0:
                unused.setdefault(g, []).append(page)
        for g, group_pages in unused.items():  # ``evicting`` drops their pairs and unpins their sources
            device.alloc.evict_many(g, group_pages)

    # ------------------------------------------------------------------ demotion
    def _can_take(self, alloc: LargePageAllocator, group: int) -> bool:
        s = alloc.supply()
        return s.free_small[group] > 0 or s.cached_small[group] > 0 or s.whole_large > 0

    def evicting(self, evictor: PrefixEvictor, group: int, pages: list[int]) -> None:
        """The device's ``evictor`` evicts ``pages`` of ``group`` (``EvictionListener``): demote what
        serves hits."""
        if not self.listening:
            return
        dev_keys, now = self.device_index.keys[group], self.clock.now
        promote, host_table = self.pending.promote, self.index.table[group]
        keep: list[int] = []
        fresh: list[int] = []
        unpin: list[int] = []
        for page in pages:
            h = promote.pop((group, page), None)
            if h is not None:  # its copy never ran: the host still has the content
                self._promoter.pop((group, page), None)
                unpin.append(h)
                continue
            if dev_keys[page] in host_table:
                keep.append(page)
            else:
                fresh.append(page)
        if unpin:
            self._unpin_pages({group: unpin}, now)
        key_t, key_n = evictor.key_t[group], evictor.key_n[group]
        if keep:  # the host copy is refreshed: it was just in use
            self.ledger.retime_keys(group, [dev_keys[p] for p in keep], [-key_n[p] for p in keep], now)
        if not fresh:
            return
        if self.policy == "per-kind":
            ids = np.asarray(fresh, dtype=np.int64)
            ts = evictor.release_times(group, ids, np.asarray([key_t[p] for p in fresh], dtype=np.int64))
            age = self.out_of_window_age
            aged_below = now - age // 2 if age > 0 else -UNLIMITED
            mask = self.policies[group].tier_rules.demotable(np.asarray(ts, dtype=np.int64), aged_below)
            fresh = [p for p, m in zip(fresh, mask.tolist(), strict=True) if m]
        ledger, alloc, demote = self.ledger, self.alloc, self.pending.demote
        for page in fresh:
            if not self._can_take(alloc, group):
                return  # every host page of this group is pinned: the rest are dropped
            h = ledger.take(group)  # pinned (USED) until the plan is taken: its copy has not run
            ledger.register(group, h, dev_keys[page])
            self.prefix[group][h] = -key_n[page]
            demote[(group, h)] = page

    # ------------------------------------------------------------------ promotion
    def promote(self, dev: PageLedger, tag: object, wanted: list[tuple[int, int]], held: dict[int, list[int]],
                quota_of=None) -> int:
        """On the device tier (``dev``: its ledger), copy the host pages ``wanted`` ((group, host
        page), in hit order) to fresh device pages registered under their keys; ``held``: per group, the hit's device pages, kept from
        eviction meanwhile.  ``quota_of(need)``: the admission rule (``Admission.promotion_quota``)
        for ``need[g]`` pages of each group once the hit is held: the large pages each group may
        take, or ``None``: then nothing is promoted (the promotion would evict pages an admission
        may not) and the request ``waits`` until its next lookup.  Stops at the first group the
        device cannot give a page (the hit is shorter).  Returns how many pages were promoted."""
        ledger = self.ledger
        now = dev.now
        wanted = list(dict.fromkeys(wanted))
        log = dev.start_log()
        try:
            for g, pages in held.items():
                if pages:
                    dev.hold_run(g, pages)
        finally:
            dev.end_log()
        groups = len(self.page_bytes)
        quota = [UNLIMITED] * groups
        if quota_of is not None:
            need = [0] * groups
            for g, _ in wanted:
                need[g] += 1
            quota = quota_of(need)
            if quota is None:  # refused before any page moved: the host pages keep their keys
                dev.unhold(log)
                self._waiting.add(tag)
                return 0
        for g, h in wanted:
            ledger.hold(g, h)  # pinned: a demotion below cannot take it
        n = len(wanted)
        promoted: list[tuple[int, int, int]] = []
        key_of = self.index.key_of
        dev.grant(Grant(tag, quota, [False] * groups))
        try:
            for i, (g, h) in enumerate(wanted):
                if not self._can_take(dev.alloc, g):
                    n = i
                    break
                page = dev.take(g)
                ok = dev.register(g, page, key_of[g][h])
                assert ok, f"group {g}: promoted key already on the device"
                self.pending.promote[(g, page)] = h
                promoted.append((g, page, self.prefix[g][h]))
                self._promoted_by.setdefault(tag, []).append((g, page))
                self._promoter[(g, page)] = tag
        finally:
            dev.grant(None)
        dev.unhold(log)
        by_group: dict[int, tuple[list[int], list[int]]] = {}
        for g, page, prefix in promoted:  # cached under their keys, one run per group
            ids, lens = by_group.setdefault(g, ([], []))
            ids.append(page)
            lens.append(prefix)
        for g, (ids, lens) in by_group.items():
            dev.drop_pages(g, ids, now, lens)
        left: dict[int, list[int]] = {}
        for g, h in wanted[n:]:
            left.setdefault(g, []).append(h)
        self._unpin_pages(left, now)
        return n

    def _unpin_pages(self, pages: dict[int, list[int]], now: int) -> None:
        """One pin let go of each of ``pages`` (per group, host pages; one may repeat)."""
        prefix = self.prefix
        for g, hs in pages.items():
            p = prefix[g]
            self.ledger.drop_pages(g, hs, now, [p[h] for h in hs])

    # ------------------------------------------------------------------ the plan
    def take_copy_plan(self) -> CopyPlan:
        """The pending copies; their host sources are unpinned and the counters advance."""
        self._unpin_all()
        plan = self.pending.take()
        self._promoted_by.clear()
        self._promoter.clear()
        self.demotions += sum(len(a) for a in plan.demote.values())
        self.promotions += sum(len(a) for a in plan.promote.values())
        pb = self.page_bytes
        self.bytes_demoted += sum(len(a) * pb[g] for g, a in plan.demote.items())
        self.bytes_promoted += sum(len(a) * pb[g] for g, a in plan.promote.items())
        return plan

    def _unpin_all(self) -> None:
        """Every pending copy's host page is let go of (CACHED once no other copy pins it)."""
        pages: dict[int, list[int]] = {}
        for (g, _), h in self.pending.promote.items():
            pages.setdefault(g, []).append(h)
        for (g, h) in self.pending.demote:
            pages.setdefault(g, []).append(h)
        self._unpin_pages(pages, self.clock.now)

    def reset_with(self, device_reset) -> bool:
        """``KVCacheManager.reset_prefix_cache``: ``device_reset()`` (a reset drops pages, it
        demotes none), then, when it was done, every host page and pending copy is forgotten."""
        self.listening = False
        try:
            done = device_reset()
        finally:
            self.listening = True
        if done:
            self.reset()
        return done

    def reset(self) -> None:
        """Forget every host page and pending copy (after the device's ``reset_prefix_cache``, whose
        one ``AllBlocksCleared`` KV event covers the host's pages too: none is recorded per page)."""
        self._unpin_all()
        self.pending.take()
        self._promoted_by.clear()
        self._promoter.clear()
        alloc, events, self.index.events = self.alloc, self.index.events, None
        try:
            while alloc.evict_large() is not None:
                pass
            for g in range(len(self.page_bytes)):
                while alloc.evict_small(g) is not None:
                    pass
        finally:
            self.index.events = events

    # ------------------------------------------------------------------ integrity
    def check(self) -> None:
        """Recount the host tier: allocator, evictor, pins == pending promotes, every page with
        content indexed, every pending pair on pages that still hold its key."""
        alloc, index, ledger = self.alloc, self.index, self.ledger
        alloc.check_integrity()
        self.evictor.check()
        pins: dict[tuple[int, int], int] = {}
        for (g, d), h in self.pending.promote.items():
            pins[(g, h)] = pins.get((g, h), 0) + 1
            assert self.device_index.is_registered(g, d), f"promote target {g}:{d} not indexed on the device"
            assert self.device_index.key_of[g][d] == index.key_of[g][h], f"promote {g}:{h}->{d} keys differ"
        for (g, h) in self.pending.demote:
            assert index.is_registered(g, h), f"demote target {g}:{h} not indexed on the host"
            pins[(g, h)] = pins.get((g, h), 0) + 1
        for g in range(len(alloc.small_per_large)):
            st, ref = alloc.page_states(g), ledger.ref[g]
            for page, s in enumerate(st):
                assert ref[page] == pins.get((g, page), 0), f"host page {g}:{page}: {ref[page]} pins"
                if s == FREE:
                    assert not index.is_registered(g, page), f"host page {g}:{page} FREE but indexed"
                else:
                    assert s in (USED, CACHED) and index.is_registered(g, page), f"host page {g}:{page} unindexed"
            for key, page in index.table[g].items():
                assert index.key_of[g][page] == key, f"host index of group {g} inconsistent at page {page}"
