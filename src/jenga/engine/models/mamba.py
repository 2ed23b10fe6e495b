"""Mamba-1 selective-state-space mixer (Jamba's, HF parameter names) on jenga state pages.

State of one layer (the ``MambaSpec`` shapes ``structure.py`` builds): conv ``[D, K-1]`` and
SSM ``[D, N]`` with ``D = mamba_expand · hidden`` and ``N = mamba_d_state``.  The mixer never
holds a cache: :meth:`forward` hands its per-token projections to ``ctx.run_state``, which
calls :meth:`state_scan` (prefill segments: a chunked scan, any length) or :meth:`state_step`
(one token of many requests: the recurrence) with the state read from the request's page.

The chunked scan: ``h_t = e^{Δ_t A} h_{t-1} + Δ_t B_t x_t`` is a first-order linear recurrence
with a per-(channel, state) decay, so inside a chunk it is an inclusive parallel scan of the pairs
``(e^{Δ_t A}, Δ_t B_t x_t)`` in ``log2 L`` vectorised steps (products of decays only shrink: no
overflow); the state after a chunk seeds the next.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from jenga.engine.models.causal_conv import conv_scan, conv_step
from jenga.engine.models.common import RMSNorm, activation, cfg

SCAN_CHUNK = 256


def selective_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, h: Tensor,
                   chunk: int = SCAN_CHUNK) -> tuple[Tensor, Tensor]:
    """``x, dt [n, D]``, ``A [D, N]``, ``B, C [n, N]``, ``h [D, N]`` -> (``y [n, D]`` without the
    skip term, final state)."""
    ys = []
    for a in range(0, x.shape[0], chunk):
        ds = dt[a:a + chunk]
        decay = torch.exp(ds[:, :, None] * A)  # [L, D, N], each <= 1
        hs = ds[:, :, None] * B[a:a + chunk, None, :] * x[a:a + chunk, :, None]  # [L, D, N]
        hs[0] += decay[0] * h
        k = 1
        while k < hs.shape[0]:  # Hillis-Steele: (A_t, b_t) ∘ (A_{t-k}, b_{t-k}), log2(L) steps
            hs[k:] = torch.addcmul(hs[k:], decay[k:], hs[:-k])
            decay[k:] = decay[k:] * decay[:-k]
            k *= 2
        ys.append(torch.einsum("tdn,tn->td", hs, C[a:a + chunk]))
        h = hs[-1]
    return torch.cat(ys), h


class MambaMixer(nn.Module):
    """Jamba's ``JambaMambaMixer``: in_proj -> causal conv -> x_proj (dt, B, C; RMS-normed) ->
    selective scan -> gate -> out_proj."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        hidden = config.hidden_size
        self.d_inner = config.mamba_expand * hidden
        self.d_state, self.d_conv, self.dt_rank = config.mamba_d_state, config.mamba_d_conv, config.mamba_dt_rank
        D, N = self.d_inner, self.d_state
        self.conv1d = nn.Conv1d(D, D, self.d_conv, groups=D, padding=self.d_conv - 1,
                                bias=cfg(config, "mamba_conv_bias", True))
        self.in_proj = nn.Linear(hidden, 2 * D, bias=cfg(config, "mamba_proj_bias", False))
        self.x_proj = nn.Linear(D, self.dt_rank + 2 * N, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, D, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).expand(D, N).clone())
        self.D = nn.Parameter(torch.ones(D))
        self.out_proj = nn.Linear(D, hidden, bias=cfg(config, "mamba_proj_bias", False))
        eps = cfg(config, "rms_norm_eps", 1e-6)
        self.dt_layernorm = RMSNorm(self.dt_rank, eps)
        self.b_layernorm = RMSNorm(N, eps)
        self.c_layernorm = RMSNorm(N, eps)
        self.act = activation(cfg(config, "hidden_act", "silu"))

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        return (self.d_inner, self.d_conv - 1), (self.d_inner, self.d_state)

    def forward(self, x: Tensor, ctx) -> Tensor:
        y = ctx.run_state(self.layer_idx, self.in_proj(x), self)
        return self.out_proj(y.to(x.dtype))

    def _ssm_inputs(self, xc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dt, B, C = torch.split(self.x_proj(xc), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(self.dt_proj(self.dt_layernorm(dt)).float())
        return dt, self.b_layernorm(B).float(), self.c_layernorm(C).float()

    def state_scan(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, h = state
        xs, z = u.chunk(2, dim=-1)
        xc, conv = conv_scan(xs, conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        xc = self.act(xc)
        dt, B, C = self._ssm_inputs(xc)
        A = -torch.exp(self.A_log.float())
        y, h = selective_scan(xc.float(), dt, A, B, C, h)
        y = (y + xc.float() * self.D.float()) * F.silu(z.float())
        return y, (conv, h)

    def state_step(self, u: Tensor, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        conv, h = state  # [R, D, K-1], [R, D, N]
        xs, z = u.chunk(2, dim=-1)
        xc, conv = conv_step(xs, conv, self.conv1d.weight[:, 0], self.conv1d.bias)
        xc = self.act(xc)
        dt, B, C = self._ssm_inputs(xc)
        A = -torch.exp(self.A_log.float())
        h = torch.exp(dt[:, :, None] * A) * h + dt[:, :, None] * B[:, None, :] * xc.float()[:, :, None]
        y = torch.einsum("rdn,rn->rd", h, C)
        y = (y + xc.float() * self.D.float()) * F.silu(z.float())
        return y, (conv, h)
