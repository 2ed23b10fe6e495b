"""vLLM + jenga on a tiny Gemma-3 text model (5 sliding-window layers : 1 full): greedy
tokens equal stock vLLM's with ample memory (``JengaScheduler``) and with a budget that
forces preemption and eviction (``JengaAsyncScheduler``, vLLM's ``AsyncScheduler``
underneath; vLLM's CPU platform turns async scheduling itself off, so its steps still
run one at a time here)."""

from __future__ import annotations

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

from jenga.vllm import JengaAsyncScheduler, JengaScheduler

pytestmark = pytest.mark.xdist_group("vllm-gemma3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    out = compare("gemma3", root, tight_blocks=128, tight_kw=dict(scheduler_cls="jenga.vllm.JengaAsyncScheduler"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JENGA_VLLM_LAYOUT", "uniform")
        uniform = engine(model_dir("gemma3", root), jenga=True)
        out["uniform_got"] = greedy(uniform, workloads()["first"]) + greedy(uniform, workloads()["shared"])
    out["uniform"] = scheduler(uniform)
    yield out
    for llm in (*out["engines"], uniform):
        close(llm)


def test_page_layer_layout_gives_each_group_its_page_size(runs):
    sched = runs["ample"]
    assert sched.kv_cache_manager.plan.layout == "pages"
    pages = {g.spec.kind: g.page_bytes for g in sched.jenga.model.groups}
    assert pages["sliding"] == 5 * pages["full"]  # 5 sliding layers share a page, the full layer its own
    assert len(sched.kv_cache_config.kv_cache_groups) == 2


def test_ample_memory_equals_stock_with_prefix_hits(runs):
    assert type(runs["ample"]) is JengaScheduler
    check_ample(runs, min_hit_tokens=6 * 128)


def test_tight_budget_async_scheduler_preempts_evicts_and_equals_stock(runs):
    assert type(runs["tight"]) is JengaAsyncScheduler
    check_tight(runs)


def test_every_page_reclaimed(runs):
    check_reclaimed(runs)


def test_uniform_layout_keeps_vllms_groups_and_equals_stock(runs):
    sched = runs["uniform"]
    assert sched.kv_cache_manager.plan.layout == "uniform"
    assert len(sched.jenga.model.groups) == len(sched.kv_cache_config.kv_cache_groups)
    assert len({g.page_bytes for g in sched.jenga.model.groups}) == 1  # one vLLM block = one jenga page
    assert runs["uniform_got"] == runs["ref"]["first"] + runs["ref"]["shared"]
    assert sched.jenga.stats().prefix_hit_tokens >= 6 * 128
    assert sched.jenga.used_bytes == 0
    sched.jenga.check_integrity()
