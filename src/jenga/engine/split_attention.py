"""Attention backend that runs decode and prefill requests of one step separately.

The reference :func:`~jenga.engine.attention.paged_attention` pads every request's queries to
the step's longest query block, so one 512-token prefill chunk next to 30 decodes would cost
30 x 512 query rows.  Engines use separate decode / prefill kernels for this reason; here the
model runner orders a step's requests decodes-first and describes each contiguous part with
its own :class:`AttentionMetadata`, wrapped in :class:`SplitMetadata`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from jenga.engine.attention import AttentionMetadata, paged_attention, write_kv


@dataclass
class SplitMetadata:
    """``parts[i] = (first token, end token, metadata of those tokens' requests)``; the parts
    tile ``[0, T)`` in order.  ``slot_mapping`` covers all ``T`` tokens (for the K/V write)."""

    slot_mapping: Tensor
    parts: list[tuple[int, int, AttentionMetadata]]


class SplitAttentionBackend:
    """``write_kv`` for all tokens at once, ``paged_attention`` part by part."""

    write_kv = staticmethod(write_kv)

    @staticmethod
    def paged_attention(q: Tensor, kv_view: Tensor, meta, *, scale: float, window: int | None = None,
                        chunk: int | None = None, softcap: float | None = None) -> Tensor:
        if isinstance(meta, AttentionMetadata):
            return paged_attention(q, kv_view, meta, scale=scale, window=window, chunk=chunk, softcap=softcap)
        if len(meta.parts) == 1:
            return paged_attention(q, kv_view, meta.parts[0][2], scale=scale, window=window, chunk=chunk,
                                   softcap=softcap)
        return torch.cat([paged_attention(q[a:b], kv_view, m, scale=scale, window=window, chunk=chunk,
                                          softcap=softcap) for a, b, m in meta.parts])
