"""What baselines share: measuring waste against the real model's needs."""

from __future__ import annotations

from jenga.core.manager.manager import KVCacheManager
from jenga.core.pagesize import with_base_page
from jenga.core.policy.registry import FullPolicy, Policy, policy_for
from jenga.core.request import GroupState, Request
from jenga.core.specs import CrossAttentionSpec, MambaSpec, ModelSpec, VisionEmbeddingSpec


class TrueNeedsMixin(KVCacheManager):
    """Waste of a baseline = bytes it holds - bytes the *real* model needs (every
    baseline keeps more, or pads more, than the model reads)."""
    default_eviction = "lru"  # the systems these baselines stand for evict LRU

    def _remember_true_model(self, model: ModelSpec, tokens_per_page: int) -> None:
        self.true_model = with_base_page(model, tokens_per_page)
        self.true_policies: list[Policy] = [policy_for(i, g, tokens_per_page)
                                            for i, g in enumerate(self.true_model.groups)]

    def request_accounting(self, req: Request) -> tuple[int, int, int, int]:
        held, _, _, padding = super().request_accounting(req)
        needed = stale = 0
        started = req.tables is not None
        for pol in self.true_policies:
            spec = pol.group.spec
            gs = GroupState()
            if isinstance(spec, VisionEmbeddingSpec):
                continue  # outside the KV pool in these baselines
            if isinstance(spec, MambaSpec):
                gs.work = 0 if started else None
            elif isinstance(spec, CrossAttentionSpec):
                gs.image_pages = {j: [] for j in range(len(req.images))} if started else {}
            needed += pol.needed_bytes(req, gs)
            if isinstance(pol, FullPolicy):
                stale += (req.num_computed - pol.needed_tokens(req, gs)) * pol.token_bytes
        stale = min(stale, max(0, held - needed - padding))
        return held, needed, stale, padding
