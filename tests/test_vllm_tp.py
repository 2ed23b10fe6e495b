"""``tensor_parallel_size=2`` and ``pipeline_parallel_size=2`` (two CPU worker processes over
gloo): vLLM + jenga's greedy tokens equal stock vLLM's at the same parallelism, with the
page-layer layout.  Each engine starts two worker processes: about 110 s wall for tensor
parallelism on this 2-core machine, more for pipeline parallelism (its compiled model), so
they run in ``make test-vllm-slow``, not in ``make test`` (which must stay under 10 minutes on
2 cores)."""

from __future__ import annotations

import pytest
from vllm_support import close, engine, greedy, model_dir, scheduler, workloads

pytestmark = [pytest.mark.xdist_group("vllm-tp"), pytest.mark.slow]

#: a budget (vLLM blocks per stage) under which the pressure workload preempts
PP_TIGHT_BLOCKS = 96


def test_tensor_parallel_2_equals_stock(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    path = model_dir("gemma3", tmp_path_factory.getbasetemp())
    prompts = workloads()["first"] + workloads()["shared"]
    kw = dict(tensor_parallel_size=2, distributed_executor_backend="mp")
    stock = engine(path, jenga=False, **kw)
    ref = greedy(stock, prompts[:1]) + greedy(stock, prompts[1:])
    close(stock)
    llm = engine(path, jenga=True, **kw)
    got = greedy(llm, prompts[:1]) + greedy(llm, prompts[1:])
    sched = scheduler(llm)
    try:
        assert got == ref
        assert sched.kv_cache_manager.plan.layout == "pages"
        assert sched.jenga.stats().prefix_hit_tokens > 0
        assert sched.jenga.used_bytes == 0
        sched.jenga.check_integrity()
    finally:
        close(llm)


def counters(llm) -> dict[str, int]:
    """vLLM's own counters of ``llm`` (``disable_log_stats=False``): prompt tokens, prefix-cache
    hit tokens, preemptions."""
    names = {"vllm:prompt_tokens": "prompt", "vllm:prefix_cache_hits": "hits", "vllm:num_preemptions": "preempted"}
    return {names[m.name]: int(m.value) for m in llm.get_metrics() if m.name in names}


def test_pipeline_parallel_2_equals_stock(tmp_path_factory, monkeypatch):
    """Two pipeline stages (Gemma-3's six layers: three sliding-window on the first stage, two
    sliding and the full-attention layer on the second), one jenga plan over both stages' layers
    (``jenga.vllm.plan.page_layer_plans``).  vLLM 0.32's CPU build runs pipeline parallelism only
    with its compiled model (with ``enforce_eager=True`` the last stage fails its first step:
    ``assert self.intermediate_tensors is not None``, allocated only by the compile warm-up)."""
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    path = model_dir("gemma3", tmp_path_factory.getbasetemp())
    w = workloads()
    kw = dict(pipeline_parallel_size=2, distributed_executor_backend="mp", enforce_eager=False,
              disable_log_stats=False)
    tight = dict(num_blocks=PP_TIGHT_BLOCKS, max_model_len=320)
    stock = engine(path, jenga=False, **kw, **tight)
    ref = {name: greedy(stock, prompts) for name, prompts in w.items() if name != "pressure"}
    before = counters(stock)
    ref["pressure"] = greedy(stock, w["pressure"])
    stock_counts = {k: v - before[k] for k, v in counters(stock).items()}
    close(stock)
    llm = engine(path, jenga=True, **kw)
    try:
        assert [greedy(llm, w[k]) for k in ("first", "shared")] == [ref["first"], ref["shared"]]
        sched = scheduler(llm)
        print(f"pipeline parallel 2, first + shared: stock ({PP_TIGHT_BLOCKS} blocks) {before}, jenga (ample) "
              f"{counters(llm)}")
        assert sched.kv_cache_manager.plan.layout == "pages"
        assert len(sched.kv_cache_manager.plan.model.groups) == 2  # sliding + full, over both stages
        assert sched.num_preemptions == 0 and sched.jenga.stats().prefix_hit_tokens > 0
        assert sched.jenga.used_bytes == 0
        sched.jenga.check_integrity()
    finally:
        close(llm)
    llm = engine(path, jenga=True, **kw, **tight)
    try:
        assert greedy(llm, w["pressure"]) == ref["pressure"]
        sched, counts = scheduler(llm), counters(llm)
        print(f"pipeline parallel 2, pressure, {PP_TIGHT_BLOCKS} blocks: stock {stock_counts}, jenga {counts}")
        assert sched.num_preemptions > 0 and sched.jenga.stats().evicted_pages > 0
        assert sched.jenga.used_bytes == 0
        sched.jenga.check_integrity()
    finally:
        close(llm)
