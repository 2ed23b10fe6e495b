"""Nemotron-H (NVIDIA): a Mamba-2 attention hybrid, one mixer per block.

``config.layers_block_type[i]`` picks block ``i``'s mixer: ``linear_attention`` (Mamba-2 with
grouped gated RMSNorm), ``full_attention`` (no RoPE), ``mlp`` (``down(relu²(up(x)))``).
Every block is ``x + mixer(norm(x))``.  HF names: ``model.embeddings``, ``layers.i.norm``,
``layers.i.mixer``, ``model.norm_f``.  ``moe`` blocks (Nemotron-3 Nano / Super): a grouped
sigmoid router (:class:`NemotronHRouter`, DeepSeek-V3 style: the ``topk_group`` best of ``n_group``
expert groups, scores + ``e_score_correction_bias`` choose, plain scores weigh, optionally
renormalised, times ``routed_scaling_factor``) over non-gated relu² experts (``experts.up_proj
[E, I, d]`` / ``down_proj [E, d, I]``, ``d`` the ``moe_latent_size`` when set, reached through
``fc1_latent_proj`` / ``fc2_latent_proj``), plus a shared relu² MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import PagedAttentionBase, RMSNorm, attention_dims, cfg
from jenga.engine.models.decoder import DecoderModel
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.mamba2 import Mamba2Mixer
from jenga.errors import UnsupportedFeatureError


def relu2(x: Tensor) -> Tensor:
    return torch.relu(x).square()


class NemotronHMLP(nn.Module):
    def __init__(self, config, intermediate: int | None = None):
        super().__init__()
        bias, inter = cfg(config, "mlp_bias", False), intermediate or config.intermediate_size
        self.up_proj = nn.Linear(config.hidden_size, inter, bias=bias)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=bias)
        if cfg(config, "mlp_hidden_act", "relu2") != "relu2":
            raise UnsupportedFeatureError(f"Nemotron-H mlp_hidden_act {config.mlp_hidden_act!r}; supported: relu2")

    def forward(self, x: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        return self.down_proj(relu2(self.up_proj(x)))


class NemotronHRouter(nn.Module):
    """``(indices, weights)`` of each token's ``num_experts_per_tok`` experts (fp32)."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.groups, self.top_groups = config.num_experts_per_tok, config.n_group, config.topk_group
        self.renormalize, self.scale = config.norm_topk_prob, config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        scores = F.linear(x.float(), self.weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        by_group = choice.view(x.shape[0], self.groups, -1)
        best = by_group.topk(2, dim=-1)[0].sum(-1).topk(self.top_groups, dim=-1)[1]  # [T, topk_group]
        keep = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best, True)
        choice = choice.masked_fill(~keep.repeat_interleave(by_group.shape[-1], dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1)[1]
        w = scores.gather(1, idx)
        if self.renormalize:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scale


class NemotronHExperts(nn.Module):
    """Non-gated relu² experts ``down(relu²(up(x)))``, weights ``[E, I, d]`` / ``[E, d, I]``."""

    def __init__(self, num_experts: int, dim: int, inter: int):
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(num_experts, inter, dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, dim, inter))

    def forward(self, x: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        out = torch.zeros(x.shape, dtype=w.dtype, device=x.device)  # fp32 sum, as HF
        for e in torch.unique(idx).tolist():
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            y = F.linear(relu2(F.linear(x[tok], self.up_proj[e])), self.down_proj[e])
            out.index_add_(0, tok, (y * w[tok, slot, None]).to(out.dtype))
        return out.to(x.dtype)


class NemotronHMoE(nn.Module):
    def __init__(self, config):
        super().__init__()
        latent = cfg(config, "moe_latent_size")
        self.gate = NemotronHRouter(config)
        self.experts = NemotronHExperts(config.n_routed_experts, latent or config.hidden_size,
                                        config.moe_intermediate_size)
        self.shared_experts = NemotronHMLP(config, config.moe_shared_expert_intermediate_size)
        if latent is not None:
            bias = cfg(config, "mlp_bias", False)
            self.fc1_latent_proj = nn.Linear(config.hidden_size, latent, bias=bias)
            self.fc2_latent_proj = nn.Linear(latent, config.hidden_size, bias=bias)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        idx, w = self.gate(x)
        h = self.fc1_latent_proj(x) if hasattr(self, "fc1_latent_proj") else x
        h = self.experts(h, idx, w)
        h = self.fc2_latent_proj(h) if hasattr(self, "fc2_latent_proj") else h
        return h + self.shared_experts(x)


class NemotronHAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int):
        super().__init__(layer_idx, *attention_dims(config), bias=cfg(config, "attention_bias", False))

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return self.attend(ctx, *self.project(x))


def nemotron_mamba2(config, layer_idx: int) -> Mamba2Mixer:
    return Mamba2Mixer(layer_idx, hidden=config.hidden_size, heads=config.mamba_num_heads,
                       head_dim=config.mamba_head_dim, groups=config.n_groups, d_state=config.ssm_state_size,
                       d_conv=config.conv_kernel, conv_bias=config.use_conv_bias, proj_bias=config.use_bias,
                       eps=config.layer_norm_epsilon, norm_groups=config.n_groups,
                       dt_limit=(config.time_step_min, float("inf")),
                       act=config.mamba_hidden_act)


class NemotronHBlock(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        kind = config.layers_block_type[layer_idx]
        self.norm = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        if kind == "linear_attention":
            self.mixer = nemotron_mamba2(config, layer_idx)
        elif kind == "full_attention":
            self.mixer = NemotronHAttention(config, layer_idx)
        elif kind == "mlp":
            self.mixer = NemotronHMLP(config)
        elif kind == "moe":
            self.mixer = NemotronHMoE(config)
        else:
            raise UnsupportedFeatureError(f"Nemotron-H block type {kind!r} (layer {layer_idx}); supported: "
                                          "linear_attention, full_attention, mlp, moe")

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:  # no RoPE: cos_sin is None
        return x + self.mixer(self.norm(x), ctx)


class NemotronHForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config, DecoderModel(
            config, lambda i: NemotronHBlock(config, i), RMSNorm(config.hidden_size, config.layer_norm_epsilon),
            embed_name="embeddings", norm_name="norm_f"))
