"""Admission: what one ``allocate`` may take, decided before any page moves.

The pages each group needs (``plan``, undone by ``unhold_plan``), which groups fill other requests'
large pages first (``prefer_shared``) and how many fresh or evicted large pages each group may take
(the quota of steps 2-3, ``quota_for``; for an admission, the pages the evictor protects stay out
of reach while other requests run, ``quota_of``).  ``hit_cannot_fit`` answers, without holding a
lookup's deferred hit, whether a first allocate surely fails.  The rule "may a new request evict
protected pages?" is ``protected``, written once for both.

What admissions found cached: ``HitCounts``, the prompt tokens looked up and found cached, for the
prefix hit rates.  A request counts once, at its first ``allocate`` (its lookup's hit is final then).  A request
freed while running and added again under the same id (a preemption) is a *repeat*: it counts
in the totals but not in the first-lookup figures, which measure what the cache holds for new
prompts.  The ids of the last ``REPEAT_MEMO_SIZE`` freed requests that had run are remembered.
"""

from __future__ import annotations

import numpy as np

from jenga.core.alloc.allocator import LargePageAllocator, Supply
from jenga.core.evict.evictor import PrefixEvictor
from jenga.core.flat_arrays import BULK, int64s, view
from jenga.core.manager.ledger import PageLedger
from jenga.core.manager.miss_reasons import REASONS
from jenga.core.policy.registry import Policy, cdiv
from jenga.core.prefix.index import PrefixIndex
from jenga.core.request import Request


class Admission:
    """Need, quota and fit of an allocation (module doc).  ``margin``: pages per token group and
    running request an admission leaves evictable beside the protected ones; ``protected_share``:
    share of the pool beyond which protected pages no longer hold admissions back.  ``admitted``:
    live requests past their first allocate (the manager counts them; the rules below read it)."""

    def __init__(self, policies: list[Policy], alloc: LargePageAllocator, index: PrefixIndex,
                 evictor: PrefixEvictor, ledger: PageLedger, block: int, *, margin: int = 1,
                 protected_share: float = 0.5):
        self.policies, self.alloc, self.index, self.evictor, self.ledger = policies, alloc, index, evictor, ledger
        self.block = block
        self.margin, self.protected_share = margin, protected_share
        self.state_group = [not pol.group.spec.per_token for pol in policies]
        # some group's page is a whole large page; some state group's is; some group's that does not
        # slide is (``prefer_shared``)
        self.whole_page_group = int(1 in alloc.small_per_large)
        self.whole_state_page = any(s and k == 1 for s, k in zip(self.state_group, alloc.small_per_large, strict=True))
        self.whole_kept_page = any(k == 1 and not pol.slides for pol, k in zip(policies, alloc.small_per_large,
                                                                                  strict=True))
        self.admitted = 0

    def plan(self, req: Request, end: int, pairs, step: int | None = None) -> tuple[list[int], list]:
        """Pages each group of ``pairs`` ((policy, state) pairs) needs to cover ``[0, end)``, and
        the log of cached pages held.  ``step``: the tokens up to ``end`` are computed in steps of
        at most that many, so each group counts only what it holds at once (``Policy.peak_plan``)."""
        need = [0] * len(self.policies)
        ledger = self.ledger
        log = ledger.start_log()
        try:
            for pol, gs in pairs:
                need[pol.gi] = pol.plan(req, gs, end, ledger) if step is None else pol.peak_plan(req, gs, end, step,
                                                                                                  ledger)
        finally:
            ledger.end_log()
        return need, log

    def unhold_plan(self, req: Request, log: list) -> None:
        """Undo a ``plan`` that will not be followed by growing."""
        self.ledger.unhold(log)
        for pol, gs in zip(self.policies, req.groups, strict=True):
            pol.forget_plan(gs)

    def prefer_shared(self, req: Request) -> list[bool]:
        """Groups where this request should fill other requests' large pages before taking
        a fresh one: its lone state page, and token groups where its whole prompt covers
        at most a quarter of a large page (a fresh one would stay mostly empty; the paper's
        co-freeing gain needs a request that fills its large pages).  Where some group's page is
        a whole large page, also a prompt of one page in a large page of two or three: the slots
        it leaves free no such page can use.  Where the page of a group that keeps a request's pages
        (a state group, a chunk or full attention; not a sliding window) is a whole large page,
        every allocation of a token group whose large page holds two or three of its pages (one,
        too, beside a whole state page): a request's last large page leaves a third to two thirds
        of it free, slots no page of that group can use, and co-freeing three pages gains little.
        Measured inside vLLM at 4 % of the budget of four H100s (attention pages a third of a large
        page): Qwen3-Next-80B's short prompts of one page each took a fresh large page (batch 62.7
        against vLLM's 86.5; now 86.5), its RAG prompts left 0.37 GiB of 5.2 free in such slots while
        admissions waited (p99 TTFT 1.23 s, now 0.79 s; both with its 36 state layers one group: cut as
        vLLM cuts them, every page of it is one size); Llama-4-Scout's short shared prompts (chunked
        pages whole) 121.1 -> 122.3 req/s (vLLM-best 122.7). A sliding window's whole pages keep the old
        rule (``Policy.slides``): Ministral-8B's articles lose hits and scheduler time with a request's
        pages spread."""
        whole, whole_state, whole_kept = self.whole_page_group, self.whole_state_page, self.whole_kept_page
        return [state or (whole_state and k < 4) or (whole_kept and 1 < k < 4)
                or req.prompt_len <= (k // 4 or whole) * pol.tpp
                for state, k, pol in zip(self.state_group, self.alloc.small_per_large, self.policies, strict=True)]

    def holding_groups(self, req: Request) -> list[int] | None:
        """The groups whose protected pages hold ``req``'s admission back (``protected``): every
        group (``None``) here; a pool of several models counts the request's own model's only."""
        return None

    def protected(self, allocated: int, groups: list[int] | None = None) -> tuple[list[int], int] | None:
        """What a first allocation (an admission) may not evict now: (per group, protected pages
        outside fully evictable large pages; fully evictable large pages holding one), or ``None``
        when it may evict anything; ``groups``: only those groups' protected pages count (default
        every group's).  A page the evictor protects (one reused at least twice,
        ``eviction="reuse"``) stays out of reach while ``allocated`` other requests hold pages: the
        request waits for running ones to finish instead of evicting a hot prefix (its window, on a
        sliding model) that the next requests would miss.  Alone, a request may evict anything (it
        could never run else); and while protected pages hold more than ``protected_share`` of the
        pool (a reused working set larger than the pool, e.g. a cyclic one) admissions may evict
        them in the evictor's order (newest first), so the protected set cannot starve admission."""
        prot = self.evictor.protected_supply(groups)
        if prot is None or not allocated:
            return None
        alloc = self.alloc
        if self.evictor.protected_bytes() > self.protected_share * alloc.num_large * alloc.large_page_bytes:
            return None
        return prot

    def quota_of(self, req: Request, need: list[int], end: int, allocated: int) -> list[int] | None:
        """``quota_for`` for ``req``'s allocation, with an admission kept off the ``protected``
        pages; it also leaves ``margin`` pages per token group and running request evictable for
        their growth, and what the request's next prefill chunk (as long as this one, up to the
        prompt's end) adds, ``next_chunk``: that chunk is no admission, so it could take protected
        pages (on a sliding model, each article whose window it takes is a lost hit)."""
        if not any(need):
            return need
        sup = self.alloc.supply()
        quota = self.quota_for(need, sup)
        if quota is None or req.tables is not None:
            return quota
        prot = self.protected(allocated, self.holding_groups(req))
        if prot is None:
            return quota
        outside, e_prot = prot
        if not e_prot and not any(outside):
            return quota
        sup = Supply(sup.free_small, tuple(c - o for c, o in zip(sup.cached_small, outside, strict=True)),
                     sup.whole_large - e_prot)
        # headroom: running requests grow by decode pages next, which must not come from
        # protected pages either (each evicted window page kills a whole window's hit)
        margin = self.margin * allocated
        nxt = self.next_chunk(req, end) if self.windowed(req) and self.seen_before(req) else [0] * len(need)
        extra = [x + margin * (not st) for x, st in zip(nxt, self.state_group, strict=True)]
        if any(extra) and self.quota_for([n + x for n, x in zip(need, extra, strict=True)], sup) is None:
            return None
        return self.quota_for(need, sup)

    def promotion_quota(self, need: list[int], allocated: int) -> list[int] | None:
        """Large pages each group may take to promote ``need`` host pages for a lookup (before the
        request's first allocate: an admission), or ``None``: refused.  While other requests run
        and the evictor protects pages, the ``protected`` pages stay out of reach and ``margin``
        pages per token group and running request stay evictable, as ``quota_of`` keeps them;
        else every page is in reach (``need`` itself: never fewer large pages than pages)
        (``jenga.core.tier.host_tier.HostTier.promote``)."""
        prot = self.protected(allocated) if any(need) else None
        if prot is None:
            return list(need)
        sup = self.alloc.supply()
        outside, e_prot = prot
        sup = Supply(sup.free_small, tuple(c - o for c, o in zip(sup.cached_small, outside, strict=True)),
                     sup.whole_large - e_prot)
        margin = self.margin * allocated
        if self.quota_for([n + margin * (not st) for n, st in zip(need, self.state_group, strict=True)], sup) is None:
            return None
        return self.quota_for(need, sup)

    def windowed(self, req: Request) -> bool:
        """Whether some group reads less than ``req``'s whole prompt (a window shorter than it):
        then a prefix like it hits only with the window at its end, all or nothing."""
        p = req.prompt_len
        return any((first := pol.footprint.first_needed(p)) is not None and first > 0 for pol in self.policies)

    def seen_before(self, req: Request) -> bool:
        """Whether ``req``'s first page was computed or hit before (a use count, kept after
        eviction): its prompt is part of a reused working set (a cyclic one evicted it)."""
        index, hashes = self.index, req.hashes
        if index.uses is None:
            return False
        for g, (pol, st) in enumerate(zip(self.policies, self.state_group, strict=True)):
            i = pol.tpp // self.block - 1 if not st else -1
            if 0 <= i < len(hashes) and index.seen(g, hashes[i]):
                return True
        return False

    def next_chunk(self, req: Request, end: int) -> list[int]:
        """Pages each token group holds more once ``req``, planned up to ``end``, computes as
        many tokens again (its next prefill chunk, up to the prompt's end): the pages at the
        new end minus those already out of range (sliding window, chunk)."""
        stop = min(req.prompt_len, 2 * end - req.start)
        if stop <= end:
            return [0] * len(self.policies)
        out = []
        for pol, st in zip(self.policies, self.state_group, strict=True):
            if st or pol.footprint.first_needed(stop) is None:  # token policies only (state, image: none)
                out.append(0)
                continue
            tpp, first = pol.tpp, pol.footprint.first_needed
            out.append(max(0, cdiv(stop, tpp) - first(stop) // tpp - cdiv(end, tpp) + first(end) // tpp))
        return out

    def quota_for(self, need: list[int], sup: Supply | None = None) -> list[int] | None:
        """Large pages each group may take (steps 2-3), or ``None`` if ``need`` can't fit."""
        k = self.alloc.small_per_large
        sup = sup or self.alloc.supply()
        most = [-(-x // kg) for x, kg in zip(need, k, strict=True)]  # ceil divisions, inline on the allocate path
        if sup.whole_large >= sum(most):
            return most
        least = [-(-max(0, x - f - c) // kg)
                 for x, f, c, kg in zip(need, sup.free_small, sup.cached_small, k, strict=True)]
        if sup.whole_large >= sum(least):
            return least
        return None

    def hit_cannot_fit(self, req: Request, end: int, allocated: int, step: int | None = None) -> bool:
        """True when the first ``allocate`` of ``req`` up to ``end`` surely fails: its new pages
        need more bytes than are free plus cached outside its hit and, for an admission while
        others hold pages, outside the ``protected`` pages.  A deferred hit is read without holding
        it (then holding it would be undone at once); a held one (a lookup asked again and kept,
        ``PrefixLookup.find``) is out of the cached pages already, and counts nothing.  ``step``:
        the same for the steps of at most that many tokens up to ``end`` (``plan``'s ``step``,
        ``can_allocate``).

        A refusal is remembered on the record with everything it read (``refusal_key``): asked
        again with the same value, it answers at once (a scheduler asks each step for the request
        at the head of its queue, and most steps move no page)."""
        if req.images:
            return False  # image policies may hold cached pages while planning
        key = self.refusal_key(req, end, allocated, step)
        if key is not None and key == req.refusal:
            return True
        refused = self._hit_cannot_fit(req, end, allocated, step)
        req.refusal = key if refused else None
        return refused

    def refusal_key(self, req: Request, end: int, allocated: int, step: int | None) -> tuple | None:
        """Everything ``hit_cannot_fit(req, end, allocated, step)`` reads, as one value (``None``: not
        known, no memo): the arguments; each group's planning state (``Footprint.plan_key``: ``None``
        where a plan reads more than its group's state); the pool's free and cached counts
        (``free_counts``, ``supply_counts``: what the free bytes, the cached pages and the
        ``protected`` pages are counted from; a rule whose ``protected`` reads more overrides this);
        ``req``'s own, constant for the record: its ``holding_groups``.  A deferred hit has none:
        its cached bytes are read off the references, which no count here names."""
        if req.deferred_holds is not None:
            return None
        plans = []
        for pol, gs in zip(self.policies, req.groups, strict=True):
            k = pol.footprint.plan_key(gs)
            if k is None:
                return None
            plans.append(k)
        return end, step, allocated, plans, self.alloc.free_counts(), self.evictor.supply_counts()

    def _hit_cannot_fit(self, req: Request, end: int, allocated: int, step: int | None) -> bool:
        """``hit_cannot_fit`` computed."""
        alloc, ledger, keys = self.alloc, self.ledger, self.evictor.keys
        ref = ledger.ref
        pb = alloc.page_bytes
        need = 0
        for pol, gs in zip(self.policies, req.groups, strict=True):
            n = pol.plan(req, gs, end, ledger) if step is None else pol.peak_plan(req, gs, end, step, ledger)
            need += n * pb[pol.gi]
        free = alloc.free_bytes()
        if need <= free:  # free pages alone hold it (what is out of reach below is all cached)
            return False
        if req.deferred_holds is None:  # held (referenced pages are never evictable) or no hit
            req.deferred_cached_bytes = 0
        elif req.deferred_cached_bytes is None:
            held = 0
            for group, pages in req.deferred_holds:
                r = ref[group]
                if type(pages) is not list:
                    unheld = r[pages] == 0
                elif len(pages) > BULK:  # a long hit run: one gather
                    unheld = len(pages) - int(np.count_nonzero(view(r)[int64s(pages)]))
                else:
                    unheld = [r[p] for p in pages].count(0)
                held += unheld * pb[group]
            req.deferred_cached_bytes = held
        avail = free + alloc.hidden_free_bytes()
        for g, p in enumerate(pb):
            avail += len(keys[g]) * p
        # out of reach: the hit's cached pages, and for an admission the protected pages; the two
        # may overlap, so the larger counts (both lie in cached pages and the free slots of fully
        # evictable large pages)
        out = req.deferred_cached_bytes
        prot = self.protected(allocated, self.holding_groups(req))
        if prot is not None:
            outside, e_prot = prot
            held = e_prot * alloc.large_page_bytes
            for o, p in zip(outside, pb, strict=True):
                held += o * p
            out = max(out, held)
        return need > avail - out


REPEAT_MEMO_SIZE = 256  # freed ids remembered as having run (a re-add is a repeat lookup)


# ---------------------------------------------------------------- what admissions found cached (module doc)


class HitCounts:
    """Token counters over all lookups (``hit_tokens`` / ``query_tokens``) and over first
    lookups only (``first_hit_tokens`` / ``first_query_tokens``), and the repeat memo."""

    def __init__(self):
        self.hit_tokens = 0
        self.query_tokens = 0
        self.first_hit_tokens = 0
        self.first_query_tokens = 0
        self.miss_tokens = dict.fromkeys(REASONS, 0)  # prompt tokens missed, by cause (all lookups)
        self._ran: dict[object, bool] = {}  # freed request ids that had run (their re-add is a repeat)

    def is_repeat(self, request_id: object) -> bool:
        """Whether a request added under ``request_id`` is a re-add of one that ran (forgets it)."""
        return self._ran.pop(request_id, False)

    def count(self, req: Request) -> None:
        """Count ``req``'s prompt and hit, once (its first allocate)."""
        if not req.counted:
            req.counted = True
            self.query_tokens += req.prompt_len
            self.hit_tokens += req.hit
            for reason, n in req.misses:
                self.miss_tokens[reason] += n
            if not req.repeat:
                self.first_query_tokens += req.prompt_len
                self.first_hit_tokens += req.hit

    def freed(self, req: Request) -> None:
        """``req`` was freed: remember its id if it had run (a later re-add is a repeat)."""
        if req.counted or req.repeat:
            ran = self._ran
            ran[req.request_id] = True
            if len(ran) > REPEAT_MEMO_SIZE:
                del ran[next(iter(ran))]  # the oldest
