"""The stand-in runner of the scheduler-level vLLM tests sees a broken page layout.

:mod:`vllm_kv_bytes` places every block in the workers' one KV buffer by the config's own
strides (block id times the block stride plus the layer's offset) and the runner of
:mod:`vllm_async_driver` asserts at every step that no two live pages share a byte.  Here:
jenga's page-layer layout puts page ``p`` of group ``g`` at ``p * P_g`` (plus the state sink),
each page's layers back to back (docs/memory-layout.md); and two mutant layouts make the
families' scenario (:mod:`test_vllm_sched_families`, tight budget: preemption and eviction)
fail: one group's layers without their offset (every layer of a page on the same bytes), and
one group's pages without their stride (page ids not scaled to the group's page size).
"""

from __future__ import annotations

import dataclasses

import pytest
from test_vllm_sched_families import FAMILIES, prompts
from vllm_async_driver import async_config, kv_config, make_scheduler, run
from vllm_kv_bytes import BufferLayout, LivePages, Overlap
from vllm_support import model_dir

from jenga.vllm import JengaScheduler
from jenga.vllm.plan import STATE_GROUPS_ENV, rewrite_config

pytestmark = pytest.mark.xdist_group("vllm-async")


def _config(family: str, root):
    folder, layers, tight = FAMILIES[family]
    cfg = async_config(model_dir(folder, root), max_model_len=320)
    cfg.scheduler_config.async_scheduling = False
    return cfg, rewrite_config(kv_config(cfg, layers, tight), 320)


@pytest.mark.parametrize("family", ["gemma3", "hybrid"])
def test_pages_sit_where_the_memory_layout_says(family, tmp_path_factory):
    """Page ``p`` of group ``g`` (exec id ``p * scale_g + sink``) spans ``[sink + p * P_g,
    sink + (p + 1) * P_g)``: its layers back to back, nothing outside."""
    _, kv = _config(family, tmp_path_factory.getbasetemp())
    plan, layout = kv.jenga_plan, BufferLayout(kv)
    unit = kv.kv_cache_tensors[0].block_stride
    for g, group in enumerate(kv.kv_cache_groups):
        size = sum(group.kv_cache_spec.page_size_bytes for _ in group.layer_names)
        for p in (0, 1, 7):
            block = p * plan.exec_scale[g] + plan.exec_offset
            assert layout.runs(g, block) == [(plan.exec_offset * unit + p * size,
                                              plan.exec_offset * unit + (p + 1) * size)]


def test_live_pages_that_share_a_byte_are_refused(tmp_path_factory):
    _, kv = _config("gemma3", tmp_path_factory.getbasetemp())
    plan, live = kv.jenga_plan, LivePages(BufferLayout(kv))
    live.update({(0, 0), (0, plan.exec_scale[0])})  # two sliding pages side by side
    live.update({(1, 0)})  # the first two left; a full-attention page on their bytes is fine now
    with pytest.raises(Overlap, match="live pages share bytes"):
        live.update({(1, 0), (0, 0)})


def _mutant(kv, mutant: str):
    """``kv`` with one group's layout broken (the group with the most layers)."""
    g = max(range(len(kv.kv_cache_groups)), key=lambda i: len(kv.kv_cache_groups[i].layer_names))
    names = set(kv.kv_cache_groups[g].layer_names)
    if mutant == "layer-offset":  # the workers view every layer of the group at the page's first bytes
        tensors = [dataclasses.replace(t, layer_stride=0) if names & set(t.layers) else t for t in kv.kv_cache_tensors]
        out = dataclasses.replace(kv, kv_cache_tensors=tensors)
        out.jenga_plan = kv.jenga_plan
        return out
    plan = kv.jenga_plan  # "page-stride": the scheduler's block ids of the group not scaled to its page
    scale = tuple(1 if i == g else s for i, s in enumerate(plan.exec_scale))
    assert scale != plan.exec_scale
    out = dataclasses.replace(kv)
    out.jenga_plan = dataclasses.replace(plan, exec_scale=scale)
    return out


@pytest.mark.parametrize("mutant", ["layer-offset", "page-stride"])
@pytest.mark.parametrize("family", ["gemma3", "hybrid"])
def test_a_broken_layout_fails_the_runner(family, mutant, tmp_path_factory, monkeypatch):
    if family == "hybrid" and mutant == "layer-offset":
        # vLLM's grouping leaves every group of this hybrid one layer (nothing to offset): the
        # state layers kept as one group give the mutant a group of three layers
        monkeypatch.setenv(STATE_GROUPS_ENV, "whole")
    cfg, kv = _config(family, tmp_path_factory.getbasetemp())
    bad = _mutant(kv, mutant)
    sched, hash_block = make_scheduler(JengaScheduler, cfg, bad)
    ps, arrivals = prompts()
    with pytest.raises(Overlap):
        run(sched, hash_block, bad, ps, arrivals=arrivals)


@pytest.mark.parametrize("family", ["gemma3", "hybrid"])
def test_the_same_scenario_passes_on_the_real_layout(family, tmp_path_factory):
    """The control of the mutants above: the real layout runs the scenario with pages checked."""
    cfg, kv = _config(family, tmp_path_factory.getbasetemp())
    sched, hash_block = make_scheduler(JengaScheduler, cfg, kv)
    ps, arrivals = prompts()
    tokens, runner, *_ = run(sched, hash_block, kv, ps, arrivals=arrivals)
    assert all(len(t) == 24 for t in tokens)
    assert runner.live.checked >= 50 and runner.checked > 0  # pages checked as they became live
    assert sched.num_preemptions > 0
