"""The engine's decode fast path equals the reference paged attention, garbage buffer included."""

from __future__ import annotations

import pytest
import torch

from jenga.engine.attention import build_attention_metadata, paged_attention, write_kv
from jenga.engine.split_attention import SplitAttentionBackend, SplitMetadata, decode_attention


@pytest.mark.parametrize("window,chunk,softcap", [(None, None, None), (24, None, 5.0), (None, 32, None)])
def test_decode_attention_matches_reference(window, chunk, softcap):
    gen = torch.Generator().manual_seed(0)
    E, B, H, D, Hq = 40, 8, 2, 16, 4
    raw = torch.randint(0, 256, (E * 2 * B * H * D * 4,), dtype=torch.uint8, generator=gen)
    view = raw.view(torch.float32).view(E, 2, B, H, D)  # random bytes: NaN/inf patterns included
    ctx = [37, 5, 64]
    perm = torch.randperm(E, generator=gen).tolist()
    pages, at = [], 0
    for c in ctx:
        n = (c + B - 1) // B
        pages.append(perm[at:at + n])
        at += n
    meta_all = build_attention_metadata(pages, [0] * 3, ctx, B)  # write every token's K/V
    T = sum(ctx)
    write_kv(view, meta_all.slot_mapping, torch.randn(T, H, D, generator=gen), torch.randn(T, H, D, generator=gen))
    meta = build_attention_metadata(pages, [c - 1 for c in ctx], [1] * 3, B, window=window, chunk=chunk)
    q = torch.randn(3, Hq, D, generator=gen)
    kw = dict(scale=0.25, window=window, chunk=chunk, softcap=softcap)
    ref = paged_attention(q, view, meta, **kw)
    got = decode_attention(q, view, meta, **kw)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    split = SplitMetadata(meta.slot_mapping, [(0, 3, meta)])
    torch.testing.assert_close(SplitAttentionBackend.paged_attention(q, view, split, **kw), ref, atol=1e-5, rtol=1e-5)
