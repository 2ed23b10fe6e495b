"""What one ``allocate`` may take, decided before any page moves: the pages each group needs
(``_plan``, undone by ``_rollback``), which groups fill other requests' large pages first
(``_prefer_shared``) and how many fresh or evicted large pages each group may take (the quota of
steps 2-3, ``_quota_for``; for an admission, pages the evictor protects stay out of reach while
other requests run, ``_quota_of``).  A mixin of :class:`jenga.core.manager.manager.KVCacheManager`.
"""

from __future__ import annotations

from jenga.core.alloc.allocator import Supply
from jenga.core.policy.registry import cdiv
from jenga.core.request import Request


class AllocationQuota:
    """Mixin (module doc); needs the manager's policies, allocator, evictor and requests."""

    def _plan(self, req: Request, end: int) -> tuple[list[int], list]:
        """Pages each group needs to cover ``[0, end)``, and the log of cached pages held."""
        need = [0] * len(self.policies)
        self._log = log = []
        try:
            for pol, gs in req.pairs or zip(self.policies, req.groups, strict=True):
                need[pol.gi] = pol.plan(req, gs, end, self)
        finally:
            self._log = None
        return need, log

    def _rollback(self, req: Request, log: list) -> None:
        """Undo a ``_plan`` that will not be followed by growing."""
        self._undo_holds(log)
        for gs in req.groups:
            gs.pending.clear()

    def _prefer_shared(self, req: Request) -> list[bool]:
        """Groups where this request should fill other requests' large pages before taking
        a fresh one: its lone state page, and token groups where its whole prompt covers
        at most a quarter of a large page (a fresh one would stay mostly empty; the paper's
        co-freeing gain needs a request that fills its large pages)."""
        return [state or req.prompt_len <= (k // 4) * pol.tpp
                for state, k, pol in zip(self._state_group, self.alloc.k, self.policies, strict=True)]

    def _quota_of(self, req: Request, need: list[int], end: int) -> list[int] | None:
        """``_quota_for`` for ``req``'s allocation; a first allocation (an admission) while
        other requests hold pages may not evict a page the evictor protects (one reused at
        least twice, ``eviction="reuse"``): the request waits for running ones to finish
        instead of evicting a hot prefix (its window, on a sliding model) that the next
        requests would miss; and it leaves ``admission_margin`` pages per token group and
        running request evictable for their growth.  Alone, a request may evict anything (it
        could never run else); and while protected pages hold more than ``protected_share``
        of the pool (default half: a
        reused working set larger than the pool, e.g. a cyclic one) admissions may evict them
        in the evictor's order (newest first), so new requests keep the rest of the pool and
        the protected set cannot starve admission.  Beside the margin it leaves evictable what
        the request's next prefill chunk (as long as this one, up to the prompt's end) adds,
        ``_next_chunk``: that chunk is no admission, so it could take protected pages (on a
        sliding model, each article whose window it takes is a lost hit)."""
        if not any(need):
            return need
        sup = self.alloc.supply()  # (holds a pending hit first: its pages are no supply)
        quota = self._quota_for(need, sup)
        if quota is None or req.tables is not None:
            return quota
        prot = getattr(self.evictor, "protected_supply", None)
        if prot is None:
            return quota
        outside, e_prot = prot()
        if not e_prot and not any(outside):
            return quota
        if not self._allocated:
            return quota  # no other request has pages
        if self.evictor.protected_bytes() > self.protected_share * self.alloc.num_large * self.alloc.large_bytes:
            return quota  # protected pages hold over their share of the pool: admissions may evict them
        sup = Supply(sup.free_small, tuple(c - o for c, o in zip(sup.cached_small, outside, strict=True)),
                     sup.whole_large - e_prot)
        # headroom: running requests grow by decode pages next, which must not come from
        # protected pages either (each evicted window page kills a whole window's hit)
        margin = self.admission_margin * self._allocated
        nxt = self._next_chunk(req, end) if self._windowed(req) and self._seen_before(req) else [0] * len(need)
        extra = [x + margin * (not st) for x, st in zip(nxt, self._state_group, strict=True)]
        if any(extra) and self._quota_for([n + x for n, x in zip(need, extra, strict=True)], sup) is None:
            return None
        return self._quota_for(need, sup)

    def _windowed(self, req: Request) -> bool:
        """Whether some group reads less than ``req``'s whole prompt (a window shorter than it):
        then a prefix like it hits only with the window at its end, all or nothing."""
        p = req.prompt_len
        return any(getattr(pol, "first_needed", None) is not None and pol.first_needed(p) > 0
                   for pol in self.policies)

    def _seen_before(self, req: Request) -> bool:
        """Whether ``req``'s first page was computed or hit before (a use count, kept after
        eviction): its prompt is part of a reused working set (a cyclic one evicted it)."""
        index, hashes = self.index, req.hashes
        if index.uses is None:
            return False
        for g, (pol, st) in enumerate(zip(self.policies, self._state_group, strict=True)):
            i = pol.tpp // self.block - 1 if not st else -1
            if 0 <= i < len(hashes) and index.seen(g, hashes[i]):
                return True
        return False

    def _next_chunk(self, req: Request, end: int) -> list[int]:
        """Pages each token group holds more once ``req``, planned up to ``end``, computes as
        many tokens again (its next prefill chunk, up to the prompt's end): the pages at the
        new end minus those already out of range (sliding window, chunk)."""
        stop = min(req.prompt_len, 2 * end - req.start)
        if stop <= end:
            return [0] * len(self.policies)
        out = []
        for pol, st in zip(self.policies, self._state_group, strict=True):
            first = getattr(pol, "first_needed", None)  # token policies (state, image: none)
            if st or first is None:
                out.append(0)
                continue
            tpp = pol.tpp
            out.append(max(0, cdiv(stop, tpp) - first(stop) // tpp - cdiv(end, tpp) + first(end) // tpp))
        return out

    def _quota_for(self, need: list[int], sup: Supply | None = None) -> list[int] | None:
        """Large pages each group may take (steps 2-3), or ``None`` if ``need`` can't fit."""
        k = self.alloc.k
        sup = sup or self.alloc.supply()
        most = [cdiv(x, kg) for x, kg in zip(need, k, strict=True)]
        if sup.whole_large >= sum(most):
            return most
        least = [cdiv(max(0, x - f - c), kg)
                 for x, f, c, kg in zip(need, sup.free_small, sup.cached_small, k, strict=True)]
        if sup.whole_large >= sum(least):
            return least
        return None
