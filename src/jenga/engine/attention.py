"""Paged attention over jenga's per-layer exec views (pure torch reference backend).

Contract (see ``docs/memory-layout.md``):

* ``kv_view``: ``Tensor[E, 2, B, H_kv, D]`` for one layer; exec page ``x`` holds K in
  ``kv_view[x, 0]`` and V in ``kv_view[x, 1]`` for the ``B`` tokens of that page. The page stride
  may be larger than ``2·B·H·D`` elements (padded pages); nothing here assumes contiguity.
* A write slot is ``exec_page · B + offset``: token position ``t`` of a request goes to slot
  ``page_ids[t // B] · B + t % B`` where ``page_ids`` are exec page ids (``s · n_g``); slot
  ``-1`` writes nothing (``TokenTable.write_from``: the K/V is in a shared cached page).
* Page ids are ``None`` where the manager does not hold the page (left the sliding window,
  earlier chunk). Such pages are never read: they are trimmed off the block table or replaced
  by ``pad_page`` and masked; garbage bytes in the buffer (other groups' data, NaN patterns)
  never reach the output because invalid keys and values are zeroed before the matmul.

Everything a kernel needs for one layer group and one step lives in :class:`AttentionMetadata`;
build it with :func:`build_attention_metadata`. Models never call the functions directly but go
through :class:`ForwardContext.attend`, so a CUDA backend (FlashInfer) only has to implement
:class:`AttentionBackend` (``write_kv`` + ``paged_attention``) on the same metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class AttentionMetadata:
    """Per-step, per-group description of a ragged batch of queries over paged K/V.

    Request ``r`` has ``query_lens[r]`` new tokens at positions ``[context_lens[r] - query_lens[r],
    context_lens[r])``; their K/V are written this step, then every new token attends to the
    cached tokens ``<= its position`` (further restricted by window / chunk).

    ``block_tables[r, c]`` is the exec page holding the request's *logical* page
    ``page_offsets[r] + c``; only pages a query may see are listed (``page_offsets`` skips the
    pages left of the window / chunk). ``page_held[r, c]`` is False for padding columns, whose
    id is ``pad_page`` and whose contents are ignored.

    ``window`` / ``chunk`` record what the table was trimmed for: attention with a wider view
    than that would miss pages, so :func:`paged_attention` rejects it.
    """

    page_size: int
    block_tables: Tensor  # [R, P] long, exec page ids
    page_offsets: Tensor  # [R] long, logical page index of column 0
    page_held: Tensor  # [R, P] bool
    context_lens: Tensor  # [R] long, cached tokens after this step's writes
    query_start_loc: Tensor  # [R + 1] long, cumulative query lengths
    query_positions: Tensor  # [T] long, absolute position of each new token
    query_req: Tensor  # [T] long, request index of each new token
    query_local: Tensor  # [T] long, index of the token inside its request's query block
    slot_mapping: Tensor  # [T] long, write slot of each new token
    max_query_len: int
    window: int | None = None
    chunk: int | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_reqs(self) -> int:
        return int(self.block_tables.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.query_positions.shape[0])

    def key_positions(self) -> Tensor:
        """``[R, P·B]`` absolute position of every gathered key slot."""
        if "key_pos" not in self._cache:
            R, P = self.block_tables.shape
            B = self.page_size
            dev = self.block_tables.device
            pages = self.page_offsets[:, None] + torch.arange(P, device=dev)[None, :]
            pos = pages[:, :, None] * B + torch.arange(B, device=dev)[None, None, :]
            self._cache["key_pos"] = pos.reshape(R, P * B)
        return self._cache["key_pos"]

    def key_valid(self) -> Tensor:
        """``[R, P·B]`` True where the gathered slot holds a cached token of the request."""
        if "key_valid" not in self._cache:
            held = self.page_held.repeat_interleave(self.page_size, dim=1)
            self._cache["key_valid"] = held & (self.key_positions() < self.context_lens[:, None])
        return self._cache["key_valid"]

    def mask(self, window: int | None = None, chunk: int | None = None) -> Tensor:
        """``[R, 1, Qmax, P·B]`` bool, True where query may attend key (cached per window/chunk).

        Padding query rows (beyond a request's query length) attend everything so that the
        softmax stays finite; their outputs are dropped.
        """
        key = ("mask", window, chunk)
        if key not in self._cache:
            R, Q = self.num_reqs, self.max_query_len
            dev = self.block_tables.device
            qpos = torch.full((R, Q), -1, dtype=torch.long, device=dev)
            qpos[self.query_req, self.query_local] = self.query_positions
            kpos = self.key_positions()[:, None, :]
            q = qpos[:, :, None]
            m = self.key_valid()[:, None, :] & (kpos <= q)
            if window is not None:
                m &= kpos > q - window
            if chunk is not None:
                m &= torch.div(kpos, chunk, rounding_mode="floor") == torch.div(q, chunk, rounding_mode="floor")
            m |= (q < 0)
            self._cache[key] = m[:, None]
        return self._cache[key]


def build_attention_metadata(
    page_ids: Sequence[Sequence[int | None]],
    num_computed: Sequence[int],
    num_new: Sequence[int],
    page_size: int,
    *,
    window: int | None = None,
    chunk: int | None = None,
    pad_page: int = 0,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Metadata for one group and one step from plain python inputs.

    ``page_ids[r]`` lists request ``r``'s **exec** page ids by logical page (``None`` = not held);
    it must cover every token up to ``num_computed[r] + num_new[r]``. ``num_computed[r]`` tokens
    are already cached, ``num_new[r] >= 1`` are written and attended this step.

    With ``window`` (sliding, token ``p`` sees ``(p - window, p]``) or ``chunk`` (chunked local,
    sees its ``chunk``-aligned chunk) only the pages some new token can see are put in the block
    table. A ``None`` inside that range, or a missing page for a new token, raises ``ValueError``.
    """
    R = len(page_ids)
    if not (R == len(num_computed) == len(num_new)) or R == 0:
        raise ValueError(f"need one entry per request, got {R} / {len(num_computed)} / {len(num_new)}")
    if min(num_new) < 1 or min(num_computed) < 0:
        raise ValueError(f"num_new must be >= 1 and num_computed >= 0, got {num_new} / {num_computed}")
    B = page_size
    width = max(1, max(len(p) for p in page_ids))
    full = torch.full((R, width), -1, dtype=torch.long)
    for r, ids in enumerate(page_ids):  # per-request: list -> padded row
        if ids:
            full[r, : len(ids)] = torch.tensor([-1 if x is None else x for x in ids], dtype=torch.long)
    computed = torch.tensor(list(num_computed), dtype=torch.long)
    new = torch.tensor(list(num_new), dtype=torch.long)
    ctx = computed + new
    last_page = (ctx - 1) // B
    if bool((last_page >= width).any()):
        r = int(torch.nonzero(last_page >= width)[0, 0])
        raise ValueError(f"request {r}: {len(page_ids[r])} pages cannot hold {int(ctx[r])} tokens")
    first_pos = torch.zeros(R, dtype=torch.long)
    if window is not None:
        first_pos = torch.maximum(first_pos, computed - window + 1)
    if chunk is not None:
        first_pos = torch.maximum(first_pos, computed // chunk * chunk)
    first_page = first_pos // B
    n_cols = int((last_page - first_page).max()) + 1
    logical = first_page[:, None] + torch.arange(n_cols)[None, :]
    in_range = logical <= last_page[:, None]
    table = full.gather(1, logical.clamp(max=width - 1))
    missing = in_range & (table < 0)
    if bool(missing.any()):
        r, c = (int(x) for x in torch.nonzero(missing)[0])
        raise ValueError(f"request {r}: logical page {int(logical[r, c])} is needed this step but not held")
    held = in_range
    table = torch.where(held, table, torch.full_like(table, pad_page))

    starts = torch.zeros(R + 1, dtype=torch.long)
    starts[1:] = torch.cumsum(new, 0)
    T = int(starts[-1])
    q_req = torch.repeat_interleave(torch.arange(R), new)
    q_local = torch.arange(T) - starts[q_req]
    q_pos = computed[q_req] + q_local
    slot_page = full[q_req, q_pos // B]
    slots = slot_page * B + q_pos % B

    def dev(t: Tensor) -> Tensor:
        return t.to(device)

    return AttentionMetadata(
        page_size=B, block_tables=dev(table), page_offsets=dev(first_page), page_held=dev(held),
        context_lens=dev(ctx), query_start_loc=dev(starts), query_positions=dev(q_pos),
        query_req=dev(q_req), query_local=dev(q_local), slot_mapping=dev(slots),
        max_query_len=int(new.max()), window=window, chunk=chunk)


def write_kv(kv_view: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None:
    """Store ``k, v: [T, H, D]`` at ``slots: [T]`` (``exec_page · B + offset``) of ``kv_view``.

    Works on strided views of the shared buffer (writes land in the buffer), casts to the view
    dtype. Slots must be distinct within one call; a slot ``-1`` writes nothing (a token whose
    K/V a shared cached page already holds).
    """
    if slots.numel() and bool(slots.min() < 0):
        keep = slots >= 0
        slots, k, v = slots[keep], k[keep], v[keep]
    B = kv_view.shape[2]
    page = torch.div(slots, B, rounding_mode="floor")
    off = slots - page * B
    kv_view[page, 0, off] = k.to(kv_view.dtype)
    kv_view[page, 1, off] = v.to(kv_view.dtype)


def paged_attention(
    q: Tensor,
    kv_view: Tensor,
    meta: AttentionMetadata,
    *,
    scale: float,
    window: int | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention of ``q: [T, Hq, D]`` over the cached K/V of each query's request.

    Token at position ``p`` sees cached positions ``<= p``; with ``window`` only ``(p - window, p]``,
    with ``chunk`` only ``[p // chunk · chunk, p]``. ``softcap`` applies ``c · tanh(s / c)`` to the
    scaled logits (Gemma-2). ``Hq`` must be a multiple of the cache's ``H_kv`` (GQA). Returns
    ``[T, Hq, D]`` in ``q.dtype``.
    """
    if meta.window is not None and (window is None or window > meta.window):
        raise ValueError(f"metadata trimmed for window {meta.window}, attention asked for {window}")
    if meta.chunk is not None and chunk != meta.chunk:
        raise ValueError(f"metadata trimmed for chunk {meta.chunk}, attention asked for {chunk}")
    R, P = meta.block_tables.shape
    B, H, D = kv_view.shape[2], kv_view.shape[3], kv_view.shape[4]
    Hq, Q = q.shape[1], meta.max_query_len
    pages = kv_view[meta.block_tables]  # [R, P, 2, B, H, D] (copy)
    valid = meta.key_valid()[:, :, None, None]
    k = pages[:, :, 0].reshape(R, P * B, H, D).to(q.dtype).masked_fill(~valid, 0.0)
    v = pages[:, :, 1].reshape(R, P * B, H, D).to(q.dtype).masked_fill(~valid, 0.0)
    k, v = k.transpose(1, 2), v.transpose(1, 2)  # [R, H, K, D]
    qp = q.new_zeros(R, Q, Hq, D)
    qp[meta.query_req, meta.query_local] = q
    qp = qp.transpose(1, 2)  # [R, Hq, Q, D]
    mask = meta.mask(window, chunk)
    if softcap is None:
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, scale=scale, enable_gqa=Hq != H)
    else:
        if Hq != H:
            k = k.repeat_interleave(Hq // H, dim=1)
            v = v.repeat_interleave(Hq // H, dim=1)
        s = torch.matmul(qp, k.transpose(-1, -2)) * scale
        s = torch.tanh(s / softcap) * softcap
        s = s.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)
    return out.transpose(1, 2)[meta.query_req, meta.query_local]


class AttentionBackend(Protocol):
    """What a kernel library must provide; models only see this through :class:`ForwardContext`."""

    def write_kv(self, kv_view: Tensor, slots: Tensor, k: Tensor, v: Tensor) -> None: ...

    def paged_attention(self, q: Tensor, kv_view: Tensor, meta: AttentionMetadata, *, scale: float,
                        window: int | None = None, chunk: int | None = None,
                        softcap: float | None = None) -> Tensor: ...


class TorchAttentionBackend:
    """The reference backend: :func:`write_kv` and :func:`paged_attention` above."""

    write_kv = staticmethod(write_kv)
    paged_attention = staticmethod(paged_attention)


@dataclass
class ForwardContext:
    """Everything a model forward needs about the cache: per-layer views and metadata.

    ``kv_views[l]`` is layer ``l``'s exec view; ``metadata[l]`` the metadata of ``l``'s group
    (layers of one group share one object, so masks are built once per group and step).
    ``cross``: the step's image K/V for cross-attention layers (a
    :class:`~jenga.engine.cross_attention.CrossStep`), or None.
    """

    kv_views: Sequence[Tensor]
    metadata: Sequence[AttentionMetadata]
    backend: AttentionBackend = field(default_factory=TorchAttentionBackend)
    cross: object = field(default=None, kw_only=True)  # keyword-only: subclasses' fields stay positional

    @classmethod
    def from_groups(cls, kv_views: Sequence[Tensor], groups: Sequence[tuple[Sequence[int], AttentionMetadata]],
                    backend: AttentionBackend | None = None) -> ForwardContext:
        """Per-layer metadata list from ``[(layer indices of a group, its metadata), ...]``."""
        metas: list = [None] * len(kv_views)
        for layers, meta in groups:
            for layer in layers:
                metas[layer] = meta
        return cls(kv_views, metas, backend or TorchAttentionBackend())

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, *, scale: float, window: int | None = None,
               chunk: int | None = None, softcap: float | None = None) -> Tensor:
        """Write this step's ``k, v: [T, H_kv, D]`` for ``layer`` then attend ``q: [T, Hq, D]``."""
        view, meta = self.kv_views[layer], self.metadata[layer]
        self.backend.write_kv(view, meta.slot_mapping, k, v)
        return self.backend.paged_attention(q, view, meta, scale=scale, window=window, chunk=chunk,
                                            softcap=softcap)
