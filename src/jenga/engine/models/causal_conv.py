"""Depthwise causal conv1d with its state carried in a state page (Mamba-1/2, Gated DeltaNet).

The conv state of a layer is ``[C, K - 1]``: the last ``K - 1`` inputs before the next token
(zeros before position 0), channels first like HF's cache.  ``weight`` is HF's
``conv1d.weight`` squeezed to ``[C, K]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def conv_scan(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """``x [n, C]`` after ``state [C, K-1]`` -> (conv output ``[n, C]``, state after the ``n`` tokens)."""
    C, K = weight.shape
    full = torch.cat([state.to(x.dtype), x.t()], dim=1)  # [C, K-1+n]
    y = F.conv1d(full[None], weight[:, None, :].to(x.dtype), bias, groups=C)[0]  # [C, n]
    return y.t(), full[:, full.shape[1] - (K - 1):]


def conv_step(x: Tensor, state: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """One token per request: ``x [R, C]``, ``state [R, C, K-1]`` -> (``[R, C]``, new state)."""
    full = torch.cat([state.to(x.dtype), x[:, :, None]], dim=-1)  # [R, C, K]
    y = (full * weight.to(x.dtype)).sum(-1)
    if bias is not None:
        y = y + bias
    return y, full[:, :, 1:]
