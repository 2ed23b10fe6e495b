"""What one step reads and computes, from the *real* model's layer groups.

The bytes and FLOPs do not depend on the manager: every manager runs the same kernels, and
a sliding-window layer reads only its window even when a baseline keeps older tokens
(that is memory waste, not extra reads).  Per scheduled request with context end ``c``
(tokens attended after the step) and ``q`` new tokens, each group of ``L`` layers reads:

* attention over text (full, sliding window, chunked local): the tokens from where the group's
  footprint says the first new token reads (``Footprint.first_needed_array``: ``0``, the window's
  start, the chunk's start) to ``c``;
* Mamba / state: one state (``state_bytes x L``), independent of ``c``;
* cross-attention: the request's image tokens; vision embeddings: nothing (read at prefill).

Attention FLOPs use the same effective contexts: ``4 x H_q x D x q x (ctx_before + (q+1)/2)``
per attention layer.  Everything is vectorised over the batch with numpy.

In a model with cross-attention layers (mllama) image positions never enter the decoder's
self-attention: given the image positions in the context (``img_ctx``) and among the new
tokens (``img_new``), the other groups read and compute only text positions, and a
cross-attention layer costs ``text queries x image tokens``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jenga.core.policy.footprint import Footprint, footprint_for
from jenga.core.specs import (
    CacheSpec,
    CrossAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    VisionEmbeddingSpec,
)


@dataclass(frozen=True, slots=True)
class GroupCost:
    """A group's cost record; the class is how a kind's reads turn into bytes and FLOPs
    (``GROUP_COST`` picks it by spec type).  The base is attention over a token range: each
    request reads the tokens from where its group's footprint says its first new token reads
    (``Footprint.first_needed_array``: the whole context, a window, a chunk) to its end."""

    kind: str  # full | sliding | chunked | mamba | cross | vision
    bytes_per_token: int  # all layers of the group (0 for states)
    state_bytes: int  # all layers of the group (states only)
    num_layers: int
    window: int = 0  # sliding window or chunk size (the closed forms of ``jenga.sim.reproduce``)
    footprint: Footprint | None = None  # the group's, as its policy holds it

    #: the group's queries read image tokens (cross attention), not the text context
    reads_images = False

    def reads(self, end: np.ndarray, q: np.ndarray, img: np.ndarray) -> np.ndarray:
        """Tokens each request reads in this group (``end`` = context after the step)."""
        return end - self.footprint.first_needed_array(end - q)

    def step(self, qf: float, end: np.ndarray, q: np.ndarray, img: np.ndarray) -> tuple[float, float]:
        """``(kv_bytes_read, attention_flops)`` of this group for the step (``qf``: 4 x H_q x D)."""
        eff = self.reads(end, q, img)
        before = np.maximum(eff - q, 0)
        return float(eff.sum()) * self.bytes_per_token, qf * self.num_layers * float((q * (before + (q + 1) / 2)).sum())

    def needed(self, end: np.ndarray, one: np.ndarray, img: np.ndarray) -> float | None:
        """Bytes live requests hold usefully in this group (``one``: ones like ``end``); ``None``:
        not in the memory timeline."""
        return float(self.reads(end, one, img).sum()) * self.bytes_per_token


class ImageCost(GroupCost):
    """Cross attention: the request's image tokens, ``text queries x image tokens`` FLOPs."""

    __slots__ = ()
    reads_images = True

    def reads(self, end, q, img):
        return img

    def step(self, qf, end, q, img):
        return float(img.sum()) * self.bytes_per_token, qf * self.num_layers * float((q * img).sum())


class StateCost(GroupCost):
    """Mamba / state: one state per request, independent of the context; no attention FLOPs."""

    __slots__ = ()

    def step(self, qf, end, q, img):
        return self.state_bytes * len(end), 0.0

    def needed(self, end, one, img):
        return float(self.state_bytes * len(end))


class NoCost(GroupCost):
    """Vision embeddings: read at prefill only, outside the step's KV reads and the timeline."""

    __slots__ = ()

    def step(self, qf, end, q, img):
        return 0, 0.0

    def needed(self, end, one, img):
        return None


def _span(spec: CacheSpec) -> int:
    return next((x for x in spec.span() if x), 0)


#: spec type -> the cost record of group ``g`` (``n`` layers of spec ``s``; ``fp``: its footprint).
#: A kind's nearest registered base is used: every attention kind reads the token range its
#: footprint names.
GROUP_COST: dict[type, Callable[[CacheSpec, int, Footprint], GroupCost]] = {
    CacheSpec: lambda s, n, fp: GroupCost(s.kind, s.bytes_per_token() * n, 0, n, _span(s), fp),
    MambaSpec: lambda s, n, fp: StateCost(s.kind, 0, s.state_bytes() * n, n, 0, fp),
    VisionEmbeddingSpec: lambda s, n, fp: NoCost(s.kind, 0, 0, n, 0, fp),
    CrossAttentionSpec: lambda s, n, fp: ImageCost(s.kind, s.bytes_per_token() * n, 0, n, 0, fp),
}


def group_cost(gi: int, group: LayerGroup) -> GroupCost:
    """``GROUP_COST``'s record for group ``gi`` (exact spec type first, then its bases), with the
    footprint its policy holds (``jenga.core.policy.footprint.footprint_for``)."""
    spec = group.spec
    make = next(GROUP_COST[cls] for cls in type(spec).__mro__ if cls in GROUP_COST)
    return make(spec, group.num_layers, footprint_for(gi, group, group.tokens_per_page))


def group_costs(model: ModelSpec) -> list[GroupCost]:
    """One :class:`GroupCost` per group of ``model`` (whole model, not per TP rank)."""
    return [group_cost(gi, g) for gi, g in enumerate(model.groups)]


class StepCoster:
    """KV bytes read and attention FLOPs of one step for one model (see module docstring), each
    group asked through its cost record.  ``q_flops_per_layer`` = ``4 x H_q x D`` (query heads x
    head dim of the model).
    """

    def __init__(self, model: ModelSpec, num_q_heads: int, head_dim: int):
        self.groups = group_costs(model)
        self.qf = 4.0 * num_q_heads * head_dim
        self.images_in_cross = any(g.reads_images for g in self.groups)

    def kinds(self) -> list[str]:
        return sorted({g.kind for g in self.groups})

    def step(self, end: np.ndarray, q: np.ndarray, img: np.ndarray, img_ctx: np.ndarray | None = None,
             img_new: np.ndarray | None = None) -> tuple[float, float]:
        """``(kv_bytes_read, attention_flops)`` for requests with context ends ``end``, new
        tokens ``q`` and image tokens ``img`` (int64 arrays of equal length); ``img_ctx`` /
        ``img_new``: image positions before ``end`` / among the new tokens (see module doc)."""
        if self.images_in_cross and img_ctx is not None and img_new is not None:
            end, q = end - img_ctx, q - img_new  # text positions only
        kv = 0.0
        flops = 0.0
        for g in self.groups:
            gkv, gflops = g.step(self.qf, end, q, img)
            kv += gkv
            flops += gflops
        return kv, flops

    def needed_by_kind(self, end: np.ndarray, img: np.ndarray) -> dict[str, float]:
        """Bytes live requests hold usefully, by kind (for the memory timeline)."""
        out: dict[str, float] = {}
        one = np.ones_like(end)
        for g in self.groups:
            b = g.needed(end, one, img)
            if b is not None:
                out[g.kind] = out.get(g.kind, 0.0) + b
        return out
