"""Gated DeltaNet mixer (Qwen3-Next linear attention) on jenga state pages, HF parameter names.

State of one layer: conv ``[2·H_k·d_k + H_v·d_v, K-1]`` over the concatenated q|k|v channels and
the recurrent state ``[H_v, d_k, d_v]``.  Per token (q, k L2-normalised, q scaled by ``d_k^-½``,
``β = σ(b)``, ``g = -e^{A_log}·softplus(a + dt_bias)``)::

    S ← e^{g} S;   u = β (v − Sᵀk);   S ← S + k uᵀ;   o = Sᵀq

:func:`chunk_delta_rule` is the chunked form for prefill: inside a chunk of ``L`` tokens with
cumulative decay ``Γ``, ``(I + A) U = βV − diag(β e^{Γ}) K S₀`` with ``A[t,s] = β_t e^{Γ_t−Γ_s} k_t·k_s``
(``s < t``) is solved by one unit-lower-triangular solve, then ``out = e^{Γ} Q S₀ + (QKᵀ ⊙ D) U`` and
``S = e^{Γ_L} S₀ + (K ⊙ e^{Γ_L−Γ})ᵀ U``; chunks in sequence.  Output: per-head RMSNorm, times
``weight``, times ``silu(z)``; ``out_proj``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.models.causal_conv import conv_scan, conv_step
from jenga.engine.models.common import activation, cfg

SCAN_CHUNK = 64


def chunk_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor,
                     chunk: int = SCAN_CHUNK) -> tuple[Tensor, Tensor]:
    """``q, k [n, H, dk]`` (normalised, q scaled), ``v [n, H, dv]``, ``g, beta [n, H]``, ``S [H, dk, dv]`` ->
    (``o [n, H, dv]``, final state)."""
    outs = []
    for a in range(0, q.shape[0], chunk):
        Q, K, V = (x[a:a + chunk].transpose(0, 1) for x in (q, k, v))  # [H, L, d]
        G, B = g[a:a + chunk].t(), beta[a:a + chunk].t()  # [H, L]
        L = Q.shape[1]
        cum = torch.cumsum(G, dim=1)  # [H, L]
        lower = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp((cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")))  # [H, t, s]
        strict = (B[:, :, None] * (K @ K.transpose(1, 2)) * decay).tril(-1)
        system = strict + torch.eye(L, dtype=q.dtype, device=q.device)
        rhs = torch.cat([B[:, :, None] * V, (B * cum.exp())[:, :, None] * K], dim=-1)
        sol = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        U = sol[..., :V.shape[-1]] - sol[..., V.shape[-1]:] @ S  # [H, L, dv]
        out = cum.exp()[:, :, None] * (Q @ S) + ((Q @ K.transpose(1, 2)) * decay) @ U
        S = cum[:, -1:, None].exp() * S + (K * (cum[:, -1:] - cum).exp()[:, :, None]).transpose(1, 2) @ U
        outs.append(out.transpose(0, 1))
    return torch.cat(outs), S


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNormOut(nn.Module):
    """``rmsnorm(o) · weight · silu(z)`` per head (HF ``Qwen3NextRMSNormGated``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o: Tensor, z: Tensor) -> Tensor:
        h = o.float()
        h = self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(o.dtype)
        return (h * F.silu(z.float())).to(o.dtype)


class GatedDeltaNet(nn.Module):
    """Qwen3-Next ``linear_attention`` layer (``in_proj_qkvz``, ``in_proj_ba``, ``conv1d``, ``dt_bias``,
    ``A_log``, ``norm``, ``out_proj``)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.hk, self.hv = config.linear_num_key_heads, config.linear_num_value_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.d_conv = config.linear_conv_kernel_dim
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = config.hidden_size
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.d_conv, groups=self.conv_dim,
                                padding=self.d_conv - 1, bias=False)
        self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = nn.Linear(hidden, 2 * self.hv, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedDeltaNormOut(self.dv, cfg(config, "rms_norm_eps", 1e-6))
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)
        self.act = activation(cfg(config, "hidden_act", "silu"))

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.conv_dim, self.d_conv - 1), (self.hv, self.dk, self.dv)

    def forward(self, x: Tensor, ctx) -> Tensor:
        T, r = x.shape[0], self.hv // self.hk
        qkvz = self.in_proj_qkvz(x).view(T, self.hk, 2 * self.dk + 2 * r * self.dv)  # grouped per key head
        q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
        b, a = torch.split(self.in_proj_ba(x).view(T, self.hk, 2 * r), [r, r], dim=-1)
        u = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1), b.reshape(T, -1), a.reshape(T, -1)], -1)
        o = ctx.run_state(self.layer_idx, u, self).view(T, self.hv, self.dv)
        o = self.norm(o.to(x.dtype), z.reshape(T, self.hv, self.dv))
        return self.out_proj(o.reshape(T, -1))

    def _inputs(self, qkv: Tensor, ba: Tensor):
        lead, r = qkv.shape[:-1], self.hv // self.hk
        q, k, v = torch.split(self.act(qkv).float(), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2_normalize(q.reshape(*lead, self.hk, self.dk)).repeat_interleave(r, dim=-2) * self.dk ** -0.5
        k = l2_normalize(k.reshape(*lead, self.hk, self.dk)).repeat_interleave(r, dim=-2)
        b, a = ba.float().split(self.hv, dim=-1)
        g = -self.A_log.float().exp() * F.softplus(a + self.dt_bias.float())
        return q, k, v.reshape(*lead, self.hv, self.dv), g, b.sigmoid()

    def state_scan(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, S = state
        qkv, conv = conv_scan(u[:, :self.conv_dim], conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        q, k, v, g, beta = self._inputs(qkv, u[:, self.conv_dim:])
        o, S = chunk_delta_rule(q, k, v, g, beta, S)
        return o.reshape(o.shape[0], -1), (conv, S)

    def state_step(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, S = state  # [R, conv_dim, K-1], [R, H, dk, dv]
        qkv, conv = conv_step(u[:, :self.conv_dim], conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        q, k, v, g, beta = self._inputs(qkv, u[:, self.conv_dim:])
        S = S * g.exp()[:, :, None, None]
        delta = beta[..., None] * (v - torch.einsum("rhkv,rhk->rhv", S, k))
        S = S + k[..., None] * delta[:, :, None, :]
        o = torch.einsum("rhkv,rhk->rhv", S, q)
        return o.reshape(o.shape[0], -1), (conv, S)
