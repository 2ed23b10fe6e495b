"""End to end: jenga's KVCacheManager + KVLayout views + paged models vs HF transformers.

The manager hands out page tables (``None`` for pages out of window / earlier chunks,
prefix hits across requests), the layout turns them into per-layer exec views, and the
engine models read/write only through those. Logits must equal HF's full-sequence forward.
"""

from __future__ import annotations

import pytest
import torch
from test_engine_models import make_pair

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import LayerGroup, ModelSpec
from jenga.engine.attention import ForwardContext, build_attention_metadata


def model_spec(model, name: str = "m") -> ModelSpec:
    """Layer groups from the model's own cache specs (one group per distinct spec)."""
    by_spec: dict = {}
    for layer, spec in enumerate(model.layer_cache_specs(name, "fp32")):
        by_spec.setdefault(spec, []).append(layer)
    groups = tuple(LayerGroup(f"{s.kind}{i}", s, tuple(ls), 16) for i, (s, ls) in enumerate(by_spec.items()))
    return ModelSpec(name, groups, max_model_len=1024, num_layers=len(model.model.layers))


class Served:
    """A manager over the model's layer groups plus the per-layer views of its layout."""

    def __init__(self, model):
        spec = model_spec(model)
        self.model = model
        self.mgr = KVCacheManager(spec, memory_bytes=64 * spec.large_page_bytes, tokens_per_page=16, fit_pages=False)
        self.groups = self.mgr.model.groups
        self.views = [None] * len(model.model.layers)
        for gi, g in enumerate(self.groups):
            for j, layer in enumerate(g.layers):
                self.views[layer] = self.mgr.layout.kv_view(gi, j)
        self.mgr.layout.buffer.random_(0, 256)  # garbage everywhere: only written slots may be read

    def context(self, tables) -> ForwardContext:
        metas = []
        for gi, g in enumerate(self.groups):
            ids = [[None if s is None else s * g.num_layers for s in t.groups[gi].page_ids] for t in tables]
            metas.append((g.layers, build_attention_metadata(
                ids, [t.num_computed for t in tables], [t.num_new for t in tables],
                tables[0].groups[gi].tokens_per_page, window=getattr(g.spec, "window", None),
                chunk=getattr(g.spec, "chunk", None))))
        return ForwardContext.from_groups(self.views, metas)

    def serve(self, prompts: dict, *, budget: int, gen: int):
        """Admit ``{id: prompt}``, run chunked prefill + greedy decode, free; (seqs, logits, hits)."""
        mgr, seqs = self.mgr, {r: list(p) for r, p in prompts.items()}
        done, hits, logits = {}, {}, {r: {} for r in seqs}
        for r, p in prompts.items():
            mgr.add_request(r, p)
            done[r] = hits[r] = mgr.lookup(r)
        while any(len(seqs[r]) - len(prompts[r]) < gen for r in seqs):
            batch, tables, left = [], [], budget
            for r in seqs:
                if len(seqs[r]) - len(prompts[r]) >= gen or left == 0:
                    continue
                n = min(len(seqs[r]) - done[r], left)
                tables.append(mgr.allocate(r, n))
                assert tables[-1] is not None, "test memory too small"
                batch.append((r, n))
                left -= n
            ids = torch.tensor([tok for r, n in batch for tok in seqs[r][done[r]: done[r] + n]])
            pos = torch.cat([torch.arange(done[r], done[r] + n) for r, n in batch])
            with torch.no_grad():
                out = self.model(ids, pos, self.context(tables))
            i = 0
            for r, n in batch:
                for k in range(n):
                    logits[r][done[r] + k] = out[i + k]
                i += n
                done[r] += n
                sampled = [int(out[i - 1].argmax())] if done[r] == len(seqs[r]) else []
                seqs[r] += sampled
                mgr.append_tokens(r, sampled)
            mgr.check_integrity()
        for r in seqs:
            mgr.free(r)
        return seqs, logits, hits


def check_against_hf(hf, seqs, logits):
    with torch.no_grad():
        for r, seq in seqs.items():
            ref = hf(torch.tensor([seq[:-1]])).logits[0]
            for t, row in logits[r].items():
                torch.testing.assert_close(row, ref[t], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "llama4", "ministral", "mistral"])
def test_manager_layout_engine_match_hf(family):
    """Wave 1 fills the cache; wave 2 hits its prefix (and shares a prefix inside the wave)."""
    ours, hf = make_pair(family)
    gen = torch.Generator().manual_seed(2)
    rand = lambda n: torch.randint(0, 512, (n,), generator=gen).tolist()  # noqa: E731
    shared = rand(70)
    served = Served(ours)
    seqs, logits, hits = served.serve({0: shared + rand(11), 1: rand(23)}, budget=37, gen=4)
    check_against_hf(hf, seqs, logits)
    assert hits == {0: 0, 1: 0}
    seqs, logits, hits = served.serve({2: shared + rand(30), 3: rand(9)}, budget=29, gen=5)
    check_against_hf(hf, seqs, logits)
    assert hits[2] >= 64, f"expected a prefix hit on the shared 70 tokens, got {hits}"


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "llama4", "ministral", "mistral", "llama"])
def test_specs_agree_with_structure(family):
    """The engine's per-layer cache kinds equal what jenga.structure derives from the HF config."""
    structure = pytest.importorskip("jenga.structure")
    ours, _ = make_pair(family)
    spec = structure.model_spec_from_hf_config(ours.config.to_dict(), dtype="fp32", vision=False)
    mine = model_spec(ours, spec.name)
    assert {g.layers: g.spec for g in spec.groups} == {g.layers: g.spec for g in mine.groups}
