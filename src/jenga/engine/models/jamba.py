"""Jamba (AI21): Mamba-1 and attention layers interleaved, MoE feed-forward on some layers.

Layer ``i`` is attention when ``i % attn_layer_period == attn_layer_offset`` (no RoPE: Jamba's
attention is position-free, the Mamba layers carry order), else a :class:`MambaMixer`; its
feed-forward is a top-k MoE when ``i % expert_layer_period == expert_layer_offset`` and
``num_experts > 1``, else a gated MLP.  HF parameter names (``self_attn`` / ``mamba``,
``feed_forward``, ``pre_ff_layernorm``, ``final_layernorm``).
"""

from __future__ import annotations

from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import GatedMLP, PagedAttentionBase, RMSNorm, cfg, head_dim_of
from jenga.engine.models.decoder import DecoderModel
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.mamba import MambaMixer
from jenga.engine.models.moe import Experts, softmax_top_k


class JambaSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.intermediate_size, config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        idx, w = softmax_top_k(self.router(x), self.top_k, renormalize=False)
        return self.experts(x, idx, w.to(x.dtype))


class JambaAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int):
        head_dim = head_dim_of(config)
        super().__init__(layer_idx, config.hidden_size, config.num_attention_heads,
                         cfg(config, "num_key_value_heads", config.num_attention_heads), head_dim)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        q, k, v = self.project(x)
        return self.attend(ctx, q, k, v)


class JambaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        eps = cfg(config, "rms_norm_eps", 1e-6)
        if config.layers_block_type[layer_idx] == "attention":
            self.self_attn = JambaAttention(config, layer_idx)
        else:
            self.mamba = MambaMixer(config, layer_idx)
        if config.layers_num_experts[layer_idx] > 1:
            self.feed_forward = JambaSparseMoeBlock(config)
        else:
            self.feed_forward = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.pre_ff_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:  # no RoPE: cos_sin is None
        mixer = self.self_attn if hasattr(self, "self_attn") else self.mamba
        x = x + mixer(self.input_layernorm(x), ctx)
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class JambaForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(
            config, lambda i: JambaDecoderLayer(config, i),
            RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6)), norm_name="final_layernorm"))
