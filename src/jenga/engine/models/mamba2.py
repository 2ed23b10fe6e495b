"""Mamba-2 (SSD) mixer on jenga state pages, HF parameter names (Nemotron-H / Falcon-H1 style).

State of one layer: conv ``[I + 2·G·N, K-1]`` and SSM ``[H, P, N]`` (``I = H·P`` inner width,
``G`` B/C groups, ``N`` state size), as ``structure.py`` sizes them.  ``in_proj`` gives
``[gate I | xBC I+2GN | dt H]``; xBC goes through the causal conv; the scan has one scalar decay
per head, ``h_t = e^{Δ_t A} h_{t-1} + Δ_t x_t ⊗ B_t``, ``y_t = C_t · h_t + D x_t``; then the
gated RMSNorm (per group of ``I / norm_groups`` channels) or a plain ``silu(gate)`` product.

:func:`ssd_scan` is the chunked form for prefill (quadratic inside a chunk, the state passed
between chunks, any length); :meth:`Mamba2Mixer.state_step` the recurrence for decode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.models.causal_conv import conv_scan, conv_step
from jenga.engine.models.common import activation

SCAN_CHUNK = 64


def ssd_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor,
             chunk: int = SCAN_CHUNK) -> tuple[Tensor, Tensor]:
    """``x [n, H, P]``, ``dt [n, H]``, ``A [H]``, ``B, C [n, H, N]``, ``h [H, P, N]`` ->
    (``y [n, H, P]`` without the skip term, final state)."""
    ys = []
    for a in range(0, x.shape[0], chunk):
        xs, ds, Bs, Cs = x[a:a + chunk], dt[a:a + chunk], B[a:a + chunk], C[a:a + chunk]
        L = xs.shape[0]
        cum = torch.cumsum(ds * A, dim=0)  # [L, H], decreasing
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
        decay = torch.exp((cum[:, None] - cum[None, :]).masked_fill(~causal[:, :, None], float("-inf")))
        scores = torch.einsum("thn,shn->tsh", Cs, Bs) * decay  # [t, s, H]
        dx = ds[:, :, None] * xs  # [L, H, P]
        y = torch.einsum("tsh,shp->thp", scores, dx) + torch.exp(cum)[:, :, None] * torch.einsum("thn,hpn->thp", Cs, h)
        to_end = torch.exp(cum[-1] - cum)  # [L, H]
        h = torch.exp(cum[-1])[:, None, None] * h + torch.einsum("sh,shp,shn->hpn", to_end, dx, Bs)
        ys.append(y)
    return torch.cat(ys), h


class GatedRMSNorm(nn.Module):
    """``rmsnorm(y · silu(gate))`` per group of ``group_size`` channels, times ``weight`` (HF's
    ``MambaRMSNormGated`` / ``Zamba2RMSNormGated``); ``norm_before_gate``: ``rmsnorm(y) · weight ·
    silu(gate)`` (Falcon-H1's option)."""

    def __init__(self, dim: int, group_size: int, eps: float, norm_before_gate: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.group_size, self.eps, self.norm_before_gate = group_size, eps, norm_before_gate

    def forward(self, y: Tensor, gate: Tensor) -> Tensor:
        h = y.float() if self.norm_before_gate else y.float() * F.silu(gate.float())
        g = h.view(*h.shape[:-1], -1, self.group_size)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.norm_before_gate:
            return (self.weight * g.view(h.shape) * F.silu(gate.float())).to(y.dtype)
        return self.weight * g.view(h.shape).to(y.dtype)


class Mamba2Mixer(nn.Module):
    """One Mamba-2 layer; family classes pass their config's sizes (see :func:`mamba2_sizes`)."""

    def __init__(self, layer_idx: int, *, hidden: int, heads: int, head_dim: int, groups: int, d_state: int,
                 d_conv: int, conv_bias: bool, proj_bias: bool, eps: float, norm_groups: int | None,
                 norm_before_gate: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                 out_bias: bool | None = None, act: str = "silu"):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.head_dim, self.groups, self.d_state, self.d_conv = heads, head_dim, groups, d_state, d_conv
        self.inner = heads * head_dim
        self.conv_dim = self.inner + 2 * groups * d_state
        self.dt_min, self.dt_max = float(dt_limit[0]), float(dt_limit[1])
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1,
                                bias=conv_bias)
        self.in_proj = nn.Linear(hidden, self.inner + self.conv_dim + heads, bias=proj_bias)
        self.dt_bias = nn.Parameter(torch.ones(heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
        self.D = nn.Parameter(torch.ones(heads))
        if norm_groups is not None:
            self.norm = GatedRMSNorm(self.inner, self.inner // norm_groups, eps, norm_before_gate)
        self.out_proj = nn.Linear(self.inner, hidden, bias=proj_bias if out_bias is None else out_bias)
        self.act = activation(act)

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.conv_dim, self.d_conv - 1), (self.heads, self.head_dim, self.d_state)

    def forward(self, x: Tensor, ctx, proj_scale: Tensor | None = None) -> Tensor:
        u = self.in_proj(x)
        if proj_scale is not None:  # Falcon-H1's muP multipliers on the projection
            u = u * proj_scale
        gate = u[:, :self.inner]
        y = ctx.run_state(self.layer_idx, u[:, self.inner:], self)
        if hasattr(self, "norm"):
            y = self.norm(y.to(x.dtype), gate)
        else:
            y = (y * F.silu(gate.float())).to(x.dtype)
        return self.out_proj(y)

    def _split(self, xc: Tensor, dt: Tensor):
        """Conv output ``[..., conv_dim]`` and raw dt -> x ``[..., H, P]``, B, C ``[..., H, N]``, dt ``[..., H]``."""
        lead = xc.shape[:-1]
        xs, B, C = torch.split(xc.float(), [self.inner, self.groups * self.d_state, self.groups * self.d_state], -1)
        rep = self.heads // self.groups
        B = B.reshape(*lead, self.groups, self.d_state).repeat_interleave(rep, dim=-2)
        C = C.reshape(*lead, self.groups, self.d_state).repeat_interleave(rep, dim=-2)
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(min=self.dt_min, max=self.dt_max)
        return xs.reshape(*lead, self.heads, self.head_dim), B, C, dt

    def state_scan(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, h = state
        xbc, dt = u[:, :self.conv_dim], u[:, self.conv_dim:]
        xc, conv = conv_scan(xbc, conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        xs, B, C, dt = self._split(self.act(xc), dt)
        y, h = ssd_scan(xs, dt, -torch.exp(self.A_log.float()), B, C, h)
        y = y + self.D.float()[:, None] * xs
        return y.reshape(y.shape[0], -1), (conv, h)

    def state_step(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, h = state  # [R, conv_dim, K-1], [R, H, P, N]
        xbc, dt = u[:, :self.conv_dim], u[:, self.conv_dim:]
        xc, conv = conv_step(xbc, conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        xs, B, C, dt = self._split(self.act(xc), dt)
        dA = torch.exp(dt * -torch.exp(self.A_log.float()))  # [R, H]
        h = dA[:, :, None, None] * h + (dt[:, :, None] * xs)[..., None] * B[:, :, None, :]
        y = torch.einsum("rhpn,rhn->rhp", h, C) + self.D.float()[:, None] * xs
        return y.reshape(y.shape[0], -1), (conv, h)
