"""GraniteMoeHybrid (IBM Granite-4.0-H): Mamba-2 and attention layers, MoE + shared MLP, muP scales.

``layer_types[i]`` is ``linear_attention`` (the Bamba Mamba-2 mixer, :func:`granite_mamba2`) or
attention (RoPE only when ``position_embedding_type == "rope"``; scores scaled by
``attention_multiplier``, not ``head_dim ** -0.5``).  Feed-forward: a top-k MoE (softmax over the
top-k router logits) plus the shared MLP when ``num_local_experts > 0``, else the shared MLP alone
(Granite-4.0-H Micro).  Both residual branches are scaled by ``residual_multiplier``, embeddings
by ``embedding_multiplier``, logits divided by ``logits_scaling``.  HF parameter names
(``block_sparse_moe.router`` / ``.experts``, ``shared_mlp.input_linear`` / ``output_linear``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.bamba import granite_mamba2
from jenga.engine.models.common import (
    PagedAttentionBase,
    RMSNorm,
    Rotary,
    activation,
    cfg,
    head_dim_of,
    rope_parameters,
)
from jenga.engine.models.decoder import DecoderModel
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.moe import Experts


class GraniteAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, rotary: Rotary | None):
        head_dim = head_dim_of(config)
        super().__init__(layer_idx, config.hidden_size, config.num_attention_heads,
                         cfg(config, "num_key_value_heads", config.num_attention_heads), head_dim,
                         bias=cfg(config, "attention_bias", False), scale=config.attention_multiplier)
        self._rotary = [rotary]  # shared, not a submodule; None: no position embedding

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        q, k, v = self.project(x)
        rot = self._rotary[0]
        if rot is not None:
            q, k = rot(q, cos_sin), rot(k, cos_sin)
        return self.attend(ctx, q, k, v)


class GraniteRouter(nn.Module):
    """Top-k of the router logits, softmax over those k (HF's ``GraniteMoeHybridTopKRouter``)."""

    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.weight = nn.Parameter(torch.zeros(config.num_local_experts, config.hidden_size))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        top, idx = F.linear(x, self.weight).float().topk(self.top_k, dim=-1)
        return idx, torch.softmax(top, dim=-1)


class GraniteMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.router = GraniteRouter(config)
        self.experts = Experts(config.num_local_experts, config.hidden_size, config.intermediate_size,
                               config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        idx, w = self.router(x)
        return self.experts(x, idx, w.to(x.dtype))


class GraniteSharedMLP(nn.Module):
    """``output_linear(act(a) · b)`` with ``[a | b] = input_linear(x)``."""

    def __init__(self, config):
        super().__init__()
        inter = config.shared_intermediate_size
        self.input_linear = nn.Linear(config.hidden_size, 2 * inter, bias=False)
        self.output_linear = nn.Linear(inter, config.hidden_size, bias=False)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.input_linear(x).chunk(2, dim=-1)
        return self.output_linear(self.act(a) * b)


class GraniteMoeHybridDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, rotary: Rotary | None):
        super().__init__()
        if config.layers_block_type[layer_idx] == "linear_attention":
            self.mamba = granite_mamba2(config, layer_idx)
        else:
            self.self_attn = GraniteAttention(config, layer_idx, rotary)
        if cfg(config, "num_local_experts", 0) > 0:
            self.block_sparse_moe = GraniteMoE(config)
        self.shared_mlp = GraniteSharedMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_multiplier = config.residual_multiplier

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        h = self.input_layernorm(x)
        h = self.self_attn(h, cos_sin, ctx) if hasattr(self, "self_attn") else self.mamba(h, ctx)
        x = x + h * self.residual_multiplier
        h = self.post_attention_layernorm(x)
        ff = self.shared_mlp(h)
        if hasattr(self, "block_sparse_moe"):
            ff = self.block_sparse_moe(h) + ff
        return x + ff * self.residual_multiplier


class GraniteMoeHybridForCausalLM(HybridCausalLM):
    def __init__(self, config):
        head_dim = head_dim_of(config)
        rope = cfg(config, "position_embedding_type") == "rope"
        rotary = Rotary(rope_parameters(config), head_dim) if rope else None
        super().__init__(config, DecoderModel(
            config, lambda i: GraniteMoeHybridDecoderLayer(config, i, rotary),
            RMSNorm(config.hidden_size, config.rms_norm_eps), rotary=rotary,
            embed_multiplier=config.embedding_multiplier))
        self.logits_scaling = config.logits_scaling

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, positions, ctx, logits_indices) / self.logits_scaling
