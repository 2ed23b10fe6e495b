"""The server's engine loop refreshes its gauges (``manager.stats()``, whose needed bytes cost O(held
pages)) at most every ``metrics_interval_s`` while requests run, and whenever none does."""

from __future__ import annotations

import time

import jenga
from jenga import SamplingParams
from jenga.server.engine_loop import EngineLoop
from jenga.server.metrics import ServerMetrics


def _serve(interval: float) -> tuple[int, int, jenga.LLM, ServerMetrics]:
    """(stats() calls while requests ran, engine steps, llm, metrics) of four 48-token requests
    through the loop (the refreshes while it idles, every poll, are not counted)."""
    llm = jenga.LLM("tiny-llama", kv_memory="4MiB", max_num_seqs=4)
    metrics = ServerMetrics([g.name for g in llm.manager.model.groups])
    calls = []
    stats = llm.manager.stats
    llm.manager.stats = lambda: (calls.append(1) if llm.has_unfinished else None) or stats()
    loop = EngineLoop(llm, metrics, metrics_interval_s=interval)
    loop.start()
    try:
        params = SamplingParams(max_tokens=48, ignore_eos=True, temperature=0.0)
        loop.call(lambda llm: [llm.add_request(list(range(1, 40 + i)), params, request_id=f"r{i}")
                               for i in range(4)]).result(30)
        steps0 = llm.metrics.steps
        deadline = time.monotonic() + 60
        while loop.call(lambda llm: llm.has_unfinished).result(30):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        steps = llm.metrics.steps - steps0
        n = len(calls)
    finally:
        loop.stop()
    return n, steps, llm, metrics


def test_the_gauges_refresh_at_most_every_interval_while_requests_run():
    calls, steps, llm, metrics = _serve(3600.0)
    assert steps >= 48
    # the first step's refresh only (the one after the last step sees nothing running)
    assert calls <= 1, (calls, steps)
    # the refresh after the last step saw everything
    reg = metrics.registry
    assert reg.get_sample_value("jenga_prefix_query_tokens_total") == llm.manager.prefix_query_tokens > 0


def test_without_an_interval_every_step_refreshes():
    calls, steps, _, _ = _serve(0.0)
    assert calls >= steps - 1
