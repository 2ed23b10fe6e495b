"""The memory-layout contract: per-layer exec views of one buffer, for several groups at once.

K/V of a multi-group model (full + sliding + chunked with different head shapes, plus a
state group) are written through every layer's view at the manager's slots, read back with
the torch paged-attention reference and compared with dense attention; no live small page
of any group overlaps another's bytes.
"""

import math

import torch

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import (
    ChunkedLocalSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
)
from jenga.engine.attention import build_attention_metadata, paged_attention, write_kv

B = 4
MODEL = ModelSpec("layout", (
    LayerGroup("full", FullAttentionSpec("m", "fp32", 2, 8), (0, 3), B),
    LayerGroup("sliding", SlidingWindowSpec("m", "fp32", 1, 16, window=8), (1, 4, 5), B),
    LayerGroup("chunked", ChunkedLocalSpec("m", "fp32", 4, 4, chunk=8), (2,), B),
    LayerGroup("state", MambaSpec("m", "fp32", shapes=((3, 5), (7,)), dtypes=("fp32", "fp32"),
                                   checkpoint_interval=8), (6,), B),
), max_model_len=4096)


def dense(q, k, v, pos, scale, window=None, chunk=None):
    """Reference: q [T,H,D] at positions pos over k, v [L,Hkv,D] (GQA by repeat)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("thd,lhd->htl", q, k) * scale
    kp = torch.arange(k.shape[0])
    mask = kp[None, :] <= pos[:, None]
    if window:
        mask &= kp[None, :] > pos[:, None] - window
    if chunk:
        mask &= kp[None, :] >= (pos[:, None] // chunk) * chunk
    s = s.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("htl,lhd->thd", s.softmax(-1), v)


def test_views_write_read_dense_equal_and_disjoint():
    torch.manual_seed(0)
    mgr = KVCacheManager(MODEL, 64 * MODEL.large_page_bytes, tokens_per_page=B, fit_pages=False)
    lay = mgr.layout
    lay.buffer.copy_(torch.randint(0, 255, lay.buffer.shape, dtype=torch.uint8))  # garbage everywhere
    lengths = {"a": 23, "b": 17, "c": 30}
    kv = {}  # (rid, layer) -> (k, v) dense
    for rid, n in lengths.items():
        mgr.add_request(rid, list(range(n)))
        t = mgr.allocate(rid, n)
        assert t is not None
        for gi, g in enumerate(MODEL.groups):
            if g.kind == "mamba":
                continue
            spec = g.spec
            table = t.groups[gi]
            for j, layer in enumerate(g.layers):
                k = torch.randn(n + 1, spec.num_kv_heads, spec.head_dim)  # + the decoded token
                v = torch.randn(n + 1, spec.num_kv_heads, spec.head_dim)
                pos = torch.arange(n)
                exec_ids = torch.tensor(lay.exec_page_ids(gi, table.page_ids))
                slots = exec_ids[pos // B] * B + pos % B
                write_kv(lay.kv_view(gi, j), slots, k[:n], v[:n])
                kv[(rid, layer)] = (k, v)
        mgr.append_tokens(rid, [1])
        assert mgr.allocate(rid, 1) is not None  # decode step: token n
    # reads see exactly what each layer wrote, after every other layer's and group's writes
    for gi, g in enumerate(MODEL.groups):
        if g.kind == "mamba":
            continue
        spec = g.spec
        window = getattr(spec, "window", None)
        chunk = getattr(spec, "chunk", None)
        rids = list(lengths)
        pages = [lay.exec_page_ids(gi, mgr.requests[r].tables.groups[gi].page_ids) for r in rids]
        # query: the decoded token of each request (held pages cover its window / chunk)
        meta = build_attention_metadata(
            [[p if s is not None else None for p, s in zip(pg, mgr.requests[r].tables.groups[gi].page_ids,
                                                            strict=True)] for pg, r in zip(pages, rids, strict=True)],
            [lengths[r] for r in rids], [1] * len(rids), B, window=window, chunk=chunk)
        for j, layer in enumerate(g.layers):
            hq = spec.num_kv_heads * 2
            q = torch.randn(len(rids), hq, spec.head_dim)
            view = lay.kv_view(gi, j)
            # the decode step writes the new token, then attends
            for i, r in enumerate(rids):
                k, v = kv[(r, layer)]
                p = lengths[r]
                write_kv(view, meta.slot_mapping[i:i + 1], k[p:p + 1], v[p:p + 1])
            scale = 1 / math.sqrt(spec.head_dim)
            out = paged_attention(q, view, meta, scale=scale, window=window, chunk=chunk)
            for i, r in enumerate(rids):
                k, v = kv[(r, layer)]
                p = torch.tensor([lengths[r]])
                ref = dense(q[i:i + 1], k, v, p, scale, window, chunk)
                torch.testing.assert_close(out[i:i + 1], ref, atol=1e-5, rtol=1e-5)
    # byte ranges of every live small page, across all groups, are disjoint and in bounds
    ranges = []
    for req in mgr.requests.values():
        for gi, gs in enumerate(req.groups):
            # each kind's record has its own fields: token pages, or a state's work page and checkpoints
            held = [p for p in getattr(gs, "pages", ()) if p is not None]
            held += [p for p in (getattr(gs, "work", None),) if p is not None]
            held += list(getattr(gs, "checkpoints", {}).values())
            ranges += [lay.byte_range(gi, p) for p in held]
    ranges.sort()
    assert ranges, "no pages held"
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)), "two live pages overlap"
    assert ranges[-1][1] <= mgr.alloc.num_large * mgr.large_page_bytes


def test_state_views_address_the_state_page():
    mgr = KVCacheManager(MODEL, 64 * MODEL.large_page_bytes, tokens_per_page=B, fit_pages=False)
    lay = mgr.layout
    mgr.add_request("a", list(range(10)))
    t = mgr.allocate("a", 10)
    gi = 3
    work = t.groups[gi].work_page
    conv, ssm = lay.state_views(gi, 0)
    assert conv.shape[1:] == (3, 5) and ssm.shape[1:] == (7,)
    exec_id = lay.exec_page_ids(gi, [work])[0]
    conv[exec_id].fill_(1.5)
    ssm[exec_id].fill_(-2.0)
    start, end = lay.byte_range(gi, work)
    raw = lay.buffer[start:end].view(torch.float32)
    assert raw[:15].eq(1.5).all() and raw[15:22].eq(-2.0).all()
