"""``static``: jenga's pages, but each group owns a fixed share of large pages.

The paper artifact's rule: group g may own at most ``N * w_g / sum(w)`` large pages, with
``w_g = P_g * (1.0 for full / cross attention, 0.5 for sliding, chunked, state and vision)``.
No memory moves between groups while serving.
"""

from __future__ import annotations

from jenga.core.alloc.allocator import Supply
from jenga.core.manager.admission import Admission
from jenga.core.manager.manager import KVCacheManager
from jenga.core.manager.rules import ManagerRules
from jenga.core.policy.registry import cdiv
from jenga.core.specs import ModelSpec

WEIGHT = {"full": 1.0, "cross": 1.0, "sliding": 0.5, "chunked": 0.5, "mamba": 0.5, "vision": 0.5}


class StaticAdmission(Admission):
    """Jenga's admission with per-group caps on large pages (the allocator's ``caps``)."""

    def quota_for(self, need: list[int], sup: Supply | None = None) -> list[int] | None:
        """As jenga's, but a group takes new large pages only up to its share; its own fully
        evictable large pages can always be recycled."""
        alloc = self.alloc
        sup = sup or alloc.supply()
        room = [c - alloc.owned_large(g) for g, c in enumerate(alloc.caps)]
        least = [cdiv(max(0, x - f - c), k)
                 for x, f, c, k in zip(need, sup.free_small, sup.cached_small, alloc.small_per_large, strict=True)]
        if sum(least) > sup.whole_large or any(
                lo > r + alloc.evictable_large(g) for g, (lo, r) in enumerate(zip(least, room, strict=True))):
            return None
        most = [min(cdiv(x, k), r + alloc.evictable_large(g))
                for g, (x, k, r) in enumerate(zip(need, alloc.small_per_large, room, strict=True))]
        if sum(most) <= sup.whole_large:
            return most
        return least


class StaticRules(ManagerRules):
    """jenga's rules with the artifact's per-group caps (module doc) and LRU eviction."""

    default_eviction = "lru"
    admission_class = StaticAdmission

    def caps(self, model: ModelSpec, num_large: int) -> list[int]:
        w = [g.page_bytes * WEIGHT.get(g.kind, 1.0) for g in model.groups]
        return [max(1, int(num_large * x / sum(w))) for x in w]


class StaticManager(KVCacheManager):
    """Static partition: per-group caps on large pages, decided at start-up."""

    name = "static"
    rules_class = StaticRules
