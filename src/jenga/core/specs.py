"""Layer cache specs: small frozen dataclasses that compute their own sizes.

A spec describes what ONE layer keeps per token (attention kinds) or per request
(state kinds).  Layers with equal specs form a :class:`LayerGroup`; a group's small
page holds ``tokens_per_page`` tokens (or one state) for every layer of the group.

Nothing here allocates memory or knows about requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

DTYPE_BYTES: dict[str, int] = {
    "fp8": 1,
    "int8": 1,
    "bf16": 2,
    "fp16": 2,
    "fp32": 4,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype``; raises ``ValueError`` naming the choices."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class CacheSpec:
    """What one layer of one model caches.  Subclasses are the cache *kinds*."""

    model: str
    dtype: str = "bf16"

    kind = "abstract"
    #: True when the cache grows with tokens (one page per ``tokens_per_page`` tokens).
    per_token = True

    def __post_init__(self) -> None:
        dtype_bytes(self.dtype)

    def layer_page_bytes(self, tokens_per_page: int) -> int:
        """Bytes one layer needs for one small page (``tokens_per_page`` tokens or one state)."""
        raise NotImplementedError

    def bytes_per_token(self) -> int:
        """Bytes one layer keeps per cached token (0 for state kinds)."""
        raise NotImplementedError

    def span(self) -> tuple[int | None, int | None]:
        """(window, chunk): the tokens a sliding layer reads back, the chunk a chunked layer
        attends within; ``None`` where the kind has none."""
        return None, None

    def kv_heads(self) -> tuple[int | None, int | None]:
        """(K/V heads, head dim) of an attention kind; ``(None, None)`` for other kinds."""
        return None, None


@dataclass(frozen=True)
class AttentionSpec(CacheSpec):
    """K and V for ``num_kv_heads`` heads of ``head_dim`` per token."""

    num_kv_heads: int = 8
    head_dim: int = 128

    def kv_heads(self) -> tuple[int | None, int | None]:
        return self.num_kv_heads, self.head_dim

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_kv_heads <= 0 or self.head_dim <= 0:
            raise ValueError(f"{type(self).__name__}: num_kv_heads and head_dim must be positive, "
                             f"got {self.num_kv_heads}, {self.head_dim}")

    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim * dtype_bytes(self.dtype)

    def layer_page_bytes(self, tokens_per_page: int) -> int:
        return tokens_per_page * self.bytes_per_token()


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Every token of the sequence stays cached."""

    kind = "full"


@dataclass(frozen=True)
class LatentAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): one compressed vector of ``latent_dim`` elements
    per token (``kv_lora_rank + qk_rope_head_dim``), shared by all heads; no separate K and V."""

    latent_dim: int = 576
    num_kv_heads: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_dim", self.latent_dim)
        super().__post_init__()

    def bytes_per_token(self) -> int:
        return self.latent_dim * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Only the last ``window`` tokens are read (Mistral, Gemma-2/3, gpt-oss)."""

    window: int = 4096
    kind = "sliding"

    def span(self) -> tuple[int | None, int | None]:
        return self.window, None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window <= 0:
            raise ValueError(f"SlidingWindowSpec.window must be positive, got {self.window}")


@dataclass(frozen=True)
class ChunkedLocalSpec(AttentionSpec):
    """Tokens attend only within their ``chunk``-aligned chunk (Llama 4 local layers)."""

    chunk: int = 8192
    kind = "chunked"

    def span(self) -> tuple[int | None, int | None]:
        return None, self.chunk

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk <= 0:
            raise ValueError(f"ChunkedLocalSpec.chunk must be positive, got {self.chunk}")


@dataclass(frozen=True)
class CrossAttentionSpec(AttentionSpec):
    """K and V of encoder (image) tokens only; text tokens are never stored."""

    kind = "cross"


@dataclass(frozen=True)
class VisionEmbeddingSpec(CacheSpec):
    """Vision-encoder output (``hidden_size`` elements) per image token, kept until consumed."""

    hidden_size: int = 4096
    kind = "vision"

    def bytes_per_token(self) -> int:
        return self.hidden_size * dtype_bytes(self.dtype)

    def layer_page_bytes(self, tokens_per_page: int) -> int:
        return tokens_per_page * self.bytes_per_token()


@dataclass(frozen=True)
class MambaSpec(CacheSpec):
    """Recurrent state of one layer: a list of state tensors (Mamba-1/2, Gated DeltaNet).

    ``shapes[i]`` and ``dtypes[i]`` describe state tensor ``i`` (e.g. conv and SSM).
    ``checkpoint_interval`` is the token interval at which states are kept for prefix hits.
    """

    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    checkpoint_interval: int = 512
    kind = "mamba"
    per_token = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.shapes or len(self.shapes) != len(self.dtypes):
            raise ValueError(f"MambaSpec needs one dtype per state shape, got {self.shapes} / {self.dtypes}")
        for d in self.dtypes:
            dtype_bytes(d)
        if self.checkpoint_interval <= 0:
            raise ValueError(f"checkpoint_interval must be positive, got {self.checkpoint_interval}")

    def state_bytes(self) -> int:
        return sum(math.prod(s) * dtype_bytes(d) for s, d in zip(self.shapes, self.dtypes, strict=True))

    def bytes_per_token(self) -> int:
        return 0

    def layer_page_bytes(self, tokens_per_page: int) -> int:
        return self.state_bytes()


@dataclass(frozen=True)
class CopyForwardMambaSpec(MambaSpec):
    """A state whose engine writes a checkpoint as the final state of the step that reaches
    it and copies it into the work page at the start of the *next* step (vLLM's "align"
    Mamba protocol), so the checkpoint a request last reached stays held by it until that
    next step has been committed (``CopyForwardMambaPolicy``).

    ``step_end_from``: a prefill step ending on a page boundary below the prompt's last block,
    at least this many tokens in, also keeps the state it ends on as a checkpoint (0: never;
    vLLM's dense ``prefix_cache_retention_interval=None`` keeps every one)."""

    step_end_from: int = 0


@dataclass(frozen=True)
class LayerGroup:
    """Layers sharing one spec; one small page covers all of them.

    ``pad_bytes`` pads each small page (used only to keep the LCM bounded); it is
    reported as waste.
    """

    name: str
    spec: CacheSpec
    layers: tuple[int, ...]
    tokens_per_page: int = 16
    pad_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"group {self.name!r} has no layers")
        if self.tokens_per_page <= 0:
            raise ValueError(f"group {self.name!r}: tokens_per_page must be positive")

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_page_bytes(self) -> int:
        """p_g: bytes of one layer's slice of a small page (padding spread per layer)."""
        return self.spec.layer_page_bytes(self.tokens_per_page) + self.pad_bytes // self.num_layers

    @property
    def page_bytes(self) -> int:
        """P_g = n_g * p_g: bytes of one small page."""
        return self.layer_page_bytes * self.num_layers

    @property
    def useful_page_bytes(self) -> int:
        return self.spec.layer_page_bytes(self.tokens_per_page) * self.num_layers


@dataclass(frozen=True)
class ModelSpec:
    """A model (or several: draft + target) as layer groups."""

    name: str
    groups: tuple[LayerGroup, ...]
    max_model_len: int = 131072
    num_layers: int = 0
    hf_config: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"model {self.name!r} has no cache groups")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"model {self.name!r}: duplicate group names {names}")

    @classmethod
    def from_hf_config(cls, source, **kwargs) -> ModelSpec:
        """Groups of a Hugging Face config (catalog name, directory, json path, dict or transformers config).

        Thin wrapper over :func:`jenga.structure.model_spec_from_hf_config` (same keyword arguments).
        """
        from jenga.structure import model_spec_from_hf_config  # lazy: structure imports specs

        return model_spec_from_hf_config(source, **kwargs)

    @property
    def large_page_bytes(self) -> int:
        """Bytes of one large page: the LCM of the groups' small pages."""
        return reduce(math.lcm, (g.page_bytes for g in self.groups))

    @property
    def max_small_page_bytes(self) -> int:
        return max(g.page_bytes for g in self.groups)

    def group(self, name: str) -> LayerGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no group {name!r} in {self.name}; groups: {[g.name for g in self.groups]}")

    def combine(self, other: ModelSpec, name: str | None = None) -> ModelSpec:
        """Both models' groups in one spec (draft + target share one pool)."""
        groups = self.groups + tuple(
            LayerGroup(f"{other.name}/{g.name}", g.spec, g.layers, g.tokens_per_page, g.pad_bytes)
            for g in other.groups)
        return ModelSpec(name or f"{self.name}+{other.name}", groups,
                         max(self.max_model_len, other.max_model_len), self.num_layers + other.num_layers)
