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
from jenga.engine.models.common import PagedAttentionBase, Rotary, activation, attention_dims, cfg
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.moe import Experts


class GraniteAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, rotary: Rotary | None):
        super().__init__(layer_idx, *attention_dims(config), bias=cfg(config, "attention_bias", False),
                         scale=config.attention_multiplier, rotary=rotary)


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


class GraniteMoeHybridDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, rotary: Rotary | None):
        mixer = ({"mamba": granite_mamba2(config, layer_idx)}
                 if config.layers_block_type[layer_idx] == "linear_attention"
                 else {"self_attn": GraniteAttention(config, layer_idx, rotary)})
        moe = {"block_sparse_moe": GraniteMoE(config)} if cfg(config, "num_local_experts", 0) > 0 else {}
        super().__init__(config.hidden_size, config.rms_norm_eps, **mixer, **moe,
                         shared_mlp=GraniteSharedMLP(config))
        self.residual_multiplier = config.residual_multiplier

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        """Both residual branches scaled; the routed experts (when any) add to the shared MLP."""
        x = x + self.mix(self.input_layernorm(x), cos_sin, ctx) * self.residual_multiplier
        h = self.post_attention_layernorm(x)
        ff = self.shared_mlp(h)
        if hasattr(self, "block_sparse_moe"):
            ff = self.block_sparse_moe(h) + ff
        return x + ff * self.residual_multiplier


class GraniteMoeHybridForCausalLM(HybridCausalLM):
    def __init__(self, config):
        rope = cfg(config, "position_embedding_type") == "rope"
        super().__init__(config, DecoderModel.with_rope(
            config, lambda i, rotary: GraniteMoeHybridDecoderLayer(config, i, rotary),
            rotary_cls=Rotary if rope else None, embed_multiplier=config.embedding_multiplier))
        self.logits_scaling = config.logits_scaling

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, positions, ctx, logits_indices) / self.logits_scaling
