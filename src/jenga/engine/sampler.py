"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeded generators.

:func:`sample` takes one logits row per request and returns one token per row.  All math is
batched; the only per-request Python work is drawing noise from each seeded request's own
``torch.Generator`` (so its stream does not depend on batching or preemption).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from jenga.sched.sampling_params import SamplingParams


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The private generator of a seeded, non-greedy request (else ``None``)."""
    if params.seed is None or params.greedy:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def _filter_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p sets.  ``top_k <= 0`` = off."""
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(V, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of strictly more likely tokens
    drop |= before >= top_p[:, None]
    drop[:, 0] = False  # always keep the most likely token
    mask = torch.zeros_like(drop).scatter(1, order, drop)
    return logits.masked_fill(mask, float("-inf"))


def probabilities(logits: Tensor, params: Sequence[SamplingParams]) -> Tensor:
    """``[N, V]`` fp32 sampling distribution of each row: logits / temperature, restricted to
    the row's top-k and top-p sets (greedy rows use temperature 1; callers take their argmax)."""
    dev = logits.device
    temp = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    scaled = logits.float() / temp[:, None]
    if bool((top_k > 0).any()) or bool((top_p < 1.0).any()):
        scaled = _filter_top_k_top_p(scaled, top_k, top_p)
    return scaled.softmax(dim=-1)


def sample(logits: Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
           default_generator: torch.Generator | None = None) -> Tensor:
    """One token id per row of ``logits: [N, V]`` (returned as a ``[N]`` long tensor).

    Rows whose params are greedy take the argmax; the rest are sampled with the exponential
    trick (``argmax(p / q)``, ``q ~ Exp(1)``), the noise drawn from ``generators[i]`` when
    given, else from ``default_generator``.
    """
    N, V = logits.shape
    logits = logits.float()
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    argmax = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return argmax
    dev = logits.device
    probs = probabilities(logits, params)
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        noise[shared] = torch.empty(len(shared), V, device=dev).exponential_(generator=default_generator)
    for i, g in enumerate(generators):  # per request (not per token): private RNG streams
        if g is not None:
            noise[i] = torch.empty(V, device=dev).exponential_(generator=g)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(greedy, argmax, sampled)
