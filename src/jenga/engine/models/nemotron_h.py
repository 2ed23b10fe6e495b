"""Nemotron-H (NVIDIA): a Mamba-2 attention hybrid, one mixer per block.

``config.layers_block_type[i]`` picks block ``i``'s mixer: ``linear_attention`` (Mamba-2 with
grouped gated RMSNorm), ``full_attention`` (no RoPE), ``mlp`` (``down(relu²(up(x)))``).
Every block is ``x + mixer(norm(x))``.  HF names: ``model.embeddings``, ``layers.i.norm``,
``layers.i.mixer``, ``model.norm_f``.  ``moe`` blocks (Nemotron-3 Nano's grouped sigmoid router)
are not supported yet and raise ``UnsupportedFeatureError``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import PagedAttentionBase, RMSNorm, cfg
from jenga.engine.models.hybrid import HybridCausalLM
from jenga.engine.models.mamba2 import Mamba2Mixer
from jenga.errors import UnsupportedFeatureError


class NemotronHMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias = cfg(config, "mlp_bias", False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if cfg(config, "mlp_hidden_act", "relu2") != "relu2":
            raise UnsupportedFeatureError(f"Nemotron-H mlp_hidden_act {config.mlp_hidden_act!r}; supported: relu2")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class NemotronHAttention(PagedAttentionBase):
    def __init__(self, config, layer_idx: int):
        head_dim = cfg(config, "head_dim", config.hidden_size // config.num_attention_heads)
        super().__init__(layer_idx, config.hidden_size, config.num_attention_heads,
                         cfg(config, "num_key_value_heads", config.num_attention_heads), head_dim,
                         bias=cfg(config, "attention_bias", False))

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
        else:
            raise UnsupportedFeatureError(f"Nemotron-H block type {kind!r} (layer {layer_idx}); supported: "
                                      "linear_attention, full_attention, mlp")

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return x + self.mixer(self.norm(x), ctx)


class NemotronHModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon)

    @property
    def embed_tokens(self) -> nn.Embedding:  # the name PagedCausalLM ties lm_head to
        return self.embeddings

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext) -> Tensor:
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, ctx)
        return self.norm_f(x)


class NemotronHForCausalLM(HybridCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model = NemotronHModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights_if_needed()
