"""Falcon-H1 (TII): attention and Mamba-2 side by side in every layer, with muP multipliers.

Layer: ``h = norm(x)``; ``x += ssm_out · mamba(ssm_in · h) + attn_out · attn(attn_in · h)``; then
``x += mlp(pre_ff_norm(x))`` with ``down(up(x) · act(gate(x) · g_mult)) · d_mult``.  The Mamba-2
projection is scaled per section (``ssm_multipliers``: z, x, B, C, dt), keys by ``key_multiplier``,
embeddings and logits by their multipliers.  Each layer's attention KV lives in the ``full`` group
and its state in the ``mamba`` group: one layer, two cache groups.  HF parameter names.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import PagedAttentionBase, Rotary, activation, attention_dims, cfg
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.mamba2 import Mamba2Mixer


def mamba_inner(config) -> int:
    return config.mamba_d_ssm if config.mamba_d_ssm is not None else int(config.mamba_expand * config.hidden_size)


def mup_vector(config) -> Tensor:
    """Per-channel multipliers of the Mamba input projection ``[z I | x I | B GN | C GN | dt H]``."""
    inner, gn = mamba_inner(config), config.mamba_n_groups * config.mamba_d_state
    mult = config.ssm_multipliers or [1.0] * 5
    sizes = [inner, inner, gn, gn, config.mamba_n_heads]
    return torch.cat([torch.full((n,), float(m)) for n, m in zip(sizes, mult, strict=True)])


class FalconH1Attention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, rotary: Rotary):
        super().__init__(layer_idx, *attention_dims(config), bias=cfg(config, "attention_bias", False),
                         rotary=rotary)
        self.key_multiplier = cfg(config, "key_multiplier", 1.0)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(x)
        return q, k * self.key_multiplier, v


class FalconH1MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = cfg(config, "mlp_bias", False)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act = activation(config.hidden_act)
        self.gate_mult, self.down_mult = config.mlp_multipliers or (1.0, 1.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.up_proj(x) * self.act(self.gate_proj(x) * self.gate_mult)) * self.down_mult


class FalconH1DecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, rotary: Rotary):
        heads = config.mamba_n_heads
        mamba = Mamba2Mixer(
            layer_idx, hidden=config.hidden_size, heads=heads, head_dim=mamba_inner(config) // heads,
            groups=config.mamba_n_groups, d_state=config.mamba_d_state, d_conv=config.mamba_d_conv,
            conv_bias=config.mamba_conv_bias, proj_bias=config.mamba_proj_bias, out_bias=config.projectors_bias,
            eps=config.rms_norm_eps, norm_groups=config.mamba_n_groups if config.mamba_rms_norm else None,
            norm_before_gate=config.mamba_norm_before_gate, dt_limit=tuple(config.time_step_limit),
            act=config.hidden_act)
        super().__init__(config.hidden_size, config.rms_norm_eps, ff_norm="pre_ff_layernorm", mamba=mamba,
                         self_attn=FalconH1Attention(config, layer_idx, rotary), feed_forward=FalconH1MLP(config))
        self.ssm_in, self.ssm_out = config.ssm_in_multiplier, config.ssm_out_multiplier
        self.attn_in, self.attn_out = config.attention_in_multiplier, config.attention_out_multiplier
        self._mup = [mup_vector(config)]  # not a parameter or buffer: HF's is non-persistent too

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        """Mamba-2 and attention side by side on one norm, each added to the residual."""
        h = self.input_layernorm(x)
        mup = self._mup[0]
        if mup.device != x.device or mup.dtype != x.dtype:
            mup = self._mup[0] = mup.to(x.device, x.dtype)
        m = self.mamba(h * self.ssm_in, ctx, proj_scale=mup) * self.ssm_out
        x = x + m + self.self_attn(h * self.attn_in, cos_sin, ctx) * self.attn_out
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class FalconH1ForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel.with_rope(
            config, lambda i, rotary: FalconH1DecoderLayer(config, i, rotary), norm_name="final_layernorm",
            embed_multiplier=config.embedding_multiplier))
        self.lm_head_multiplier = config.lm_head_multiplier

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None) -> Tensor:
        return super().forward(input_ids, positions, ctx, logits_indices) * self.lm_head_multiplier
