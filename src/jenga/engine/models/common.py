"""Building blocks shared by the model families: norms, RoPE, gated MLP, attention shell, base LM.

Every model is a ``torch.nn.Module`` whose parameter names equal Hugging Face's, so
``model.load_state_dict(hf_model.state_dict())`` works. Forward contract (all families)::

    logits = model(input_ids[T], positions[T], ctx: ForwardContext, logits_indices[N] | None)

``input_ids`` / ``positions`` are the flattened new tokens of all requests of the step (same
order as the metadata's query tokens); layer ``l`` writes its K/V and attends only through
``ctx.attend(l, ...)``, i.e. through its ``kv_view`` and its group's ``AttentionMetadata``.
Returns ``[N, vocab]`` logits for ``logits_indices`` (all ``T`` tokens when None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.core.specs import CacheSpec, ChunkedLocalSpec, FullAttentionSpec, SlidingWindowSpec
from jenga.engine.attention import ForwardContext
from jenga.errors import UnsupportedFeatureError


def cfg(config, name: str, default=None):
    """``config.name`` or ``default`` when missing or None."""
    value = getattr(config, name, None)
    return default if value is None else value


def head_dim_of(config) -> int:
    """Attention head width: ``config.head_dim``, else hidden size over heads."""
    return cfg(config, "head_dim", config.hidden_size // config.num_attention_heads)


def activation(name: str):
    """HF activation names used by the supported families."""
    table = {
        "silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu,
        "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    }
    if name not in table:
        raise UnsupportedFeatureError(f"activation {name!r}; supported: {sorted(table)}")
    return table[name]


def softcap(x: Tensor, cap: float | None) -> Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32. ``offset=True`` is Gemma's ``x̂ · (1 + w)`` (weights init 0)."""

    def __init__(self, dim: int, eps: float = 1e-6, offset: bool = False):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:
            return (h * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """Weightless RMS normalisation (Llama-4 qk norm)."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


# ----------------------------------------------------------------------------------------- RoPE

def rope_parameters(config, layer_type: str | None = None) -> dict:
    """Rope dict ``{rope_type, rope_theta, ...}`` from a v5 (``rope_parameters``) or legacy config."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    if not isinstance(params, dict) or "rope_theta" not in params:
        legacy = dict(getattr(config, "rope_scaling", None) or {})
        legacy.setdefault("rope_theta", cfg(config, "rope_theta", 10000.0))
        params = {**legacy, **(params or {})}
    params = dict(params)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


def rope_inv_freq(params: dict, head_dim: int) -> Tensor:
    """Inverse frequencies for ``default``, ``linear`` and ``llama3`` rope types (as HF computes them)."""
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    inv = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / params["factor"]
    if kind == "llama3":
        factor, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled)
    raise UnsupportedFeatureError(f"rope_type {kind!r}; supported: default, linear, llama3")


class Rotary(nn.Module):
    """RoPE on ``[T, H, D]``. ``interleaved=False``: rotate-half (HF Llama/Gemma);
    ``True``: adjacent pairs as complex numbers (Llama-4)."""

    def __init__(self, params: dict, head_dim: int, interleaved: bool = False):
        super().__init__()
        self.interleaved = interleaved
        self.inv_freq = rope_inv_freq(params, head_dim)  # fp32, not a buffer: survives model.to(bf16)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(cos, sin)`` as ``[T, 1, D']`` fp32 for ``positions: [T]``; shared by all layers of a step."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        if not self.interleaved:
            freqs = torch.cat((freqs, freqs), dim=-1)
        return freqs.cos()[:, None, :], freqs.sin()[:, None, :]

    def forward(self, x: Tensor, cos_sin: tuple[Tensor, Tensor]) -> Tensor:
        cos, sin = cos_sin
        if self.interleaved:
            h = x.float()
            a, b = h[..., 0::2], h[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class PartialRotary(Rotary):
    """RoPE on the first ``rot_dim`` channels only (``partial_rotary_factor``); the rest pass through."""

    def __init__(self, params: dict, head_dim: int):
        super().__init__(params, head_dim)
        self.rot_dim = 2 * self.inv_freq.numel()

    def forward(self, x: Tensor, cos_sin) -> Tensor:
        d = self.rot_dim
        return torch.cat([super().forward(x[..., :d], cos_sin), x[..., d:]], dim=-1)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) · up(x))`` with HF names ``gate_proj / up_proj / down_proj``."""

    def __init__(self, hidden: int, inter: int, act: str, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


# ------------------------------------------------------------------------------------ attention

@dataclass(frozen=True)
class LayerAttention:
    """What a layer caches and how it attends: ``kind`` in {full, sliding, chunked}."""

    kind: str
    num_kv_heads: int
    head_dim: int
    window: int | None = None
    chunk: int | None = None

    def spec(self, model: str = "", dtype: str = "bf16") -> CacheSpec:
        """The jenga cache spec of this layer (for grouping layers and sizing pages)."""
        common = dict(model=model, dtype=dtype, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)
        if self.kind == "sliding":
            return SlidingWindowSpec(window=self.window, **common)
        if self.kind == "chunked":
            return ChunkedLocalSpec(chunk=self.chunk, **common)
        return FullAttentionSpec(**common)


def attention_dims(config) -> tuple[int, int, int, int]:
    """``(hidden, heads, kv_heads, head_dim)`` of a config (kv heads default to the heads)."""
    heads = config.num_attention_heads
    return config.hidden_size, heads, cfg(config, "num_key_value_heads", heads), head_dim_of(config)


class PagedAttentionBase(nn.Module):
    """q/k/v/o projections (HF names) + the call into the paged cache for one layer.

    :meth:`forward` is the attention most families share: project, norm q and k per head when
    the family gave the layer ``q_norm`` / ``k_norm`` (HF names), rotate them by ``rotary`` when
    there is one (shared by all layers, held outside the module tree so that ``state_dict`` names
    stay HF's; None: no RoPE), attend.  A family with another order or extra inputs (a gated query,
    a position-dependent temperature) overrides :meth:`forward` and uses :meth:`project` /
    :meth:`attend`; one that scales a projection overrides :meth:`project`.
    """

    def __init__(self, layer_idx: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 bias: bool = False, scale: float | None = None, window: int | None = None,
                 chunk: int | None = None, softcap: float | None = None, rotary: nn.Module | None = None):
        super().__init__()
        self._rotary = [rotary]
        self.layer_idx, self.num_heads, self.num_kv_heads, self.head_dim = layer_idx, num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.window, self.chunk, self.softcap = window, chunk, softcap
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=bias)

    @property
    def info(self) -> LayerAttention:
        kind = "sliding" if self.window is not None else "chunked" if self.chunk is not None else "full"
        return LayerAttention(kind, self.num_kv_heads, self.head_dim, self.window, self.chunk)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        T = x.shape[0]
        return (self.q_proj(x).view(T, self.num_heads, self.head_dim),
                self.k_proj(x).view(T, self.num_kv_heads, self.head_dim),
                self.v_proj(x).view(T, self.num_kv_heads, self.head_dim))

    def attend(self, ctx: ForwardContext, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = ctx.attend(self.layer_idx, q, k, v, scale=self.scale, window=self.window, chunk=self.chunk,
                         softcap=self.softcap)
        return self.o_proj(out.reshape(out.shape[0], -1))

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        q, k, v = self.project(x)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        rot = self._rotary[0]
        if rot is not None:
            q, k = rot(q, cos_sin), rot(k, cos_sin)
        return self.attend(ctx, q, k, v)


# ------------------------------------------------------------------------------------ base model

class PagedCausalLM(nn.Module):
    """Base of all families: ``self.model`` (a :class:`~jenga.engine.models.decoder.DecoderModel`
    or a module with its ``embedding`` and ``forward``) + ``self.lm_head``.

    ``model`` given: the head is built here (``hidden -> vocab``, no bias) and tied to the
    embedding when the config says so (``tie_default`` where the config does not say).  A family
    sets ``final_logit_softcapping`` when it caps logits.
    """

    final_logit_softcapping: float | None = None

    def __init__(self, config, model: nn.Module | None = None, *, tie_default: bool = False):
        super().__init__()
        self.config = config
        if model is not None:
            self.model = model
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            if cfg(config, "tie_word_embeddings", tie_default):
                self.lm_head.weight = model.embedding.weight

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None) -> Tensor:
        hidden = self.model(input_ids, positions, ctx)
        if logits_indices is not None:
            hidden = hidden[logits_indices]
        return softcap(self.lm_head(hidden), self.final_logit_softcapping)

    def layer_attention(self) -> list[LayerAttention]:
        """Per decoder layer: cache kind, kv heads, head dim, window / chunk."""
        return [layer.self_attn.info for layer in self.model.layers]

    def layer_cache_specs(self, model: str = "", dtype: str = "bf16") -> list[CacheSpec]:
        """Per decoder layer: the jenga :class:`~jenga.core.specs.CacheSpec`."""
        return [a.spec(model, dtype) for a in self.layer_attention()]
