"""Llama / Mistral / Ministral decoder with paged attention (HF parameter names).

Attention kind per layer:

* ``config.layer_types`` present (Ministral-style): ``"sliding_attention"`` layers use
  ``config.sliding_window``, the rest are full;
* otherwise ``config.sliding_window`` (Mistral), when set, applies to every layer;
* otherwise (Llama) every layer is full.

RoPE: ``default``, ``linear`` or ``llama3`` scaling from ``config.rope_parameters``.
"""

from __future__ import annotations

from jenga.engine.models.common import (
    GatedMLP,
    PagedAttentionBase,
    PagedCausalLM,
    Rotary,
    attention_dims,
    cfg,
)
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer


def layer_windows(config) -> list[int | None]:
    """Sliding window of each layer (None = full attention)."""
    n, window = config.num_hidden_layers, cfg(config, "sliding_window")
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types[:n]]
    return [window] * n


def llama_decoder(config, layer_cls) -> DecoderModel:
    """The Llama-shaped skeleton: ``layer_cls(config, i, window_i, rotary)`` for each layer (windows
    from :func:`layer_windows`), one RoPE, a final RMSNorm (Llama, Qwen)."""
    windows = layer_windows(config)
    return DecoderModel.with_rope(config, lambda i, rotary: layer_cls(config, i, windows[i], rotary))


class LlamaAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        super().__init__(layer_idx, *attention_dims(config), bias=cfg(config, "attention_bias", False),
                         window=window, rotary=rotary)


class LlamaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        super().__init__(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6),
                         self_attn=LlamaAttention(config, layer_idx, window, rotary),
                         mlp=GatedMLP(config.hidden_size, config.intermediate_size,
                                      cfg(config, "hidden_act", "silu"), bias=cfg(config, "mlp_bias", False)))


class LlamaForCausalLM(PagedCausalLM):
    """Llama-2/3/3.1 (llama3 rope), Mistral (every-layer sliding window), Ministral (``layer_types``)."""

    def __init__(self, config):
        super().__init__(config, llama_decoder(config, LlamaDecoderLayer))
