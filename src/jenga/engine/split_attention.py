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


def decode_attention(q: Tensor, kv_view: Tensor, meta: AttentionMetadata, *, scale: float,
                     window: int | None = None, chunk: int | None = None, softcap: float | None = None) -> Tensor:
    """:func:`paged_attention` for a part where every request has exactly one query token.

    Same contract and result; cheaper on CPU: K and V are gathered with ``index_select``
    straight into ``[R, K, H, D]``, the mask is applied to the ``[R, G, K]`` scores of each KV
    head (one batched matmul per head, no transposed copies), and only invalid V rows are
    zeroed (garbage there, even NaN, must not reach the output).
    """
    R, P = meta.block_tables.shape
    B, H, D = kv_view.shape[2], kv_view.shape[3], kv_view.shape[4]
    Hq = q.shape[1]
    G, K = Hq // H, P * B
    pages = meta.block_tables.reshape(-1)
    k = torch.index_select(kv_view[:, 0], 0, pages).view(R, K, H, D).to(q.dtype)
    v = torch.index_select(kv_view[:, 1], 0, pages).view(R, K, H, D).to(q.dtype)
    qpos = meta.query_positions[:, None]
    kpos = meta.key_positions()
    valid = meta.key_valid() & (kpos <= qpos)
    if window is not None:
        valid &= kpos > qpos - window
    if chunk is not None:
        valid &= torch.div(kpos, chunk, rounding_mode="floor") == torch.div(qpos, chunk, rounding_mode="floor")
    invalid = ~valid
    v[invalid] = 0.0
    q = q.view(R, H, G, D)
    out = q.new_empty(R, H, G, D)
    for h in range(H):  # per KV head: [R, G, D] x [R, D, K] without copying K
        s = torch.bmm(q[:, h], k[:, :, h].transpose(1, 2)) * scale
        if softcap is not None:
            s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(invalid[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        out[:, h] = torch.bmm(p, v[:, :, h])
    return out.view(R, Hq, D)


def _attend(q: Tensor, kv_view: Tensor, meta: AttentionMetadata, **kw) -> Tensor:
    if meta.max_query_len == 1:
        if meta.window is not None and (kw["window"] is None or kw["window"] > meta.window):
            raise ValueError(f"metadata trimmed for window {meta.window}, attention asked for {kw['window']}")
        if meta.chunk is not None and kw["chunk"] != meta.chunk:
            raise ValueError(f"metadata trimmed for chunk {meta.chunk}, attention asked for {kw['chunk']}")
        return decode_attention(q, kv_view, meta, **kw)
    return paged_attention(q, kv_view, meta, **kw)


class SplitAttentionBackend:
    """``write_kv`` for all tokens at once, attention part by part (decode part: :func:`decode_attention`)."""

    write_kv = staticmethod(write_kv)

    @staticmethod
    def paged_attention(q: Tensor, kv_view: Tensor, meta, *, scale: float, window: int | None = None,
                        chunk: int | None = None, softcap: float | None = None) -> Tensor:
        kw = dict(scale=scale, window=window, chunk=chunk, softcap=softcap)
        if isinstance(meta, AttentionMetadata):
            return _attend(q, kv_view, meta, **kw)
        if len(meta.parts) == 1:
            return _attend(q, kv_view, meta.parts[0][2], **kw)
        return torch.cat([_attend(q[a:b], kv_view, m, **kw) for a, b, m in meta.parts])
