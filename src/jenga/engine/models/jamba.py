"""Jamba (AI21): Mamba-1 and attention layers interleaved, MoE feed-forward on some layers.

Layer ``i`` is attention when ``i % attn_layer_period == attn_layer_offset`` (no RoPE: Jamba's
attention is position-free, the Mamba layers carry order), else a :class:`MambaMixer`; its
feed-forward is a top-k MoE when ``i % expert_layer_period == expert_layer_offset`` and
``num_experts > 1``, else a gated MLP.  HF parameter names (``self_attn`` / ``mamba``,
``feed_forward``, ``pre_ff_layernorm``, ``final_layernorm``).
"""

from __future__ import annotations

from torch import Tensor, nn

from jenga.engine.models.common import GatedMLP, PagedAttentionBase, RMSNorm, attention_dims, cfg
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer
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
        super().__init__(layer_idx, *attention_dims(config))  # no RoPE, no bias


class JambaDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int):
        mixer = ({"self_attn": JambaAttention(config, layer_idx)}
                 if config.layers_block_type[layer_idx] == "attention" else {"mamba": MambaMixer(config, layer_idx)})
        super().__init__(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6), ff_norm="pre_ff_layernorm", **mixer,
                         feed_forward=(JambaSparseMoeBlock(config) if config.layers_num_experts[layer_idx] > 1
                                       else GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)))


class JambaForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(
            config, lambda i: JambaDecoderLayer(config, i),
            RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", 1e-6)), norm_name="final_layernorm"))
