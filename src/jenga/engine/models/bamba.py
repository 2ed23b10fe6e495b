"""Bamba (IBM): Mamba-2 and attention layers, a gated MLP after each (HF parameter names).

Layer ``i`` is attention when ``i`` is in ``attn_layer_indices`` (``layers_block_type``), else a
:class:`Mamba2Mixer` with one gated RMSNorm over the whole inner width.  Attention uses RoPE on
the first half of each head (``partial_rotary_factor`` 0.5).  Layer:
``x += mixer(input_layernorm(x))``; ``x += feed_forward(pre_ff_layernorm(x))``; the model ends
in ``final_layernorm``.  :func:`granite_mamba2` builds the mixer for Granite-4.0-H too.
"""

from __future__ import annotations

from jenga.engine.models.common import GatedMLP, PagedAttentionBase, PartialRotary, attention_dims, cfg
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.mamba2 import Mamba2Mixer


def granite_mamba2(config, layer_idx: int) -> Mamba2Mixer:
    """The Mamba-2 mixer of Bamba / GraniteMoeHybrid configs (``mamba_*`` fields)."""
    return Mamba2Mixer(layer_idx, hidden=config.hidden_size, heads=config.mamba_n_heads,
                       head_dim=config.mamba_d_head, groups=config.mamba_n_groups, d_state=config.mamba_d_state,
                       d_conv=config.mamba_d_conv, conv_bias=config.mamba_conv_bias,
                       proj_bias=config.mamba_proj_bias, eps=config.rms_norm_eps, norm_groups=1,
                       dt_limit=tuple(config.time_step_limit or (0.0, float("inf"))), act=config.hidden_act)


class BambaAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, rotary: PartialRotary):
        super().__init__(layer_idx, *attention_dims(config), bias=cfg(config, "attention_bias", False),
                         rotary=rotary)


class BambaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, rotary: PartialRotary):
        mixer = ({"self_attn": BambaAttention(config, layer_idx, rotary)}
                 if config.layers_block_type[layer_idx] == "full_attention"
                 else {"mamba": granite_mamba2(config, layer_idx)})
        super().__init__(config.hidden_size, config.rms_norm_eps, ff_norm="pre_ff_layernorm", **mixer,
                         feed_forward=GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act,
                                               bias=cfg(config, "mlp_bias", False)))


class BambaForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel.with_rope(
            config, lambda i, rotary: BambaDecoderLayer(config, i, rotary), rotary_cls=PartialRotary,
            norm_name="final_layernorm"))
