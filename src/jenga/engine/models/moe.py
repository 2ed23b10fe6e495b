"""Top-k routed experts with HF's 3-D expert weights (``experts.gate_up_proj`` / ``experts.down_proj``).

Shared by Jamba (softmax router ``router``), Qwen3-Next and Qwen3-MoE (:class:`TopKRouter` as
``gate``, Qwen3-Next with a sigmoid-gated shared expert).  Every token goes to its ``k`` experts with
full capacity (no dropped tokens), as HF computes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.models.common import activation


class Experts(nn.Module):
    """``E`` gated MLP experts stored as ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``."""

    def __init__(self, num_experts: int, hidden: int, inter: int, act: str):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        self.act = activation(act)

    def forward(self, x: Tensor, top_idx: Tensor, top_w: Tensor) -> Tensor:
        """``x [T, H]``, ``top_idx / top_w [T, k]`` -> ``Σ_k w_k · expert_k(x)``."""
        out = torch.zeros_like(x)
        for e in torch.unique(top_idx).tolist():
            tok, slot = torch.nonzero(top_idx == e, as_tuple=True)
            gate, up = F.linear(x[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(self.act(gate) * up, self.down_proj[e]) * top_w[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out


def softmax_top_k(logits: Tensor, k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """``(indices, weights)`` of the top ``k`` softmax probabilities (fp32), optionally renormalised."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, idx = torch.topk(probs, k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return idx, w


class TopKRouter(nn.Module):
    """Softmax top-k router with HF's bare ``weight [E, H]`` (Qwen3-MoE / Qwen3-Next ``mlp.gate``)."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.renormalize = config.num_experts_per_tok, config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.num_experts, config.hidden_size))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return softmax_top_k(F.linear(x, self.weight), self.top_k, self.renormalize)
