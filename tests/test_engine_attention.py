"""Torch paged attention (jenga.engine.attention) against dense masked attention."""

from __future__ import annotations

import pytest
import torch

from jenga.engine.attention import ForwardContext, build_attention_metadata, paged_attention, write_kv

B, H, HQ, D = 4, 2, 4, 8


def padded_view(num_pages: int, pad_elems: int = 5) -> torch.Tensor:
    """``[E, 2, B, H, D]`` view whose page stride exceeds ``2·B·H·D`` (padded pages), NaN-filled."""
    flat = torch.full((num_pages * (2 * B * H * D + pad_elems),), float("nan"))
    return flat.view(num_pages, -1)[:, : 2 * B * H * D].view(num_pages, 2, B, H, D)


def dense(q, k, v, start, scale, window, chunk, softcap):
    """Reference: full causal attention over the whole sequence, rows from ``start`` on."""
    n = k.shape[0]
    k, v = k.repeat_interleave(HQ // H, 1), v.repeat_interleave(HQ // H, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    m = j <= i
    if window:
        m &= j > i - window
    if chunk:
        m &= (j // chunk) == (i // chunk)
    return torch.einsum("hqk,khd->qhd", s.masked_fill(~m, float("-inf")).softmax(-1), v)[start:]


@pytest.mark.parametrize("window,chunk,softcap", [(None, None, None), (5, None, None), (None, 4, None),
                                                  (6, None, 30.0), (3, None, None)])
def test_paged_matches_dense(window, chunk, softcap):
    torch.manual_seed(0)
    lens, comp = [13, 7, 9], [9, 0, 8]  # prefill chunk, fresh prefill, decode
    view = padded_view(40)
    perm = torch.randperm(40).tolist()
    pages = [perm[0:4], perm[4:6], perm[6:9]]
    K = [torch.randn(n, H, D) for n in lens]
    V = [torch.randn(n, H, D) for n in lens]
    Q = [torch.randn(n, HQ, D) for n in lens]
    held = [list(p) for p in pages]
    for r, c in enumerate(comp):  # cached prefix, then drop the pages no new token can see
        if c:
            meta = build_attention_metadata([pages[r]], [0], [c], B)
            write_kv(view, meta.slot_mapping, K[r][:c], V[r][:c])
        for i in range(len(held[r])):
            if (window and (i + 1) * B - 1 < c - window + 1) or (chunk and (i + 1) * B <= c // chunk * chunk):
                held[r][i] = None
    meta = build_attention_metadata(held, comp, [n - c for n, c in zip(lens, comp, strict=True)], B,
                                    window=window, chunk=chunk, pad_page=perm[-1])
    ctx = ForwardContext([view], [meta])
    cat = lambda xs: torch.cat([x[c:] for x, c in zip(xs, comp, strict=True)])  # noqa: E731
    out = ctx.attend(0, cat(Q), cat(K), cat(V), scale=0.3, window=window, chunk=chunk, softcap=softcap)
    ref = torch.cat([dense(Q[r], K[r], V[r], comp[r], 0.3, window, chunk, softcap) for r in range(3)])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    if window or chunk:  # trimmed: fewer columns than the full page list
        assert meta.block_tables.shape[1] < max(len(p) for p in pages)


def test_metadata_layout():
    meta = build_attention_metadata([[None, 8, 4, 12], [6]], [40, 2], [3, 1], 16, window=20)
    assert meta.query_positions.tolist() == [40, 41, 42, 2]
    assert meta.query_req.tolist() == [0, 0, 0, 1]
    assert meta.slot_mapping.tolist() == [4 * 16 + 8, 4 * 16 + 9, 4 * 16 + 10, 6 * 16 + 2]
    assert meta.page_offsets.tolist() == [1, 0] and meta.context_lens.tolist() == [43, 3]
    # positions >= 11 are needed: logical page 1 is None -> error
    with pytest.raises(ValueError, match="not held"):
        build_attention_metadata([[8, None, 4]], [40], [3], 16, window=30)
    with pytest.raises(ValueError, match="cannot hold"):
        build_attention_metadata([[8]], [10], [7], 16)


def test_window_wider_than_trimmed_table_is_rejected():
    view = padded_view(4)
    meta = build_attention_metadata([[0, 1]], [6], [1], B, window=3)
    with pytest.raises(ValueError, match="trimmed for window"):
        paged_attention(torch.zeros(1, HQ, D), view, meta, scale=1.0, window=None)
