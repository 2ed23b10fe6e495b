"""States inside vLLM's hybrid block, without an engine: the block copies that move them
(:mod:`jenga.vllm.state_copies`) and the plan that turns them on (:func:`jenga.vllm.plan.sub_block_page`,
:func:`jenga.vllm.plan.state_copies_exact`).  End to end (tokens equal to stock vLLM, a copy
in the real worker buffer): ``tests/test_vllm_hybrid.py``."""

from __future__ import annotations

import pytest
import torch
from vllm.v1 import kv_cache_interface as kvi

from jenga.vllm.plan import page_layer_plan
from jenga.vllm.state_copies import StateCopies


def pairs(copies) -> list[tuple[int, int]]:
    return [(c.src_block_id, c.dst_block_id) for c in copies]


def test_a_fill_runs_with_the_next_step_and_a_read_in_that_step_copies_its_source():
    c = StateCopies()
    c.step()
    c.fill("a", 64, 10, 20)  # the step scheduled now writes the state at 64 into block 10
    with pytest.raises(AssertionError, match="before the step that writes it"):
        c.read(20, 30)
    assert pairs(c.take()) == []  # not before that step's forward
    c.step()
    c.read(20, 30)  # a hit in the next step: its batch fills 20 too, so it copies from 10
    assert pairs(c.take()) == [(10, 20), (10, 30)]
    c.step()
    c.read(20, 31)
    assert pairs(c.take()) == [(20, 31)] and c.num_copies == 3 and c.pending == 0


def test_a_page_taken_again_keeps_the_later_copy_and_a_freed_request_voids_its_fills():
    c = StateCopies()
    c.step()
    c.fill("a", 64, 10, 20)
    c.fill("b", 64, 11, 21)
    c.cancel("a", 32)  # freed before 64 was computed: its checkpoint page goes uncached
    c.cancel("b", 64)
    assert c.pending == 1
    c.step()
    c.read(5, 21)  # 21 was let go of and taken again within the step: the later copy wins
    assert pairs(c.take()) == [(5, 21)]


def hybrid_config(attention_layer: int):
    """vLLM's config of a Qwen3-Next-like hybrid (96-token blocks): three Gated DeltaNet layers
    and one attention layer at ``attention_layer``."""
    attn = kvi.FullAttentionSpec(block_size=96, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    state = kvi.MambaSpec(block_size=96, shapes=((8960,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")
    names = [f"model.layers.{i}.{'self_attn.attn' if i == attention_layer else 'linear_attn'}" for i in range(4)]
    attn_names = [n for n in names if "self_attn" in n]
    state_names = [n for n in names if "linear_attn" in n]
    raw = 64 * 4 * attn.page_size_bytes
    groups = [kvi.KVCacheGroupSpec(state_names, state), kvi.KVCacheGroupSpec(attn_names, attn)]
    tensors = [kvi.KVCacheTensor(size=raw, layers=g.layer_names, layer_stride=attn.page_size_bytes,
                                 block_stride=attn.page_size_bytes) for g in groups]
    return kvi.KVCacheConfig(num_blocks=64, kv_cache_tensors=tensors, kv_cache_groups=groups)


def blocks(cfg) -> dict[str, int]:
    return {type(g.kv_cache_spec).__name__: g.kv_cache_spec.block_size for g in cfg.kv_cache_groups}


def test_a_finer_hash_block_gives_jenga_attention_pages_of_one_hash_block():
    plan, cfg = page_layer_plan(hybrid_config(attention_layer=1), 512, hash_block=32)
    assert plan.tokens_per_page == 32
    assert blocks(cfg) == {"MambaSpec": 96, "FullAttentionSpec": 32}  # the state columns stay vLLM's
    plan, cfg = page_layer_plan(hybrid_config(attention_layer=1), 512)  # vLLM's hash block: its block
    assert plan.tokens_per_page == 96 and blocks(cfg) == {"MambaSpec": 96, "FullAttentionSpec": 96}


def test_no_sub_block_pages_when_vllms_copy_would_not_move_a_whole_state_page():
    # layer 0 is the attention layer: its view (one 32-token page) is the one vLLM's copy keeps at
    # byte offset 0 and it covers only part of the first state layer's slice of a state page
    plan, cfg = page_layer_plan(hybrid_config(attention_layer=0), 512, hash_block=32)
    assert plan.tokens_per_page == 96 and blocks(cfg) == {"MambaSpec": 96, "FullAttentionSpec": 96}


def parallel_hybrid_config(n: int = 3):
    """vLLM's config of a Falcon-H1-like parallel hybrid (96-token blocks): every layer holds an
    attention cache and a Mamba state under the same layer index; vLLM lists attention first.  A
    layer's state outweighs all the attention views of a 32-token page together (as there)."""
    attn = kvi.FullAttentionSpec(block_size=96, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    state = kvi.MambaSpec(block_size=96, shapes=((49152,),), dtypes=(torch.bfloat16,), mamba_cache_mode="align")
    groups = [kvi.KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(n)], attn),
              kvi.KVCacheGroupSpec([f"model.layers.{i}.mixer" for i in range(n)], state)]
    raw = 64 * 2 * n * attn.page_size_bytes
    tensors = [kvi.KVCacheTensor(size=raw, layers=g.layer_names, layer_stride=attn.page_size_bytes,
                                 block_stride=attn.page_size_bytes) for g in groups]
    return kvi.KVCacheConfig(num_blocks=64, kv_cache_tensors=tensors, kv_cache_groups=groups)


def test_a_parallel_hybrid_gets_sub_block_pages_and_vllms_copy_moves_exactly_one_state_page():
    """Layer 0's attention and state views share byte offset 0 and one layer index: vLLM's copy
    keeps the first view it meets there, so the state's tensor comes first (in both of the
    runners' orders the state view is the one kept) and the plan may put states inside a block."""
    from vllm.model_executor.models.utils import extract_layer_index
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache, copy_kv_cache_blocks_inplace

    plan, cfg = page_layer_plan(parallel_hybrid_config(), 1024, hash_block=32)
    assert plan.tokens_per_page == 32 and blocks(cfg) == {"FullAttentionSpec": 32, "MambaSpec": 96}
    state = [type(g.kv_cache_spec) for g in cfg.kv_cache_groups].index(kvi.MambaSpec)
    unit, scale = cfg.kv_cache_tensors[0].block_stride, plan.exec_scale[state]
    src, dst = 2 * scale + plan.exec_offset, 5 * scale + plan.exec_offset  # state pages 2 and 5
    views = allocate_kv_cache(cfg, torch.device("cpu"), KVCacheLayout.LBHNC)
    by_layer = sorted(views, key=extract_layer_index)  # the model runner's order (bind_kv_cache)
    for order in (by_layer, list(views)):  # and the v2 runner's
        buf = views[order[0]].untyped_storage()
        flat = torch.empty(0, dtype=torch.uint8).set_(buf)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8))
        before = flat.clone()
        copy_kv_cache_blocks_inplace([views[n] for n in order], cfg.num_blocks, [(src, dst)])
        want = before.clone()
        want[dst * unit:(dst + scale) * unit] = before[src * unit:(src + scale) * unit]
        assert torch.equal(flat, want)
