"""``paged``: vLLM v0 PagedAttention with one "max page" for every layer.

* Every attention layer (full, sliding, chunked, cross) keeps every token, in one page
  size: the largest per-layer page of the model.
* Cross-attention models keep image tokens in *all* layers as if they were text
  (one extra image group of every layer), like self-attention layers.
* Mamba state is padded to the page size, and the attention page grows (more tokens per
  page) until one state fits: the paper's 1344-token Jamba pages.
* Vision embeddings are not in the KV pool (v0 re-runs the encoder).

Waste is measured against what the *real* model needs (``request_accounting``), so
out-of-window tokens held by sliding layers show up as waste.
"""

from __future__ import annotations

from jenga.manager import KVCacheManager
from jenga.prefix.policies import Policy, policy_for
from jenga.request import GroupState, Request
from jenga.specs import (
    AttentionSpec,
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)


def paged_model(model: ModelSpec, block: int) -> ModelSpec:
    """The model as PagedAttention v0 stores it (see the module docstring)."""
    attn = [g for g in model.groups if isinstance(g.spec, AttentionSpec)]
    states = [g for g in model.groups if isinstance(g.spec, MambaSpec)]
    if not attn:
        raise ValueError(f"{model.name}: the paged baseline needs at least one attention layer")
    big = max((g.spec for g in attn), key=lambda s: s.bytes_per_token())
    layers = tuple(sorted({(g.spec.model, layer) for g in attn for layer in g.layers}))
    n = len(layers)
    spec = FullAttentionSpec(big.model, big.dtype, big.num_kv_heads, big.head_dim)
    per_token = n * spec.bytes_per_token()
    tpp = block
    state_bytes = max((g.useful_page_bytes for g in states), default=0)
    if state_bytes > tpp * per_token:  # grow the page until a state fits and pads evenly
        tpp = -(-state_bytes // (per_token * block)) * block
        while any((tpp * per_token - g.useful_page_bytes) % g.num_layers for g in states):
            tpp += block
    page = tpp * per_token
    flat = tuple(range(n))
    groups = [LayerGroup("paged", spec, flat, tpp)]
    if any(isinstance(g.spec, CrossAttentionSpec) for g in attn):
        groups.append(LayerGroup("paged-images", CrossAttentionSpec(big.model, big.dtype, big.num_kv_heads,
                                                                    big.head_dim), flat, tpp))
    for g in states:
        groups.append(LayerGroup(g.name, g.spec, g.layers, g.tokens_per_page, page - g.useful_page_bytes))
    return ModelSpec(f"{model.name}[paged]", tuple(groups), model.max_model_len, model.num_layers, model.hf_config)


class PagedManager(KVCacheManager):
    """PagedAttention v0 ("max page") behind the ``KVCacheManager`` API."""

    name = "paged"

    def _prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        from jenga.manager import with_base_page
        self.true_model = with_base_page(model, tokens_per_page)
        self.true_policies: list[Policy] = [policy_for(i, g, tokens_per_page)
                                            for i, g in enumerate(self.true_model.groups)]
        return paged_model(model, tokens_per_page)

    def request_accounting(self, req: Request) -> tuple[int, int, int, int]:
        """Held bytes from the paged groups; needed and out-of-window from the real model."""
        held, _, _, padding = super().request_accounting(req)
        needed = stale = 0
        done = req.num_computed
        for pol in self.true_policies:
            spec = pol.group.spec
            gs = GroupState()
            if isinstance(spec, MambaSpec):
                gs.work = 0 if req.tables is not None else None
            elif isinstance(spec, VisionEmbeddingSpec):
                continue  # not in the v0 pool
            elif isinstance(spec, CrossAttentionSpec):
                gs.image_pages = {j: [] for j in range(len(req.images))} if req.tables is not None else {}
            need = pol.needed_bytes(req, gs)
            needed += need
            if isinstance(spec, (SlidingWindowSpec, ChunkedLocalSpec)):
                stale += (done - pol.needed_tokens(req, gs)) * pol.token_bytes
        return held, needed, stale, padding


__all__ = ["PagedManager", "paged_model"]
