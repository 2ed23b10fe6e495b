"""Qwen2 / Qwen2.5, Qwen3 and Qwen3-MoE decoders with paged attention (HF parameter names).

* Qwen2 / Qwen2.5: Llama layers with biased q / k / v projections (``o_proj`` without bias).
* Qwen3: q / k RMS-normed per head before RoPE (``q_norm`` / ``k_norm``), ``attention_bias`` on all
  four projections.
* Qwen3-MoE: Qwen3 attention; the feed-forward of layer ``i`` is a softmax top-k MoE
  (``mlp.gate``, ``mlp.experts``) when ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in
  ``mlp_only_layers``, else a gated MLP.

Windows as in :func:`jenga.engine.models.llama.layer_windows`: ``layer_types`` when the config has
them (Qwen2 / Qwen3: sliding from ``max_window_layers`` on, when ``use_sliding_window``), else
``sliding_window`` on every layer (Qwen3-MoE; None unless ``use_sliding_window``).
"""

from __future__ import annotations

from torch import Tensor, nn

from jenga.engine.models.common import (
    GatedMLP,
    PagedAttentionBase,
    PagedCausalLM,
    RMSNorm,
    Rotary,
    attention_dims,
    cfg,
)
from jenga.engine.models.decoder import PreNormDecoderLayer
from jenga.engine.models.llama import llama_decoder
from jenga.engine.models.moe import Experts, TopKRouter

#: model_type -> (q/k/v bias, o bias, per-head q/k norms) given the config
ATTENTION_SHAPES = {
    "qwen2": lambda c: (True, False, False),
    "qwen3": lambda c: (cfg(c, "attention_bias", False),) * 2 + (True,),
    "qwen3_moe": lambda c: (cfg(c, "attention_bias", False),) * 2 + (True,),
}


class QwenAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        qkv_bias, o_bias, qk_norm = ATTENTION_SHAPES[config.model_type](config)
        hidden, heads, kv_heads, head_dim = attention_dims(config)
        super().__init__(layer_idx, hidden, heads, kv_heads, head_dim, bias=qkv_bias, window=window, rotary=rotary)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=o_bias)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)


class QwenSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = TopKRouter(config)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size, config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        idx, w = self.gate(x)
        return self.experts(x, idx, w.to(x.dtype))


def is_sparse_layer(config, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` of a Qwen3-MoE config has the MoE feed-forward."""
    return (cfg(config, "num_experts", 0) > 0 and layer_idx not in (cfg(config, "mlp_only_layers", []) or [])
            and (layer_idx + 1) % cfg(config, "decoder_sparse_step", 1) == 0)


class QwenDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, window: int | None, rotary: Rotary):
        super().__init__(config.hidden_size, config.rms_norm_eps,
                         self_attn=QwenAttention(config, layer_idx, window, rotary),
                         mlp=(QwenSparseMoeBlock(config) if is_sparse_layer(config, layer_idx)
                              else GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)))


class QwenForCausalLM(PagedCausalLM):
    """Qwen2 / Qwen2.5 / Qwen3 dense and Qwen3-MoE (the config's ``model_type`` picks the attention)."""

    def __init__(self, config):
        super().__init__(config, llama_decoder(config, QwenDecoderLayer))
