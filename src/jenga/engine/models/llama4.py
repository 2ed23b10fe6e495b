"""Llama-4 text decoder with paged attention (HF parameter names, ``Llama4TextConfig``).

* ``config.no_rope_layers[l] == 1``: RoPE layer (interleaved complex RoPE) with chunked local
  attention over ``attention_chunk_size``; with ``use_qk_norm`` q and k get a weightless RMS
  norm after RoPE.
* ``no_rope_layers[l] == 0``: NoPE global (full) layer; with ``attn_temperature_tuning`` the
  queries are scaled by ``1 + attn_scale · log1p(floor((pos + 1) / floor_scale))``.
* Layers in ``config.moe_layers`` use a sigmoid-routed top-k MoE (input scaled by the router
  score, HF semantics) plus a shared expert; the others a dense MLP of ``intermediate_size_mlp``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import (
    GatedMLP,
    PagedAttentionBase,
    PagedCausalLM,
    Rotary,
    activation,
    cfg,
    head_dim_of,
    l2_norm,
)
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer


def rope_layers(config) -> list[bool]:
    """True where the layer uses RoPE (and chunked attention)."""
    n = config.num_hidden_layers
    flags = getattr(config, "no_rope_layers", None)
    if not flags:
        interval = cfg(config, "no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    return [bool(f) for f in flags[:n]]


def chunked_layers(config) -> list[bool]:
    """True where the layer attends chunked-locally (``layer_types``, else the RoPE layers)."""
    types = getattr(config, "layer_types", None)
    flags = [t == "chunked_attention" for t in types] if types else rope_layers(config)
    return flags[: config.num_hidden_layers] if cfg(config, "attention_chunk_size") else [False] * len(flags)


def moe_layers(config) -> set[int]:
    layers = getattr(config, "moe_layers", None)
    if layers is None:
        step = cfg(config, "interleave_moe_layer_step", 1)
        layers = range(step - 1, config.num_hidden_layers, step)
    return set(layers)


class Llama4Attention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, use_rope: bool, chunked: bool, rotary: Rotary):
        chunk = cfg(config, "attention_chunk_size") if chunked else None
        super().__init__(layer_idx, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                         head_dim_of(config), bias=cfg(config, "attention_bias", False), chunk=chunk, rotary=rotary)
        self.use_rope = use_rope
        self.qk_norm = bool(cfg(config, "use_qk_norm", False)) and use_rope
        self.eps = cfg(config, "rms_norm_eps", 1e-5)
        self.temperature = bool(cfg(config, "attn_temperature_tuning", False)) and not use_rope
        self.floor_scale = cfg(config, "floor_scale", 8192)
        self.attn_scale = cfg(config, "attn_scale", 0.1)

    def forward(self, x: Tensor, positions: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        """RoPE before the (weightless) q/k norm, unlike the shared order; NoPE layers scale queries."""
        q, k, v = self.project(x)
        if self.use_rope:
            q, k = self._rotary[0](q, cos_sin), self._rotary[0](k, cos_sin)
        if self.qk_norm:
            q, k = l2_norm(q, self.eps), l2_norm(k, self.eps)
        if self.temperature:
            t = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = (q * t[:, None, None]).to(q.dtype)
        return self.attend(ctx, q, k, v)


class Llama4Experts(nn.Module):
    """Stacked expert weights ``gate_up_proj [E, hidden, 2·I]`` (gate | up), ``down_proj [E, I, hidden]``."""

    def __init__(self, config):
        super().__init__()
        e, h, i = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.zeros(e, h, 2 * i))
        self.down_proj = nn.Parameter(torch.zeros(e, i, h))
        self.act = activation(cfg(config, "hidden_act", "silu"))

    def expert(self, e: int, x: Tensor) -> Tensor:
        gate, up = (x @ self.gate_up_proj[e]).chunk(2, dim=-1)
        return (up * self.act(gate)) @ self.down_proj[e]


class Llama4Router(nn.Linear):
    def __init__(self, config):
        super().__init__(config.hidden_size, config.num_local_experts, bias=False)


class Llama4Moe(nn.Module):
    """Top-k routing with sigmoid scores that scale each expert's *input*, plus a shared expert."""

    def __init__(self, config):
        super().__init__()
        self.top_k = cfg(config, "num_experts_per_tok", 1)
        self.experts = Llama4Experts(config)
        self.router = Llama4Router(config)
        self.shared_expert = GatedMLP(config.hidden_size, config.intermediate_size, cfg(config, "hidden_act", "silu"))

    def forward(self, x: Tensor) -> Tensor:
        logits = self.router(x)
        top_val, top_idx = torch.topk(logits, self.top_k, dim=1)
        scores = torch.sigmoid(top_val.float()).to(x.dtype)  # [T, k]
        out = self.shared_expert(x)
        for e in torch.unique(top_idx).tolist():  # loop over experts, not tokens
            tok, slot = torch.nonzero(top_idx == e, as_tuple=True)
            y = self.experts.expert(e, x[tok] * scores[tok, slot, None])
            out = out.index_add(0, tok, y)
        return out


class Llama4DecoderLayer(PreNormDecoderLayer):
    """Its attention also gets the positions (:class:`Llama4TextModel`)."""

    def __init__(self, config, layer_idx: int, use_rope: bool, chunked: bool, is_moe: bool, rotary: Rotary):
        super().__init__(config.hidden_size, cfg(config, "rms_norm_eps", 1e-5),
                         self_attn=Llama4Attention(config, layer_idx, use_rope, chunked, rotary),
                         feed_forward=(Llama4Moe(config) if is_moe else GatedMLP(
                             config.hidden_size, config.intermediate_size_mlp, cfg(config, "hidden_act", "silu"))))


class Llama4TextModel(DecoderModel):
    """The skeleton whose layers also get the positions (NoPE layers' attention temperature)."""

    def layer_args(self, positions: Tensor, ctx: ForwardContext) -> tuple:
        return positions, *super().layer_args(positions, ctx)


class Llama4ForCausalLM(PagedCausalLM):
    """Llama-4 text (Scout / Maverick language model): chunked RoPE layers + NoPE full layers."""

    def __init__(self, config):
        moe, chunked, rope = moe_layers(config), chunked_layers(config), rope_layers(config)
        super().__init__(config, Llama4TextModel.with_rope(
            config, lambda i, rotary: Llama4DecoderLayer(config, i, rope[i], chunked[i], i in moe, rotary),
            rotary_cls=partial(Rotary, interleaved=True), eps=1e-5))
