"""vLLM + jenga on state hybrids: tiny Falcon-H1 (attention and Mamba-2 side by side in both
layers, fp32) and Qwen3-Next (3 Gated DeltaNet layers : 1 gated full-attention layer, bf16 as
vLLM's CPU kernels need).  The state pages are jenga pages in the page-layer buffer, mapped
onto vLLM's align-mode Mamba block table (a checkpoint page at the column of the step that
ends on it, the prefix-hit page at the hit's column, the work page elsewhere; the worker
copies the previous step's column forward).  Greedy tokens equal stock vLLM's with ample
memory (prefix hits: states resumed from jenga checkpoints) and with a budget that forces
preemption and eviction.

Qwen3-Next also runs in vLLM's own layout (``JENGA_VLLM_LAYOUT=uniform``).

References: stock Falcon-H1 runs with prefix caching off (``mamba_cache_mode="none"``): with
it on, vLLM 0.32's CPU build fails in its Mamba-2 "internal prefill checkpoint" path (the CPU
chunk scan returns no intermediate states: ``IndexError`` in ``mamba_mixer2``); jenga's plan
turns that export off and lets the scheduler end steps at the checkpoints instead.  Qwen3-Next
(bf16 state): a re-prefill after preemption rounds differently from the decode steps it
replaces, and stock vLLM itself changes later tokens when a prompt is re-fed with its first
outputs; its tight run is a budget with a preemption whose tokens still agree, and eviction
under pressure is asserted on Falcon-H1 (fp32)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_support import (
    check_ample,
    check_reclaimed,
    check_tight,
    close,
    compare,
    engine,
    greedy,
    model_dir,
    scheduler,
    workloads,
)

from jenga.core.specs import CopyForwardMambaSpec, MambaSpec

# family -> (engine kwargs, stock-only kwargs, tight budget in vLLM blocks, vLLM block, state layers)
FAMILIES = {
    "falcon_h1": (dict(dtype="float32"), dict(enable_prefix_caching=False), 24, 64, 2),
    # bf16 state named, not "auto": on a CPU with AVX-512 BF16 vLLM turns "auto" into fp32 state
    # (other page sizes) for its accelerated Gated DeltaNet kernel, and keeps a named bf16
    "qwen3_next": (dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16"), {}, 36, 96, 3),
}


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group(f"vllm-{f}"))
                                        for f in FAMILIES])
def runs(request, tmp_path_factory):
    family = request.param
    kw, stock_kw, tight, _, _ = FAMILIES[family]
    root = tmp_path_factory.getbasetemp()
    out = compare(family, root, tight_blocks=tight, engine_kw=kw, stock_kw=stock_kw)
    out["family"] = family
    if family == "falcon_h1":  # prefix caching off: vLLM's "none" mode, one state slot per request
        nocache = engine(model_dir(family, root), jenga=True, enable_prefix_caching=False, **kw)
        out["nocache_got"] = greedy(nocache, workloads()["first"] + workloads()["shared"])
        out["nocache"] = scheduler(nocache)
        out["engines"] = (*out["engines"], nocache)
    else:  # vLLM's own layout (JENGA_VLLM_LAYOUT=uniform): jenga decides the state blocks only
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("JENGA_VLLM_LAYOUT", "uniform")
            uniform = engine(model_dir(family, root), jenga=True, **kw)
        out["uniform_got"] = greedy(uniform, workloads()["first"]) + greedy(uniform, workloads()["shared"])
        out["uniform"] = scheduler(uniform)
        out["engines"] = (*out["engines"], uniform)
    yield out
    for llm in out["engines"]:
        close(llm)


def test_state_layers_are_one_jenga_group_of_state_pages(runs):
    sched = runs["ample"]
    groups = {g.spec.kind: g for g in sched.jenga.model.groups}
    assert sorted(groups) == ["full", "mamba"]
    assert type(groups["mamba"].spec) is CopyForwardMambaSpec
    assert groups["mamba"].num_layers == FAMILIES[runs["family"]][4]
    # vLLM's per-layer state groups become one jenga group (one page holds every state layer)
    modes = [g.kv_cache_spec.mamba_cache_mode for g in sched.kv_cache_config.kv_cache_groups
             if hasattr(g.kv_cache_spec, "mamba_cache_mode")]
    assert modes == ["align"]
    # the worker never exports an internal prefill checkpoint jenga did not plan
    assert all(getattr(g.kv_cache_spec, "num_prefill_checkpoint_blocks", 0) == 0
               for g in sched.kv_cache_config.kv_cache_groups)


def test_ample_memory_equals_stock_with_state_prefix_hits(runs):
    # the 150-token shared prefix resumes from the state at its last block boundary
    block = FAMILIES[runs["family"]][3]
    check_ample(runs, min_hit_tokens=6 * (150 // block * block))


def test_tight_budget_preempts_and_equals_stock(runs):
    if runs["family"] == "falcon_h1":
        check_tight(runs)  # preemption, eviction and prefix hits
    else:
        sched = runs["tight"]
        assert runs["got"]["pressure"] == runs["ref"]["pressure"]
        assert sched.num_preemptions > 0 and sched.jenga.stats().prefix_hit_tokens > 0


def test_without_prefix_caching_one_state_page_per_request(runs):
    if runs["family"] != "falcon_h1":
        pytest.skip("run on Falcon-H1")
    sched = runs["nocache"]
    state = [g for g in sched.jenga.model.groups if not g.spec.per_token]
    assert [type(g.spec) for g in state] == [MambaSpec]
    assert runs["nocache_got"] == runs["ref"]["first"] + runs["ref"]["shared"]
    assert sched.jenga.stats().prefix_hit_tokens == 0
    assert sched.jenga.used_bytes == 0
    sched.jenga.check_integrity()


def test_every_page_reclaimed(runs):
    check_reclaimed(runs)


def test_uniform_layout_state_blocks_equal_stock(runs):
    if runs["family"] != "qwen3_next":
        pytest.skip("run on Qwen3-Next")
    sched = runs["uniform"]
    assert sched.kv_cache_manager.plan.layout == "uniform"
    assert len(sched.jenga.model.groups) == len(sched.kv_cache_config.kv_cache_groups) == 4  # vLLM's 3 + 1
    assert runs["uniform_got"] == runs["ref"]["first"] + runs["ref"]["shared"]
    assert sched.jenga.stats().prefix_hit_tokens >= 6 * 96
    assert sched.jenga.used_bytes == 0
    sched.jenga.check_integrity()


def test_no_state_below_the_hybrid_block(runs):
    """Why the side-by-side hybrid row (prompts shorter than one block) gets no hit on either
    engine (README, the hybrid row): vLLM hashes at its Mamba block, so its scheduler takes no
    fine-grained hits and ends no prefill step below the block, and jenga's state checkpoints
    sit on the same block."""
    if runs["family"] != "qwen3_next":
        pytest.skip("run on Qwen3-Next")
    sched, block = runs["ample"], FAMILIES["qwen3_next"][3]
    mamba = [g.kv_cache_spec.block_size for g in sched.kv_cache_config.kv_cache_groups
             if hasattr(g.kv_cache_spec, "mamba_cache_mode")]
    assert mamba == [block] and sched.cache_config.block_size == block
    assert sched.hash_block_size == block and not sched.mamba_partial_cache_hit
    assert sched.jenga.block == block


def test_sub_block_hits_lost_is_named_at_start():
    """A hash block finer than the align-mode Mamba block (``prefix_match_unit``) gets the start-up
    warning (stock takes sub-block state hits there, jenga does not: the ``hybrid32`` bench row);
    vLLM's default hash block (the Mamba block) and prefix caching off get none."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    from jenga.vllm.scheduler import sub_block_hits_lost

    attn = kvi.FullAttentionSpec(block_size=96, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    state = kvi.MambaSpec(block_size=96, shapes=((4,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")
    cfg = SimpleNamespace(kv_cache_groups=[kvi.KVCacheGroupSpec(["a"], attn), kvi.KVCacheGroupSpec(["m"], state)])
    assert "prefix_match_unit=32 is finer than the Mamba block [96]" in sub_block_hits_lost(cfg, 32, True)
    assert sub_block_hits_lost(cfg, 96, True) is None
    assert sub_block_hits_lost(cfg, 32, False) is None
