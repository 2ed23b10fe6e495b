"""``PrefixLookup``: the longest prompt prefix every group can resume from, and its hold.

Each group's policy proposes the longest valid hit no longer than a candidate
(``Policy.longest_prefix``); the lookup iterates to the fixed point, the longest length every
group accepts.  Before that the prompt hasher hashes only what a hit can reach and bounds the
candidate by the first page the full-attention group misses (:mod:`jenga.core.prefix.index`);
after it the junction finder notes where the cached attention prefix ends past a state hit
(:mod:`jenga.core.manager.junction`).  The hit's pages are recorded with the ledger and held
once anything else happens (:mod:`jenga.core.manager.ledger`); a second lookup first lets go of them.
"""

from __future__ import annotations

from collections.abc import Callable

from jenga.core.manager.junction import Junction, fixed_point
from jenga.core.manager.ledger import PageLedger
from jenga.core.manager.miss_reasons import MissReasons
from jenga.core.policy.base import PageOps, Policy
from jenga.core.prefix.index import PrefixIndex, PromptHasher
from jenga.core.request import Request
from jenga.core.tier.host_tier import HostTier
from jenga.core.tier.promotion import promote_hit


class IndexReads:
    """The part of the ledger's ``PageOps`` a hit's length reads (``Policy.longest_prefix``, the
    prompt hasher's bound): the index tables, as they are.  The ledger holds a deferred hit first
    on every access; holding changes references and eviction order, never the index, so a
    read-only probe (``peek``) reads through this instead."""

    __slots__ = ("index",)

    def __init__(self, index: PrefixIndex):
        self.index = index

    def index_table(self, group: int) -> dict[bytes, int]:
        return self.index.table[group]


class _Either:
    """``in`` either of two key containers (the index table, the keys steps in flight write)."""

    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, key) -> bool:
        return key in self.a or key in self.b


class InFlightReads(IndexReads):
    """``IndexReads`` as the index will be once the steps in flight commit: each group's table
    also answers the keys its policy's live steps are writing (``Policy.writing_keys``), so a
    state checkpoint another request computes right now counts as cached (nothing evicted meanwhile)."""

    __slots__ = ("policies",)

    def __init__(self, index: PrefixIndex, policies: list[Policy]):
        super().__init__(index)
        self.policies = policies

    def index_table(self, group: int):
        table, writing = self.index.table[group], self.policies[group].writing_keys()
        return _Either(table, writing) if writing else table


class PrefixLookup:
    """Finds and holds a request's hit.  Owns the junction finder (it iterates the same fixed
    point over the full-attention groups) and the miss classifier (why a lookup missed what it
    missed, :mod:`jenga.core.manager.miss_reasons`); the manager hands it the live record."""

    def __init__(self, policies: list[Policy], block: int, caching: bool, hasher: PromptHasher,
                 ledger: PageLedger, index: PrefixIndex, host: HostTier | None = None,
                 promotion_quota: Callable[[list[int]], list[int] | None] | None = None):
        self.policies, self.block, self.caching = policies, block, caching
        self.hasher, self.ledger, self.index = hasher, ledger, index
        self.host = host  # a host tier: the hit over both tiers is promoted first (jenga.core.tier.promotion)
        self.promotion_quota = promotion_quota  # the admission rule promotions follow (Admission.promotion_quota)
        self.junction = Junction(policies, block, caching, hasher.bound, ledger)
        self.misses = MissReasons(block)
        self.reads = IndexReads(index)
        self.in_flight_reads = InFlightReads(index, policies)

    def find(self, req: Request, max_tokens: int | None) -> int:
        """Let go of the last hit, then find and record the new one (``KVCacheManager.lookup``).

        A lookup asked again with nothing it reads changed (the index's version, the request's
        tokens, ``max_tokens``; its junction checkpoint where the last lookup put it; no host tier,
        whose promotions change pages) keeps the hit it found and holds: letting go of it gives
        its pages back the keys they had when held, and the same lookup would hold the same
        pages again (a scheduler looking the head of its waiting queue up every step it cannot
        admit it)."""
        if (req.looked_up is not None and req.looked_up == (len(req.tokens), max_tokens, self.index.version)
                and req.junction_checkpoint is None and self.host is None):
            return req.hit
        self.reset_hit(req)
        if not self.caching:
            return 0
        top = self.top(req, max_tokens)
        if self.host is not None:
            promote_hit(self, self.host, req, top, self.promotion_quota)
        reach = self.hasher.for_lookup(req, top, self.ledger)
        cand = self.fixed_point(req, reach, self.policies, self.hasher.bound)
        self.junction.find(req, reach, cand)
        req.misses = () if cand == top else self.misses.classify(req, top, reach, cand, self.policies,
                                                                  self.hasher.bound, self.ledger, self.index)
        req.hit = req.num_computed = cand
        self.ledger.record_hit(req, self.policies, self.junction.hit_of)  # held once anything else happens
        req.looked_up = (len(req.tokens), max_tokens, self.index.version)
        return cand

    def peek(self, req: Request, max_tokens: int | None, in_flight: bool = False) -> int:
        """What ``find`` would answer now, read only: nothing held, recorded or counted (device
        tier only: a hit on host pages needs a promotion, which ``find`` plans).  It reads the
        index tables only (``IndexReads``), so another request's deferred hit stays deferred: a
        scheduler probing its waiting queue each step does not hold, then let go of, the hit of
        the request it could not admit the step before.  ``in_flight``: what it will answer
        once the steps in flight commit (``InFlightReads``).  Memoized on the record (``peeked``):
        the same tokens, ``max_tokens`` and index tables (its ``version``) as the last time give
        the same answer; a scheduler probes its waiting queue every step, and most steps register
        or evict nothing.  A request freed and added again is a new record, with no memo."""
        if in_flight:
            ops = self.in_flight_reads
        else:
            ops, key = self.reads, (len(req.tokens), max_tokens, self.index.version)
            seen = req.peeked
            if seen is not None and seen[0] == key:
                return seen[1]
        reach = self.hasher.for_lookup(req, self.top(req, max_tokens), ops)
        n = self.fixed_point(req, reach, self.policies, self.hasher.bound, ops)
        if not in_flight:
            req.peeked = (key, n)
        return n

    def top(self, req: Request, max_tokens: int | None) -> int:
        """The longest hit a lookup may take: whole blocks, never the last token, ``max_tokens``."""
        top = min(len(req.tokens) - 1, len(req.tokens) // self.block * self.block)
        return top if max_tokens is None else max(0, min(top, max_tokens))

    def fixed_point(self, req: Request, cand: int, policies: list[Policy], bound: Policy | None = None,
                    ops: PageOps | None = None) -> int:
        """The longest prefix no longer than ``cand`` that every one of ``policies`` accepts;
        ``bound``: a FullPolicy with all its pages below ``cand`` cached (``PromptHasher.for_lookup``);
        ``ops``: the pages seen (default the device ledger; both tiers' ``TierView``)."""
        return fixed_point(req, cand, policies, self.ledger if ops is None else ops, bound)

    def reset_hit(self, req: Request) -> None:
        """Let go of the hit the last lookup found (deferred or held); fresh group states."""
        self.unhold_hit(req)
        req.looked_up = None
        req.hit_holds = []
        req.groups = [pol.state_type() for pol in self.policies]
        req.hit = req.num_computed = 0

    def unhold_hit(self, req: Request) -> bool:
        """Undo the holds of ``req``'s hit if it has one not allocated yet (deferred, or held since
        the lookup); whether it had."""
        ledger = self.ledger
        if ledger.deferred is req:
            ledger.unhold_deferred(req)
        elif req.hit_holds:
            ledger.unhold(req.hit_holds)
            req.hit_holds = []
        else:
            return False
        return True
