"""Baseline managers: their page-size rules on real configs, and their allocation rules."""

import random

import pytest

from jenga.baselines import make_manager
from jenga.baselines.paged import paged_model
from jenga.baselines.uniform import uniform_model
from jenga.core.specs import ModelSpec


def test_paged_one_page_size_and_jamba_max_page():
    m = paged_model(ModelSpec.from_hf_config("jamba-1.5-mini"), 16)
    assert len({g.page_bytes for g in m.groups}) == 1
    attn = m.group("paged")
    # 28 Mamba states (8.72 MB) in one page: attention pages grow to 560 tokens (532 needed,
    # rounded up to a multiple of 16 where the padding splits evenly over 28 layers)
    assert attn.tokens_per_page == 560 and attn.num_layers == 4
    mllama = paged_model(ModelSpec.from_hf_config("llama-3.2-11b-vision"), 16)
    assert [g.num_layers for g in mllama.groups] == [40, 40]  # text and image tokens in every layer


def test_uniform_v1_grouping():
    g3 = uniform_model(ModelSpec.from_hf_config("gemma-3-27b"), 16)
    names = [g.name for g in g3.groups]
    assert sum(n.startswith("sliding") for n in names) == 6 and sum(n.startswith("full") for n in names) == 1
    assert "vision" not in " ".join(names)  # vision embeddings live outside v1's pool
    assert len({g.page_bytes for g in g3.groups}) == 1
    pad_layers = sum(g.pad_bytes // g.spec.layer_page_bytes(g.tokens_per_page) for g in g3.groups)
    assert pad_layers == 8  # 52 SWA layers in groups of 10: "Add 8 padding layers"
    nem = uniform_model(ModelSpec.from_hf_config("nemotron-h-8b"), 16)
    attn = [g for g in nem.groups if g.kind == "full"]
    # 24 Mamba layers in groups of 4 (8.6 MB pages) force 528-token attention blocks
    assert [g.tokens_per_page for g in attn] == [528]


def _drive(mgr, n_req: int, seed: int) -> int:
    """``n_req`` random prompts, at most 4 live; returns how many were allocated."""
    rng = random.Random(seed)
    live, admitted = [], 0
    for r in range(n_req):
        length = rng.randrange(200, 3000)
        mgr.add_request(r, [rng.randrange(50) for _ in range(length)])
        h = mgr.lookup(r)
        if mgr.allocate(r, length - h) is None:
            mgr.free(r)
            continue
        admitted += 1
        mgr.append_tokens(r, [1])
        live.append(r)
        if len(live) > 3:
            mgr.free(live.pop(0))
        mgr.check_integrity()
        caps = getattr(mgr, "caps", None)
        if caps:
            assert all(o <= c for o, c in zip(mgr.alloc.owned, caps, strict=True)), (mgr.alloc.owned, caps)
    return admitted


def test_static_partition_recycles_its_own_cached_pages_and_keeps_caps():
    model = ModelSpec.from_hf_config("ministral-8b")
    mgr = make_manager("static", model, 4 << 30)
    assert _drive(mgr, 40, 0) == 40  # every prompt was allocated
    st = mgr.stats()
    assert st.evicted_pages > 0  # caps were reached and cached pages recycled


def test_every_baseline_runs_every_family_with_integrity():
    for name in ("ministral-8b", "jamba-1.5-mini", "llama-4-scout", "gemma-3-4b"):
        model = ModelSpec.from_hf_config(name)
        for mgr_name in ("jenga", "paged", "static", "uniform"):
            mgr = make_manager(mgr_name, model, 3 << 30)
            assert _drive(mgr, 12, 1) == 12, (name, mgr_name)  # every prompt was allocated
            for r in list(mgr.requests):
                mgr.free(r)
            mgr.check_integrity()
            assert mgr.stats().used_bytes == 0


def test_uniform_hybrid_block_is_vllms_formula():
    """vLLM's ``_align_hybrid_block_size``: the smallest multiple of max(kernel block, block) whose
    one-layer attention page holds a state (Jamba-1.5-Mini: 80 tokens on FlashAttention's 16)."""
    from jenga.baselines.uniform import hybrid_block
    jamba = ModelSpec.from_hf_config("jamba-1.5-mini", vision=False)
    assert hybrid_block(jamba, 16) == 80
    assert hybrid_block(jamba, 16, kernel_block=32) == 96
    assert hybrid_block(ModelSpec.from_hf_config("llama-3.1-8b"), 16) == 16
    assert uniform_model(jamba, 16).groups[0].tokens_per_page == 80


def test_uniform_junction_checkpoints():
    """0.34's rules keep the sliding window before a shared-prefix junction (the third request
    with the prefix hits it); 0.32's keep only the window before each prompt's end; dense keeps all."""
    import numpy as np

    from jenga.baselines import make_manager
    from jenga.baselines.uniform_settings import UniformSettings
    gemma = ModelSpec.from_hf_config("gemma-3-12b", vision=False)
    rng = np.random.default_rng(0)
    prefix = rng.integers(1, 30000, 1500).tolist()
    prompts = [prefix + rng.integers(1, 30000, 300).tolist() for _ in range(3)]
    for name, settings, want in (("uniform", None, [0, 0, 1488]), ("uniform-0.32", None, [0, 0, 0]),
                                 ("uniform", UniformSettings(retention=None), [0, 1488, 1488])):
        mgr = make_manager(name, gemma, 3 << 30, settings=settings)
        hits = []
        for i, p in enumerate(prompts):
            mgr.add_request(i, p)
            hits.append(mgr.lookup(i))
            assert mgr.allocate(i, len(p) - hits[-1]) is not None
            mgr.append_tokens(i, [5])
            mgr.free(i)
        assert hits == want, (name, settings)


def test_uniform_settings_refused():
    from jenga.baselines import make_manager
    from jenga.baselines.uniform_settings import UniformSettings
    from jenga.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError, match="retention"):
        UniformSettings(retention=-1)
    with pytest.raises(InvalidArgumentError, match="UniformSettings"):
        make_manager("uniform", ModelSpec.from_hf_config("llama-3.1-8b"), 1 << 30, settings={"retention": 0})
