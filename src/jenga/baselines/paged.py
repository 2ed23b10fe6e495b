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

from jenga.baselines.common import TrueNeedsManager, TrueNeedsRules, by_spec_type, stored_as
from jenga.core.specs import (
    AttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    ModelSpec,
)

#: spec type -> the spec of the one paged group that stores its tokens: a full-attention spec (plain or
#: MLA latent) is kept as is (every token of every layer at its own size); other attention kinds as full
PAGE_SPEC = {
    AttentionSpec: lambda s: FullAttentionSpec(s.model, s.dtype, s.num_kv_heads, s.head_dim),
    FullAttentionSpec: lambda s: s,
}


def paged_model(model: ModelSpec, block: int) -> ModelSpec:
    """The model as PagedAttention v0 stores it (see the module docstring)."""
    stored = [stored_as(g.spec) for g in model.groups]
    attn = [g for g, how in zip(model.groups, stored, strict=True) if how in ("tokens", "images")]
    states = [g for g, how in zip(model.groups, stored, strict=True) if how == "state"]
    if not attn:
        raise ValueError(f"{model.name}: the paged baseline needs at least one attention layer")
    big = max((g.spec for g in attn), key=lambda s: s.bytes_per_token())
    layers = tuple(sorted({(g.spec.model, layer) for g in attn for layer in g.layers}))
    n = len(layers)
    spec = by_spec_type(PAGE_SPEC, big)(big)
    per_token = n * spec.bytes_per_token()
    tpp = block
    state_bytes = max((g.useful_page_bytes for g in states), default=0)
    if state_bytes > tpp * per_token:  # grow the page until a state fits and pads evenly
        tpp = -(-state_bytes // (per_token * block)) * block
        while any((tpp * per_token - g.useful_page_bytes) % g.num_layers for g in states):
            tpp += block
    page = tpp * per_token
    # one model: its own layer ids (an engine binds them to its layers; hybrids interleave state
    # layers); several models (draft + target): numbered 0..n-1, their ids would collide
    flat = tuple(layer for _, layer in layers) if len({m for m, _ in layers}) == 1 else tuple(range(n))
    groups = [LayerGroup("paged", spec, flat, tpp)]
    if "images" in stored:
        groups.append(LayerGroup("paged-images", CrossAttentionSpec(big.model, big.dtype, big.num_kv_heads,
                                                                    big.head_dim), flat, tpp))
    for g in states:
        groups.append(LayerGroup(g.name, g.spec, g.layers, g.tokens_per_page, page - g.useful_page_bytes))
    return ModelSpec(f"{model.name}[paged]", tuple(groups), model.max_model_len, model.num_layers, model.hf_config)


class PagedRules(TrueNeedsRules):
    """The paged manager's model: one page size for every layer (``paged_model``)."""

    def prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        self.remember_true_model(model, tokens_per_page)
        return paged_model(model, tokens_per_page)


class PagedManager(TrueNeedsManager):
    """PagedAttention v0 ("max page") behind the ``KVCacheManager`` API."""

    name = "paged"
    rules_class = PagedRules


__all__ = ["PAGE_SPEC", "PagedManager", "PagedRules", "paged_model"]
