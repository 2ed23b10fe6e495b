"""``tensor_parallel_size=2`` and ``pipeline_parallel_size=2`` (two CPU worker processes over
gloo), ``data_parallel_size=2`` (two engine cores): vLLM + jenga's greedy tokens equal stock
vLLM's at the same parallelism, with the page-layer layout.  Each engine starts two worker
processes or engine cores: about 110 s wall for tensor parallelism on this 2-core machine,
about 3 to 4.5 min each for pipeline parallelism (its compiled model) and data parallelism (four
engines), so they run in ``make test-vllm-slow``, not in ``make test`` (which must stay under 10
minutes on 2 cores)."""

from __future__ import annotations

import os

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


def async_engine(path: str, *, jenga: bool, num_blocks: int | None = None, **kw):
    """An ``AsyncLLM`` (the OpenAI server's engine client) over ``path``, as ``engine`` builds an ``LLM``."""
    from vllm import envs as vllm_envs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = dict(model=path, dtype="float32", enforce_eager=True, max_model_len=512, block_size=32, max_num_seqs=8,
                seed=0, kv_cache_memory_bytes=16 << 20, num_gpu_blocks_override=num_blocks, disable_log_stats=False)
    if jenga:
        args["scheduler_cls"] = "jenga.vllm.JengaScheduler"
    vllm_envs.disable_envs_cache()
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**{**args, **kw}))


def serve(llm, prompts, tag: str) -> list[tuple[list[int], int]]:
    """Greedy tokens and cached prompt tokens of ``prompts``, all submitted at once."""
    import asyncio

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)

    async def one(i, p):
        async for out in llm.generate(TokensPrompt(prompt_token_ids=p), sp, request_id=f"{tag}{i}"):
            last = out
        return list(last.outputs[0].token_ids), last.num_cached_tokens

    async def every():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.get_event_loop().run_until_complete(every())


def registry_sum(name: str) -> dict[str, float]:
    """The samples called ``name`` in this process's Prometheus registry, summed per engine label."""
    from prometheus_client import REGISTRY

    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                engine_label = sample.labels.get("engine", "")
                out[engine_label] = out.get(engine_label, 0.0) + sample.value
    return out


#: a budget (vLLM blocks per rank) under which the pressure workload preempts on each rank
DP_TIGHT_BLOCKS = 16


def test_data_parallel_2_dense_equals_stock(tmp_path_factory, monkeypatch):
    """``data_parallel_size=2`` through ``AsyncLLM`` (what ``vllm serve --data-parallel-size 2`` runs): a
    dense model's ranks are independent engine cores, each with its own jenga scheduler (vLLM sets each
    core's data-parallel size to 1 before building it); the frontend balances requests over them.
    Greedy tokens and cached prompt tokens equal stock's, ample and tight budgets, preemption in the tight one."""
    import asyncio

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    asyncio.set_event_loop(asyncio.new_event_loop())
    path = model_dir("llama", tmp_path_factory.getbasetemp())
    w = workloads()
    tight = dict(num_blocks=DP_TIGHT_BLOCKS, max_model_len=320)
    runs = {}
    for name, jenga, budget, loads in (("stock", False, {}, ("first", "shared", "pressure")),
                                       ("jenga", True, {}, ("first", "shared")),
                                       ("stock tight", False, tight, ("pressure",)),
                                       ("jenga tight", True, tight, ("pressure",))):
        llm = async_engine(path, jenga=jenga, data_parallel_size=2, **budget)
        try:
            runs[name] = {k: serve(llm, w[k], k) for k in loads}
            runs[name]["preempted"] = sum(registry_sum("vllm:num_preemptions_total").values())
            # the ranks' engine cores are child processes; an engine that ran in this process is not one
            runs[name]["jenga pools"] = len(set(registry_sum("jenga_kv_pool_bytes")) - {str(os.getpid())})
        finally:
            llm.shutdown()
    for n, r in runs.items():
        done = [(k, out) for k, out in r.items() if k in w]
        hits = sum(c for _, out in done for _, c in out)
        prompt = sum(len(p) for k, _ in done for p in w[k])
        print(f"data parallel 2, {n} ({'+'.join(k for k, _ in done)}): prompt tokens computed {prompt - hits}, "
              f"hit tokens {hits}, preemptions {r['preempted']:.0f}")
    ref = runs["stock"]
    for k in ("first", "shared"):
        assert runs["jenga"][k] == ref[k]  # tokens and cached prompt tokens per request
    assert sum(c for _, c in runs["jenga"]["shared"]) > 0 and runs["jenga"]["preempted"] == 0
    assert [t for t, _ in runs["jenga tight"]["pressure"]] == [t for t, _ in ref["pressure"]]
    assert [t for t, _ in runs["stock tight"]["pressure"]] == [t for t, _ in ref["pressure"]]
    assert runs["jenga tight"]["preempted"] > 0
    assert runs["jenga"]["jenga pools"] == 2  # one jenga scheduler per rank
