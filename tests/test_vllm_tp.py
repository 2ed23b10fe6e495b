"""``tensor_parallel_size=2`` (two CPU worker processes over gloo): vLLM + jenga's greedy
tokens equal stock vLLM's at the same parallelism, with the page-layer layout.  Four
worker processes start: about 110 s wall on this 2-core machine, so it runs in
``make test-vllm-slow``, not in ``make test`` (which must stay under 10 minutes on 2 cores)."""

from __future__ import annotations

import pytest
from vllm_support import close, engine, greedy, model_dir, scheduler, workloads

pytestmark = [pytest.mark.xdist_group("vllm-tp"), pytest.mark.slow]


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
