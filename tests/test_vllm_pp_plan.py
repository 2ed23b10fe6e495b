"""Pipeline parallelism's KV-cache plan (fast, no worker): vLLM's planner gives each stage a config
of its own layers; jenga's rewrite of those configs keeps each stage's views on its own layers and
gives every stage the same block ids, pages and large pages, so the one scheduler's block ids
address each page's bytes inside its large page on every stage.  The end-to-end run against stock
vLLM is in ``tests/test_vllm_tp.py`` (``make test-vllm-slow``)."""

from __future__ import annotations

import math
from functools import reduce

import pytest
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
from vllm_async_driver import async_config, layer_specs, make_scheduler, run
from vllm_support import model_dir

from jenga.vllm import JengaScheduler
from jenga.vllm.compat import kv_cache_configs
from jenga.vllm.plan import page_layer_plan, rewrite_configs

pytestmark = pytest.mark.xdist_group("vllm-async")

KINDS = [("sliding", 64)] * 5 + ["full"]  # the tiny Gemma-3: five sliding-window layers, one full


def stage_specs(cfg, split: int) -> list[dict]:
    """vLLM's per-layer specs of each of two pipeline stages (layers [0, split) and [split, 6))."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    specs = layer_specs(cfg, KINDS)
    resolve_kv_cache_layout(cfg, [["LBNHC"]], specs.values())
    names = list(specs)
    return [{n: specs[n] for n in names[:split]}, {n: specs[n] for n in names[split:]}]


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    cfg = async_config(model_dir("gemma3", tmp_path_factory.getbasetemp()))
    cfg.scheduler_config.async_scheduling = False
    per_stage = stage_specs(cfg, 3)
    page = next(iter(per_stage[0].values())).page_size_bytes
    stock = kv_cache_configs(cfg, per_stage, [40 * page * 3, 40 * page * 3])
    return cfg, per_stage, stock


def views(kv):
    """(group index, layer index in the group, layer name, tensor) of every layer view of ``kv``."""
    for t in kv.kv_cache_tensors:
        g = next(i for i, grp in enumerate(kv.kv_cache_groups) if t.layers[0] in grp.layer_names)
        for j, name in enumerate(t.layers):
            yield g, j, name, t


def test_each_stage_views_its_own_layers_in_pages_every_stage_shares(stages):
    cfg, per_stage, stock = stages
    ours = rewrite_configs(stock, cfg.model_config.max_model_len)
    plan = ours[0].jenga_plan
    assert all(kv.jenga_plan is plan for kv in ours) and plan.layout == "pages"
    # as stock: the same groups (vLLM's six, jenga's two kinds) and blocks on every stage, each
    # stage's layers and no other
    assert [len(kv.kv_cache_groups) for kv in stock] == [6, 6] and [len(kv.kv_cache_groups) for kv in ours] == [2, 2]
    assert {kv.num_blocks for kv in ours} == {ours[0].num_blocks}
    for kv, mine, st in zip(ours, per_stage, stock, strict=True):
        assert sorted(n for g in kv.kv_cache_groups for n in g.layer_names) == sorted(mine)
        assert sorted(n for t in kv.kv_cache_tensors for n in t.layers) == sorted(mine)
        assert sorted(n for g in st.kv_cache_groups for n in g.layer_names) == sorted(mine)
    # stage 0 holds no full-attention layer: its group stays (same block ids), empty, with no view
    kinds = [g.spec.kind for g in plan.model.groups]
    assert [len(g.layer_names) for g in ours[0].kv_cache_groups] == [3 if k == "sliding" else 0 for k in kinds]
    assert [len(g.layer_names) for g in ours[1].kv_cache_groups] == [2 if k == "sliding" else 1 for k in kinds]
    # the scheduler's config is stage 0's (vLLM asserts equal block counts); it carries the plan
    assert generate_scheduler_kv_cache_config(ours).jenga_plan == plan
    # every stage: every page's layer slices lie inside that page, and the highest one in the buffer
    unit = ours[0].kv_cache_tensors[0].block_stride
    pages = [s * unit for s in plan.exec_scale]
    large = reduce(math.lcm, pages)
    for kv in ours:
        for g, j, name, t in views(kv):
            assert t.block_stride == unit
            useful = kv.kv_cache_groups[g].kv_cache_spec.page_size_bytes
            assert j * t.layer_stride + useful <= pages[g], (name, g)
            assert (kv.num_blocks - 1) * unit + j * t.layer_stride + useful <= t.size
        assert kv.num_blocks * unit >= plan.memory_bytes - large  # all but the slack page addressable
    # rewriting each stage alone (the layout of one stage's layers) would give the stages different
    # pages: the scheduler's block ids would address other bytes on the second stage
    alone = [page_layer_plan(kv, cfg.model_config.max_model_len)[0] for kv in stock]
    assert alone[0].exec_scale != alone[1].exec_scale or len(alone[0].model.groups) != len(alone[1].model.groups)


def test_scheduler_serves_on_the_first_stages_config(stages):
    """The scheduler is built from stage 0's config, whose full-attention group has no layer; it
    still allocates that group's pages (stage 1 computes them), shares prefixes and frees all."""
    cfg, _, stock = stages
    ours = rewrite_configs(stock, cfg.model_config.max_model_len)
    kv = generate_scheduler_kv_cache_config(ours)
    cfg.cache_config.num_gpu_blocks = kv.num_blocks
    sched, hash_block = make_scheduler(JengaScheduler, cfg, kv)
    shared = list(range(3, 163))
    out, *_ = run(sched, hash_block, kv, [shared + [7, 8, 9], shared + [10, 11]], max_tokens=4)
    assert [len(o) for o in out] == [4, 4]
    mgr = sched.kv_cache_manager.manager
    assert sorted(g.spec.kind for g in mgr.model.groups) == ["full", "sliding"]
    assert mgr.stats().prefix_hit_tokens > 0
    mgr.check_integrity()
    assert mgr.used_bytes == 0
