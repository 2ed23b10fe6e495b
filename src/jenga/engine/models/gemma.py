"""Gemma-2 and Gemma-3 (text) decoders with paged attention (HF parameter names).

Shared by both: embeddings scaled by ``sqrt(hidden)`` (in the weight dtype), ``(1 + w)`` RMSNorm,
norms before and after both attention and MLP, ``query_pre_attn_scalar ** -0.5`` attention
scale, interleaved sliding / full layers from ``config.layer_types`` and optional final logit
soft-capping.

* Gemma-2: attention logit soft-capping (``attn_logit_softcapping``), one RoPE.
* Gemma-3: q/k RMSNorm over the head dim before RoPE; separate RoPE per layer type
  (local theta for sliding layers, global theta with optional linear scaling for full layers);
  HF applies no attention soft-capping.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import (
    GatedMLP,
    PagedAttentionBase,
    PagedCausalLM,
    RMSNorm,
    Rotary,
    cfg,
    head_dim_of,
    rope_parameters,
)
from jenga.engine.models.decoder import DecoderModel

SLIDING, FULL = "sliding_attention", "full_attention"


def layer_types(config) -> list[str]:
    types = getattr(config, "layer_types", None)
    if types:
        return list(types[: config.num_hidden_layers])
    return [SLIDING if i % 2 == 0 else FULL for i in range(config.num_hidden_layers)]  # Gemma-2 default


class GemmaAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, layer_type: str, rotary: Rotary, gemma3: bool):
        head_dim = head_dim_of(config)
        super().__init__(
            layer_idx, config.hidden_size, config.num_attention_heads, config.num_key_value_heads, head_dim,
            bias=cfg(config, "attention_bias", False),
            scale=cfg(config, "query_pre_attn_scalar", head_dim) ** -0.5,
            window=config.sliding_window if layer_type == SLIDING else None,
            softcap=None if gemma3 else cfg(config, "attn_logit_softcapping"), rotary=rotary)
        if gemma3:
            eps = cfg(config, "rms_norm_eps", 1e-6)
            self.q_norm = RMSNorm(head_dim, eps, offset=True)
            self.k_norm = RMSNorm(head_dim, eps, offset=True)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, layer_type: str, rotary: Rotary, gemma3: bool):
        super().__init__()
        h, eps = config.hidden_size, cfg(config, "rms_norm_eps", 1e-6)
        self.layer_type = layer_type
        self.self_attn = GemmaAttention(config, layer_idx, layer_type, rotary, gemma3)
        self.mlp = GatedMLP(h, config.intermediate_size, cfg(config, "hidden_activation", "gelu_pytorch_tanh"))
        self.input_layernorm = RMSNorm(h, eps, offset=True)
        self.post_attention_layernorm = RMSNorm(h, eps, offset=True)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, offset=True)
        self.post_feedforward_layernorm = RMSNorm(h, eps, offset=True)

    def forward(self, x: Tensor, cos_sin: dict, ctx: ForwardContext) -> Tensor:
        """``cos_sin``: one table per layer type (:meth:`GemmaModel.layer_args`)."""
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos_sin[self.layer_type], ctx))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(DecoderModel):
    """The skeleton with Gemma's quirks: embeddings scaled by ``sqrt(hidden)`` in the weights'
    dtype, and one RoPE table per layer type (Gemma-3's local / global thetas)."""

    def __init__(self, config, gemma3: bool):
        head_dim = head_dim_of(config)
        types = layer_types(config)
        if gemma3:  # one RoPE per layer type (local / global theta, global may be scaled)
            rotary = nn.ModuleDict({t: Rotary(rope_parameters(config, t), head_dim) for t in sorted(set(types))})
        else:
            rot = Rotary(rope_parameters(config), head_dim)
            rotary = nn.ModuleDict({t: rot for t in sorted(set(types))})
        super().__init__(config, lambda i: GemmaDecoderLayer(config, i, types[i], rotary[types[i]], gemma3),
                         RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6), offset=True))
        self.rotary = rotary
        self.embed_scale = config.hidden_size ** 0.5

    def embed(self, input_ids: Tensor) -> Tensor:
        w = self.embed_tokens.weight
        return self.embed_tokens(input_ids) * torch.tensor(self.embed_scale, dtype=w.dtype, device=w.device)

    def layer_args(self, positions: Tensor, ctx: ForwardContext) -> tuple:
        return {t: rot.cos_sin(positions) for t, rot in self.rotary.items()}, ctx


class Gemma2ForCausalLM(PagedCausalLM):
    """Gemma-2: interleaved sliding/full, attention and final logit soft-capping."""

    gemma3 = False

    def __init__(self, config):
        super().__init__(config, GemmaModel(config, gemma3=self.gemma3), tie_default=True)
        self.final_logit_softcapping = cfg(config, "final_logit_softcapping")


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma-3 text: q/k norms, local/global RoPE thetas (global optionally linearly scaled)."""

    gemma3 = True
