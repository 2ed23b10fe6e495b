"""Speculative verification: which draft tokens a target keeps, and the token after them.

One request, ``k`` draft tokens ``d_1..d_k`` proposed from distributions ``q_1..q_k`` and the
target's distributions ``p_1..p_{k+1}`` from one forward over ``[last, d_1..d_k]``:

* greedy: keep ``d_i`` while it is the target's argmax, then emit the target's argmax at the
  first disagreement (or ``p_{k+1}``'s after all ``k``): exactly the target's own greedy tokens;
* sampling (Leviathan et al. / Chen et al., 2023): keep ``d_i`` with probability
  ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection emit a sample of
  ``normalize(max(0, p_i - q_i))``; after ``k`` acceptances a sample of ``p_{k+1}``.  Every
  emitted token is then distributed as the target alone would sample it.

:func:`verify` returns the emitted tokens (the kept drafts, then one more): 1 to ``k + 1``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def verify_greedy(target_logits: Tensor, drafts: list[int]) -> list[int]:
    """``target_logits: [k + 1, V]`` -> the kept drafts and the target's next argmax."""
    best = target_logits.argmax(dim=-1).tolist()
    out = []
    for i, d in enumerate(drafts):
        if best[i] != d:
            break
        out.append(d)
    out.append(best[len(out)])
    return out


def verify(p: Tensor, q: Tensor, drafts: list[int], generator: torch.Generator | None = None) -> list[int]:
    """Rejection sampling: ``p: [k + 1, V]`` target and ``q: [k, V]`` draft probabilities."""
    k = len(drafts)
    if k:
        idx = torch.arange(k, device=p.device)
        d = torch.tensor(drafts, device=p.device)
        ratio = p[idx, d] / q[idx, d].clamp_min(1e-30)
        u = torch.rand(k, generator=generator, device=p.device)
        reject = (u >= ratio).tolist()
    out: list[int] = []
    for i in range(k):
        if reject[i]:
            residual = (p[i] - q[i]).clamp_min(0)
            total = float(residual.sum())
            dist = residual / total if total > 0 else p[i]  # p == q: nothing to correct
            out.append(int(torch.multinomial(dist, 1, generator=generator)))
            return out
        out.append(drafts[i])
    out.append(int(torch.multinomial(p[k], 1, generator=generator)))
    return out


def draw(q: Tensor, generator: torch.Generator | None = None) -> int:
    """One token from the distribution ``q: [V]`` (the draft's proposal)."""
    return int(torch.multinomial(q, 1, generator=generator))
