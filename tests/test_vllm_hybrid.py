"""vLLM + jenga on state hybrids: tiny Falcon-H1 (attention and Mamba-2 side by side in both
layers, fp32) and Qwen3-Next (3 Gated DeltaNet layers : 1 gated full-attention layer, bf16 as
vLLM's CPU kernels need).  The state pages are jenga pages in the page-layer buffer, mapped
onto vLLM's align-mode Mamba block table (a checkpoint page at the column of the step that
ends on it, the prefix-hit page at the hit's column, the work page elsewhere; the worker
copies the previous step's column forward).  Greedy tokens equal stock vLLM's with ample
memory (prefix hits: states resumed from jenga checkpoints) and with a budget that forces
preemption and eviction.

Qwen3-Next also runs in vLLM's own layout (``JENGA_VLLM_LAYOUT=uniform``), and with a 32-token
hash block (``prefix_match_unit=32``): jenga's state hits inside vLLM's 96-token hybrid block,
moved by block copies (one copy checked byte for byte in the worker's buffer).

References: stock Falcon-H1 runs with prefix caching off (``mamba_cache_mode="none"``): with
it on, vLLM 0.32's CPU build fails in its Mamba-2 "internal prefill checkpoint" path (the CPU
chunk scan returns no intermediate states: ``IndexError`` in ``mamba_mixer2``); jenga's plan
turns that export off and lets the scheduler end steps at the checkpoints instead.  Qwen3-Next
(bf16 state): a re-prefill after preemption rounds differently from the decode steps it
replaces, and stock vLLM itself changes later tokens when a prompt is re-fed with its first
outputs; its tight run is a budget with a preemption whose tokens still agree, and eviction
under pressure is asserted on Falcon-H1 (fp32).  That run is built with the prefill reserve off
(``JENGA_VLLM_RESERVE=off``): with it on (the default) no budget from 18 blocks up preempts on this
workload (below 18 one request no longer fits); the default runs that budget too, without a
preemption, its tokens equal stock's."""

from __future__ import annotations

import random
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
from jenga.vllm.admission import RESERVE_ENV

# family -> (engine kwargs, stock-only kwargs, tight budget in vLLM blocks, vLLM block, state layers)
FAMILIES = {
    "falcon_h1": (dict(dtype="float32"), dict(enable_prefix_caching=False), 24, 64, 2),
    # bf16 state named, not "auto": on a CPU with AVX-512 BF16 vLLM turns "auto" into fp32 state
    # (other page sizes) for its accelerated Gated DeltaNet kernel, and keeps a named bf16
    "qwen3_next": (dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16"), {}, 30, 96, 3),
}


SUB_TOKENS = 8  # new tokens per request of the sub-block workloads (the hits decide the first ones)


def sub_block_prompts(seed: int = 5) -> dict[str, list[list[list[int]]]]:
    """Rounds of prompts below the 96-token hybrid block: one request, then six sharing its
    64-token system prompt (the side-by-side hybrid rows); a longer prompt over the same system
    prompt crosses the block after its hit."""
    rng = random.Random(seed)

    def toks(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    system = toks(64)
    return {"sub_short": [[system + toks(12)], [system + toks(rng.randrange(8, 24)) for _ in range(6)]],
            "sub_long": [[system + toks(100)]]}


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group(f"vllm-{f}"))
                                        for f in FAMILIES])
def runs(request, tmp_path_factory):
    family = request.param
    kw, stock_kw, tight, _, _ = FAMILIES[family]
    root = tmp_path_factory.getbasetemp()
    sub = sub_block_prompts() if family == "qwen3_next" else None
    # Qwen3-Next: preempt on this workload (module doc)
    reserve_off = {RESERVE_ENV: "off"} if family == "qwen3_next" else None
    out = compare(family, root, tight_blocks=tight, engine_kw=kw, stock_kw=stock_kw,
                  extra=sub and {"sub_short": sub["sub_short"]}, extra_tokens=SUB_TOKENS, tight_env=reserve_off)
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
        out.update(sub_block_run(model_dir(family, root), kw, sub))
        out["engines"] = (*out["engines"], out["sub_llm"])
        reserved = engine(model_dir(family, root), jenga=True, num_blocks=tight, max_model_len=320, **kw)
        out["reserved_got"] = greedy(reserved, workloads()["pressure"])
        out["reserved"] = scheduler(reserved)
        out["engines"] = (*out["engines"], reserved)
    yield out
    for llm in out["engines"]:
        close(llm)


def sub_block_run(path: str, kw: dict, prompts: dict) -> dict:
    """jenga with vLLM's 32-token hash block (``prefix_match_unit=32``, the ``hybrid32`` row).
    The long prompt's reference is the same engine with an empty cache (no hit), then it runs
    again after the short rounds (a hit at 64, inside the first 96-token column) and once
    more (its own prompt-end checkpoint at 160, inside the second column)."""
    llm = engine(path, jenga=True, prefix_match_unit=32, **kw)
    sched = scheduler(llm)
    long_ref = greedy(llm, prompts["sub_long"][0], SUB_TOKENS)
    llm.reset_prefix_cache()
    got, hits = [], []
    for rounds in (prompts["sub_short"], prompts["sub_long"], prompts["sub_long"]):
        before = sched.jenga.stats().prefix_hit_tokens
        got.append([out for p in rounds for out in greedy(llm, p, SUB_TOKENS)])
        hits.append(sched.jenga.stats().prefix_hit_tokens - before)
    return dict(sub_llm=llm, sub=sched, sub_long_ref=long_ref, sub_got=got, sub_hits=hits)


def test_sub_block_state_hits_equal_stock(runs):
    """With a hash block finer than vLLM's 96-token hybrid block, jenga's attention pages are one
    hash block and its state resumes inside the block (block copies in and out of the column):
    the short prompts' tokens equal stock vLLM's, each of the six resumes at 64 tokens, and the
    long prompt resumed at 64 and at 160 gives the tokens it gives with no hit.  (Past 96 tokens
    the long prompt is not compared with stock: bf16 attention over 32-token pages rounds
    differently from vLLM's 96-token blocks, with or without any hit.)"""
    if runs["family"] != "qwen3_next":
        pytest.skip("run on Qwen3-Next")
    sched = runs["sub"]
    assert sched.hash_block_size == 32 and sched.block_size == 96 and sched.jenga.block == 32
    assert sched.mamba_partial_cache_hit and sched.mamba_shared_prefix_checkpoint
    assert [g.tokens_per_page for g in sched.jenga.model.groups if g.spec.per_token] == [32]
    short, long_hit, long_self = runs["sub_got"]
    assert short == runs["ref"]["sub_short"]
    assert long_hit == runs["sub_long_ref"] and long_self == runs["sub_long_ref"]
    assert runs["sub_hits"] == [6 * 64, 64, 160]
    assert sched.kv_cache_manager.copies.num_copies >= 6 + 1 + 1
    assert sched.jenga.used_bytes == 0 and not sched.jenga.requests
    sched.jenga.check_integrity()


def test_state_block_copy_moves_exactly_one_page(runs):
    """vLLM's worker copies a block pair in every layer view of every group
    (``copy_kv_cache_blocks_inplace``); in jenga's page-layer buffer the exec ids of two state
    pages then copy exactly the source page's bytes onto the destination page, nothing else."""
    if runs["family"] != "qwen3_next":
        pytest.skip("run on Qwen3-Next")
    import torch
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

    sched = runs["sub"]
    runner = runs["sub_llm"].llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    plan, groups = sched.kv_cache_manager.plan, sched.jenga.model.groups
    g = next(i for i, grp in enumerate(groups) if not grp.spec.per_token)
    page = groups[g].page_bytes
    unit = page // plan.exec_scale[g]
    buf = torch.empty(0, dtype=torch.uint8).set_(runner.kv_caches[0].untyped_storage())
    saved = buf.clone()
    try:
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0)))
        before = buf.clone()
        src, dst = (p * plan.exec_scale[g] + plan.exec_offset for p in (3, 1))
        copy_kv_cache_blocks_inplace(runner.kv_caches, runner.kv_cache_config.num_blocks,
                                     [KVCacheBlockCopy(src_block_id=src, dst_block_id=dst)])
        s, d = src * unit, dst * unit
        layer, useful = groups[g].layer_page_bytes, groups[g].spec.layer_page_bytes(groups[g].tokens_per_page)
        for j in range(groups[g].num_layers):  # each layer's states (its page's padding is never read)
            assert torch.equal(buf[d + j * layer:d + j * layer + useful], before[s + j * layer:s + j * layer + useful])
        assert torch.equal(buf[:d], before[:d]) and torch.equal(buf[d + page:], before[d + page:])
    finally:
        buf.copy_(saved)


def test_state_layers_are_cut_into_groups_as_vllm_cuts_them(runs):
    sched = runs["ample"]
    groups = sched.jenga.model.groups
    assert sorted({g.spec.kind for g in groups}) == ["full", "mamba"]
    state = [g for g in groups if g.spec.kind == "mamba"]
    assert all(type(g.spec) is CopyForwardMambaSpec for g in state)
    # vLLM's state groups of as many layers as the attention group has (one page size for every
    # group): Falcon-H1's parallel layers one group of both layers, Qwen3-Next's three one each
    full = min(g.num_layers for g in groups if g.spec.per_token)
    assert [g.num_layers for g in state] == [full] * (FAMILIES[runs["family"]][4] // full)
    modes = [g.kv_cache_spec.mamba_cache_mode for g in sched.kv_cache_config.kv_cache_groups
             if hasattr(g.kv_cache_spec, "mamba_cache_mode")]
    assert modes == ["align"] * len(state)
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
        # the default, the prefill reserve on: the same budget, no preemption, the same tokens
        assert runs["reserved_got"] == runs["ref"]["pressure"]
        assert runs["reserved"].num_preemptions == 0 and runs["reserved"].jenga.stats().prefix_hit_tokens > 0


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
    assert mamba == [block] * 3 and sched.cache_config.block_size == block
    assert sched.hash_block_size == block and not sched.mamba_partial_cache_hit
    assert sched.jenga.block == block


def test_sub_block_hits_lost_is_named_at_start():
    """A hash block finer than the align-mode Mamba block (``prefix_match_unit``) gets the start-up
    warning where jenga keeps vLLM's block (its ``uniform`` layout, or a buffer in which vLLM's
    block copy would not move a whole state page): stock takes sub-block state hits there and
    jenga does not.  jenga's sub-block pages, vLLM's default hash block (the Mamba block) and
    prefix caching off get none."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    from jenga.vllm.scheduler import sub_block_hits_lost

    attn = kvi.FullAttentionSpec(block_size=96, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    state = kvi.MambaSpec(block_size=96, shapes=((4,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")
    cfg = SimpleNamespace(kv_cache_groups=[kvi.KVCacheGroupSpec(["a"], attn), kvi.KVCacheGroupSpec(["m"], state)])
    assert "prefix_match_unit=32 is finer than the Mamba block [96]" in sub_block_hits_lost(cfg, 32, True)
    assert sub_block_hits_lost(cfg, 32, True, sub_block=True) is None
    assert sub_block_hits_lost(cfg, 96, True) is None
    assert sub_block_hits_lost(cfg, 32, False) is None


def test_state_groups_are_cut_by_the_smallest_token_group(monkeypatch):
    """``state_groups``: a state group is cut into groups of the smallest token group's layer count
    where that count divides it, kept whole otherwise, without token groups or when asked."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    from jenga.errors import InvalidArgumentError
    from jenga.vllm.plan import STATE_GROUPS_ENV, state_groups

    attn = kvi.FullAttentionSpec(block_size=96, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    state = kvi.MambaSpec(block_size=96, shapes=((4,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")
    m = [f"m{i}" for i in range(6)]
    assert state_groups([(m, state), (["a0", "a1"], attn)]) == [(m[0:2], state), (m[2:4], state), (m[4:6], state),
                                                                (["a0", "a1"], attn)]
    assert state_groups([(m[:5], state), (["a0", "a1"], attn)]) == [(m[:5], state), (["a0", "a1"], attn)]
    assert state_groups([(m, state)]) == [(m, state)]
    monkeypatch.setenv(STATE_GROUPS_ENV, "whole")
    assert state_groups([(m, state), (["a0"], attn)]) == [(m, state), (["a0"], attn)]
    monkeypatch.setenv(STATE_GROUPS_ENV, "halves")
    with pytest.raises(InvalidArgumentError, match="JENGA_VLLM_STATE_GROUPS='halves'; choose one of split, whole"):
        state_groups([(m, state), (["a0"], attn)])
