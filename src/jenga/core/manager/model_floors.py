"""Per-model floors: memory follows the load between models, but no model starves another.

A pool shared by several models (:mod:`jenga.core.manager.multi_model`) has no static split: any
model may take any large page.  Each model ``m`` has a *floor* ``F_m`` in large pages (by default
what its longest admitted request needs).  Let ``H_m`` be the large pages holding at least one
page a live request of ``m`` uses (owned minus fully evictable; cached pages are anyone's).  The
invariant ``sum_m max(H_m, F_m) <= N`` (``N`` large pages) holds at start (checked by the manager)
and after every allocation: an allocation of model ``a`` taking ``q`` large pages is refused
unless ``H_a + q + sum_{b != a} max(H_b, F_b) <= N``.  Frees only lower ``H``.  So whatever the
others hold, model ``b`` always finds ``F_b - H_b`` whole large pages (free or fully evictable):
a request of ``b`` within its floor is admitted even under a flood at another model.

Under contention the pool is shared fairly: while another model has requests waiting (its
scheduler says so, :meth:`MultiModelManager.note_waiting`), an admission may not take model
``a`` past its even share, ``max(N // models, F_a)`` large pages
(:meth:`FloorAdmission.within_share`); running requests still grow past it.  Memory moves to a
model only as far as no other model asks for it: a model alone with work takes every page the
floors leave, two models with queues each keep what a static even split would give them.
Without the rule the model whose lane admits first takes the pages the other waits for, and
the starved model then runs its queue in many small steps.

An *admission* (a request's first allocate) also looks ahead, while its model runs other requests:
the request's whole prompt and the rest of every prompt in flight (any model's) must fit the pages
in reach (:meth:`FloorAdmission.prompt_fits`).  The scheduler asks for a prompt's first chunk only;
alone in its pool a model preempts its own newest request when a later chunk does not fit, but two
models admitting by turns into one pool would otherwise preempt (recompute) half-prefilled requests
of either model.

``FloorAdmission`` is the manager's admission with that rule; the rule's other parts (the protected
pages of the reuse evictor, the margin kept for running requests) count the requests of the
allocating model only, since only those run beside it in its own scheduler.  Likewise only the
allocating model's protected pages hold its admission back (:meth:`FloorAdmission.holding_groups`):
another model's cached pages are anyone's, as the floors count them, and a page that model reused
twice could otherwise keep the other model below its floor or its even share (a large page holding
one cached page of a preempted and recomputed request kept a second model at one running request
until the first model's wave ended).
"""

from __future__ import annotations

from jenga.core.manager.admission import Admission
from jenga.core.manager.model_scope import ModelScopes
from jenga.core.policy.registry import cdiv
from jenga.core.request import Request


class FloorAdmission(Admission):
    """``Admission`` under the floor rule (module doc); ``scopes.floors`` is set by the manager
    once the large page is known (a list of large pages per model; until then no floor)."""

    def __init__(self, *args, scopes: ModelScopes, **kwargs):
        super().__init__(*args, **kwargs)
        self.scopes = scopes
        self.floors: list[int] = [0] * len(scopes.names)
        self.live: dict = {}  # the manager's live records (set by the manager)

    def held_large(self) -> list[int]:
        """``H_m`` per model: large pages holding a page a live request of ``m`` uses."""
        alloc = self.alloc
        return [sum(alloc.owned_large(g) - alloc.evictable_large(g) for g in groups) for groups in self.scopes.groups]

    def fits_floors(self, scope: int, take: int) -> bool:
        """Whether model ``scope`` may take ``take`` more large pages and keep every floor."""
        held = self.held_large()
        others = sum(max(h, f) for m, (h, f) in enumerate(zip(held, self.floors, strict=True)) if m != scope)
        return held[scope] + take + others <= self.alloc.num_large

    def within_share(self, scope: int, take: int) -> bool:
        """Whether an admission of model ``scope`` may take ``take`` more large pages: always while
        no other model has requests waiting, else up to its even share (module doc)."""
        waiting = self.scopes.waiting
        if not any(w for m, w in enumerate(waiting) if m != scope):
            return True
        share = max(self.alloc.num_large // len(waiting), self.floors[scope])
        return self.held_large()[scope] + take <= share

    def prompt_fits(self, req: Request, scope: int) -> bool:
        """An admission looks ahead: ``req``'s whole prompt (one chunk is all the scheduler asks
        for) plus what every allocated request still needs to finish its prompt fit the pages in
        reach now.  Without it, models sharing a pool admit prompts whose later chunks outgrow it,
        and then preempt (recompute) half-prefilled requests of either model.  Skipped while the
        model has no allocated request: its floor alone then guarantees the prompt fits."""
        if not self.scopes.allocated[scope]:
            return True
        k, alloc = self.alloc.small_per_large, self.alloc
        small = [0] * len(k)
        for pol, gs in zip(self.policies, req.groups, strict=True):
            if pol.scope == scope and pol.group.spec.per_token:
                small[pol.gi] += max(0, pol.footprint.context_pages(req.prompt_len - 1) - pol.footprint.held_pages(gs))
        for rid, other in self.live.items():
            if other.tables is None or other.num_computed + other.num_scheduled >= other.prompt_len:
                continue
            end = other.prompt_len - 1  # context_pages(n): n tokens and the one being computed
            for pol, gs in zip(self.policies, other.groups, strict=True):
                if pol.scope == self.scopes.of[rid] and pol.group.spec.per_token:
                    small[pol.gi] += max(0, pol.footprint.context_pages(end) - pol.footprint.held_pages(gs))
        sup = alloc.supply()
        large = sum(cdiv(max(0, x - f - c), kg) for x, f, c, kg in
                    zip(small, sup.free_small, sup.cached_small, k, strict=True))
        return large <= sup.whole_large and self.fits_floors(scope, large)

    def quota_of(self, req: Request, need: list[int], end: int, allocated: int) -> list[int] | None:
        scope = self.scopes.of[req.request_id]
        quota = super().quota_of(req, need, end, self.scopes.allocated[scope])
        if quota is None or (not any(quota) and req.tables is not None):
            return quota  # a running request growing inside its own large pages
        if req.tables is None and not self.prompt_fits(req, scope):
            return None
        first = req.tables is None
        if self.fits_floors(scope, sum(quota)) and (not first or self.within_share(scope, sum(quota))):
            return quota
        # fewer large pages: the group's free slots and its own cached pages first (steps 4-5)
        alloc = self.alloc
        sup = alloc.supply()
        least = [min(q, cdiv(max(0, x - f - c), k)) for q, x, f, c, k in
                 zip(quota, need, sup.free_small, sup.cached_small, alloc.small_per_large, strict=True)]
        fits = least != quota and self.fits_floors(scope, sum(least)) and (not first or self.within_share(scope, sum(least)))
        return least if fits else None

    def holding_groups(self, req: Request) -> list[int]:
        """Only the groups of ``req``'s own model: its admission never waits on pages another model
        protects (module doc)."""
        return self.scopes.groups[self.scopes.of[req.request_id]]

    def hit_cannot_fit(self, req: Request, end: int, allocated: int, step: int | None = None) -> bool:
        return super().hit_cannot_fit(req, end, self.scopes.allocated[self.scopes.of[req.request_id]], step)
