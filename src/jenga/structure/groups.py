""":class:`~jenga.structure.facts.ModelFacts` -> layer groups, for one dtype, tensor-parallel degree and page size.

Layers with equal specs (kind + parameters, hence equal page size) form one :class:`LayerGroup`, named by
kind: ``full``, ``sliding``, ``chunked``, ``cross``, ``mamba`` (every recurrent mixer), ``vision``;
``mamba.conv`` / ``mamba.ssm`` with ``split_mamba_state``.  When several groups share a kind a parameter
suffix is added (``sliding_1024``, ``chunked_8192``, ``full_8x128``).  The vision group's one layer index is
``num_layers`` (one past the last decoder layer).

Tensor parallelism: K/V heads are divided (replicated to one per rank when ``H_kv < tp``); MLA latents and
vision embeddings are replicated; mixer states follow :mod:`jenga.structure.mixers`.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga.core.specs import (
    AttentionSpec,
    CacheSpec,
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LatentAttentionSpec,
    LayerGroup,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)
from jenga.structure.facts import Attention, Latent, ModelFacts, State
from jenga.structure.mixers import MIXERS, split_or_replicate
from jenga.structure.source import UnsupportedModelError

__all__ = ["Options", "entries", "group_entries"]

Entry = tuple[int, str, CacheSpec]


@dataclass(frozen=True)
class Options:
    name: str
    dtype: str
    ssm_dtype: str
    tp: int
    checkpoint_interval: int
    split_state: bool
    vision: bool


def _attention(c: Attention, o: Options) -> list[tuple[str, CacheSpec]]:
    dims = dict(model=o.name, dtype=o.dtype, head_dim=c.head_dim,
                num_kv_heads=split_or_replicate(c.num_kv_heads, o.tp, "num_key_value_heads"))
    return [(c.kind, _ATTENTION[c.kind](c.span, dims))]


#: attention kind -> its spec from the layer's span (window / chunk) and K/V dimensions
_ATTENTION = {
    "full": lambda span, dims: FullAttentionSpec(**dims),
    "sliding": lambda span, dims: SlidingWindowSpec(window=span, **dims),
    "chunked": lambda span, dims: ChunkedLocalSpec(chunk=span, **dims),
    "cross": lambda span, dims: CrossAttentionSpec(**dims),
}


def _latent(c: Latent, o: Options) -> list[tuple[str, CacheSpec]]:
    if c.kind != "full":
        raise UnsupportedModelError(f"{o.name}: a {c.kind} attention layer with an MLA latent has no jenga kind")
    return [("full", LatentAttentionSpec(model=o.name, dtype=o.dtype, latent_dim=c.dim))]


def _state(c: State, o: Options) -> list[tuple[str, CacheSpec]]:
    tensors = MIXERS[c.mixer].shapes(c.p, o.tp)
    dtypes = {"conv": o.dtype, "ssm": o.ssm_dtype}
    common = dict(model=o.name, dtype=o.dtype, checkpoint_interval=o.checkpoint_interval)
    if o.split_state:
        return [(f"mamba.{role}", MambaSpec(shapes=tuple(s for r, s in tensors if r == role),
                                            dtypes=tuple(dtypes[r] for r, _ in tensors if r == role), **common))
                for role in ("conv", "ssm") if any(r == role for r, _ in tensors)]
    return [("mamba", MambaSpec(shapes=tuple(s for _, s in tensors), dtypes=tuple(dtypes[r] for r, _ in tensors),
                                **common))]


_BUILD = {Attention: _attention, Latent: _latent, State: _state}


def entries(facts: ModelFacts, o: Options) -> list[Entry]:
    out: list[Entry] = []
    for i, comps in enumerate(facts.layers):
        for c in comps:
            out.extend((i, base, spec) for base, spec in _BUILD[type(c)](c, o))
    if o.vision and facts.vision_hidden_size:
        out.append((facts.num_layers, "vision",
                    VisionEmbeddingSpec(model=o.name, dtype=o.dtype, hidden_size=facts.vision_hidden_size)))
    return out


#: spec type -> what tells two groups of one kind apart in their names (the nearest base's entry)
_SUFFIX = {
    AttentionSpec: lambda s: f"{s.num_kv_heads}x{s.head_dim}",
    SlidingWindowSpec: lambda s: str(s.window),
    ChunkedLocalSpec: lambda s: str(s.chunk),
    LatentAttentionSpec: lambda s: f"latent{s.latent_dim}",
    MambaSpec: lambda s: str(s.state_bytes()),
    VisionEmbeddingSpec: lambda s: str(s.hidden_size),
}


def _suffix(spec: CacheSpec) -> str:
    return next(_SUFFIX[cls] for cls in type(spec).__mro__ if cls in _SUFFIX)(spec)


def group_entries(items: list[Entry], tokens_per_page: int) -> tuple[LayerGroup, ...]:
    """One group per distinct spec, in order of first appearance; names from kinds (+ suffixes)."""
    by_spec: dict[CacheSpec, tuple[str, list[int]]] = {}
    for layer, base, spec in items:
        by_spec.setdefault(spec, (base, []))[1].append(layer)
    bases = [base for base, _ in by_spec.values()]
    names: list[str] = []
    for spec, (base, _) in by_spec.items():
        name = base if bases.count(base) == 1 else f"{base}_{_suffix(spec)}"
        names.append(name if name not in names else f"{name}_{len(names)}")
    return tuple(LayerGroup(name, spec, tuple(layers), tokens_per_page)
                 for name, (spec, (_, layers)) in zip(names, by_spec.items(), strict=True))
