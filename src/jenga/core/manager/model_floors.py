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

``FloorAdmission`` is the manager's admission with that rule; the rule's other parts (the protected
pages of the reuse evictor, the margin kept for running requests) count the requests of the
allocating model only, since only those run beside it in its own scheduler.
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

    def held_large(self) -> list[int]:
        """``H_m`` per model: large pages holding a page a live request of ``m`` uses."""
        alloc = self.alloc
        return [sum(alloc.owned[g] - alloc.e_count[g] for g in groups) for groups in self.scopes.groups]

    def fits_floors(self, scope: int, take: int) -> bool:
        """Whether model ``scope`` may take ``take`` more large pages and keep every floor."""
        held = self.held_large()
        others = sum(max(h, f) for m, (h, f) in enumerate(zip(held, self.floors, strict=True)) if m != scope)
        return held[scope] + take + others <= self.alloc.num_large

    def quota_of(self, req: Request, need: list[int], end: int, allocated: int) -> list[int] | None:
        scope = self.scopes.of[req.request_id]
        quota = super().quota_of(req, need, end, self.scopes.allocated[scope])
        if quota is None or (not any(quota) and req.tables is not None):
            return quota  # a running request growing inside its own large pages
        self.ledger.settle()  # an admission's hit may hold pages of fully evictable large pages: they count
        if self.fits_floors(scope, sum(quota)):
            return quota
        # fewer large pages: the group's free slots and its own cached pages first (steps 4-5)
        alloc = self.alloc
        sup = alloc.supply()
        least = [min(q, cdiv(max(0, x - f - c), k)) for q, x, f, c, k in
                 zip(quota, need, sup.free_small, sup.cached_small, alloc.k, strict=True)]
        return least if least != quota and self.fits_floors(scope, sum(least)) else None

    def hit_cannot_fit(self, req: Request, end: int, allocated: int) -> bool:
        return super().hit_cannot_fit(req, end, self.scopes.allocated[self.scopes.of[req.request_id]])
