"""Qwen3-Next: Gated DeltaNet (``linear_attention``) and gated full attention, MoE feed-forward.

Full attention: ``q_proj`` gives query and an output gate per head; q / k RMS-normed per head
(``1 + w``), partial RoPE (the first ``partial_rotary_factor · head_dim`` channels), output
times ``σ(gate)``.  Feed-forward: a softmax top-k MoE with a sigmoid-gated shared expert on layers
with ``(i + 1) % decoder_sparse_step == 0`` not in ``mlp_only_layers``, else a gated MLP.  All norms
are ``1 + w`` RMSNorms.  HF parameter names (``linear_attn`` / ``self_attn``, ``mlp.gate``,
``mlp.experts``, ``mlp.shared_expert``, ``mlp.shared_expert_gate``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import GatedMLP, PagedAttentionBase, PartialRotary, RMSNorm, cfg, head_dim_of
from jenga.engine.models.decoder import DecoderModel, PreNormDecoderLayer
from jenga.engine.models.gated_deltanet import GatedDeltaNet
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.moe import Experts, TopKRouter
from jenga.engine.models.qwen import is_sparse_layer


class Qwen3NextAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int, rotary: PartialRotary):
        head_dim = head_dim_of(config)
        heads, bias = config.num_attention_heads, cfg(config, "attention_bias", False)
        super().__init__(layer_idx, config.hidden_size, heads, config.num_key_value_heads, head_dim, bias=bias,
                         rotary=rotary)
        self.q_proj = nn.Linear(config.hidden_size, 2 * heads * head_dim, bias=bias)  # query | gate per head
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, offset=True)
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, offset=True)

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        T, H, D = x.shape[0], self.num_heads, self.head_dim
        q, gate = self.q_proj(x).view(T, H, 2 * D).chunk(2, dim=-1)
        k = self.k_proj(x).view(T, self.num_kv_heads, D)
        v = self.v_proj(x).view(T, self.num_kv_heads, D)
        rot = self._rotary[0]
        out = ctx.attend(self.layer_idx, rot(self.q_norm(q), cos_sin), rot(self.k_norm(k), cos_sin), v,
                         scale=self.scale)
        return self.o_proj(out.reshape(T, -1) * torch.sigmoid(gate.reshape(T, -1)))


class Qwen3NextSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate = TopKRouter(config)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size, config.hidden_act)
        self.shared_expert = GatedMLP(config.hidden_size, config.shared_expert_intermediate_size, config.hidden_act)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        idx, w = self.gate(x)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, idx, w.to(x.dtype)) + shared


class Qwen3NextDecoderLayer(PreNormDecoderLayer):
    def __init__(self, config, layer_idx: int, rotary: PartialRotary):
        mixer = ({"linear_attn": GatedDeltaNet(config, layer_idx)}
                 if config.layer_types[layer_idx] == "linear_attention"
                 else {"self_attn": Qwen3NextAttention(config, layer_idx, rotary)})
        super().__init__(config.hidden_size, config.rms_norm_eps, offset=True, **mixer,
                         mlp=(Qwen3NextSparseMoeBlock(config) if is_sparse_layer(config, layer_idx)
                              else GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)))

    def mix(self, h: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:
        return self.linear_attn(h, ctx) if hasattr(self, "linear_attn") else self.self_attn(h, cos_sin, ctx)


class Qwen3NextForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel.with_rope(
            config, lambda i, rotary: Qwen3NextDecoderLayer(config, i, rotary), rotary_cls=PartialRotary,
            offset=True))
