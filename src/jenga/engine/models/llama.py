"""Llama / Mistral / Ministral decoder with paged attention (HF parameter names).

Attention kind per layer:

* ``config.layer_types`` present (Ministral-style): ``"sliding_attention"`` layers use
  ``config.sliding_window``, the rest are full;
* otherwise ``config.sliding_window`` (Mistral), when set, applies to every layer;
* otherwise (Llama) every layer is full.

RoPE: ``default``, ``linear`` or ``llama3`` scaling from ``config.rope_parameters``.
"""

from __future__ import annotations

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


def layer_windows(config) -> list[int | None]:
    """Sliding window of each layer (None = full attention)."""
    n, window = config.num_hidden_layers, cfg(config, "sliding_window")
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types[:n]]
    return [window] * n


class LlamaAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        head_dim = head_dim_of(config)
        super().__init__(layer_idx, config.hidden_size, config.num_attention_heads,
                         cfg(config, "num_key_value_heads", config.num_attention_heads), head_dim,
                         bias=cfg(config, "attention_bias", False), window=window)
        self._rotary = [rotary]  # shared, not a submodule (keeps state_dict names HF-equal)

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        q, k, v = self.project(x)
        rot = self._rotary[0]
        return self.attend(ctx, rot(q, cos_sin), rot(k, cos_sin), v)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        super().__init__()
        eps = cfg(config, "rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(config, layer_idx, window, rotary)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, cfg(config, "hidden_act", "silu"),
                            bias=cfg(config, "mlp_bias", False))
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(PagedCausalLM):
    """Llama-2/3/3.1 (llama3 rope), Mistral (every-layer sliding window), Ministral (``layer_types``)."""

    def __init__(self, config):
        head_dim = head_dim_of(config)
        rotary, windows = Rotary(rope_parameters(config), head_dim), layer_windows(config)
        super().__init__(config, DecoderModel(
            config, lambda i: LlamaDecoderLayer(config, i, windows[i], rotary),
            RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6)), rotary=rotary))
