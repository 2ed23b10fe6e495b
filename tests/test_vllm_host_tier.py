"""jenga's host tier inside vLLM 0.32 (CPU) end to end, switched on by vLLM's ``kv_offloading_size``.

Stock vLLM 0.32's CPU build refuses its own offloading ("CPU Offloading is currently only
supported on CUDA-alike and XPU GPUs"), so the reference is stock without offloading (ample
memory): greedy tokens must be equal.  jenga runs a tight device budget with a host tier several
times its size over three rounds (the pressure prompts, other documents' prompts, the pressure
prompts again): pages are demoted as the device evicts them, the third round's hits are promoted
from the host before the step's forward (copied by the connector in vLLM's worker), requests are
preempted.  A copy that fails in the worker stops the step before any promoted page is written;
the scheduler's pages all come back; host memory is released at shutdown.

Qwen3-Next's run is built with the prefill reserve off (``JENGA_VLLM_RESERVE=off``): with it on,
the default, its admissions leave the pages the prompts admitted before still need, and no
request is preempted on these rounds (as in ``tests/test_vllm_hybrid.py``), so the preemption path
with a host tier would go unchecked.
"""

from __future__ import annotations

import pytest
from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group
from vllm.v1.request import RequestStatus
from vllm_support import close, engine, greedy, model_dir, scheduler, workloads

from jenga.errors import InsufficientMemoryError
from jenga.vllm.admission import RESERVE_ENV
from jenga.vllm.connector import JengaConnector
from jenga.vllm.host_copies import HostCopyError, HostPageCopies

pytestmark = pytest.mark.slow

# family -> (engine kwargs, tight budget in vLLM blocks, host GiB: about 4x the tight device pool,
# environment switches of jenga's engine: module doc)
FAMILIES = {
    "gemma3": (dict(dtype="float32"), 128, 0.008, {}),
    "qwen3_next": (dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16"), 30, 0.016, {RESERVE_ENV: "off"}),
}


def rounds() -> list[list[list[int]]]:
    ps = workloads()["pressure"]
    return [ps, workloads(seed=1)["pressure"], ps]


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group(f"vllm-{f}"))
                                        for f in FAMILIES])
def runs(request, tmp_path_factory):
    kw, tight, host, env = FAMILIES[request.param]
    path = model_dir(request.param, tmp_path_factory.getbasetemp())
    stock = engine(path, jenga=False, max_model_len=320, **kw)
    ref = [greedy(stock, ps) for ps in rounds()]
    close(stock)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        llm = engine(path, jenga=True, num_blocks=tight, max_model_len=320, kv_offloading_size=host, **kw)
    worker = get_kv_transfer_group()
    got = [greedy(llm, ps) for ps in rounds()]
    sched = scheduler(llm)
    out = dict(ref=ref, got=got, sched=sched, worker=worker, copies=worker.copies, stats=sched.jenga.stats())
    close(llm)
    return out


def test_greedy_tokens_equal_stock_without_offloading(runs):
    assert runs["got"] == runs["ref"]


def test_demotion_promotion_preemption_and_eviction_in_one_run_with_host_hits(runs):
    st, sched = runs["stats"], runs["sched"]
    print(f"\npreemptions {sched.num_preemptions}, evicted pages {st.evicted_pages}, demotions {st.demotions}, "
          f"promotions {st.promotions}, host hit tokens {st.host_hit_tokens}, prefix hit tokens {st.prefix_hit_tokens}")
    assert isinstance(sched.connector, JengaConnector) and isinstance(runs["worker"], JengaConnector)
    assert st.demotions > 0 and st.promotions > 0 and st.host_hit_tokens > 0, st
    assert sched.num_preemptions > 0 and st.evicted_pages > 0, (sched.num_preemptions, st)
    # the worker copied exactly the pages the scheduler's plans named
    assert (runs["copies"].pages_demoted, runs["copies"].pages_promoted) == (st.demotions, st.promotions)


def test_every_page_back_and_host_memory_released_at_shutdown(runs):
    mgr = runs["sched"].jenga
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()  # the host tier's pins, pending pairs and index included
    assert runs["copies"].host_bytes == 0  # the worker's connector gave its host buffer back


def test_a_host_smaller_than_one_large_page_fails_at_start(tmp_path_factory):
    path = model_dir("gemma3", tmp_path_factory.getbasetemp())
    with pytest.raises(InsufficientMemoryError, match="kv_offloading_size gives the host tier"):
        engine(path, jenga=True, num_blocks=128, max_model_len=320, kv_offloading_size=1e-6)


def test_a_failing_copy_writes_no_promoted_page_and_leaks_no_page(tmp_path_factory, monkeypatch):
    """The worker's copy of a promotion fails (injected, after the plan's demotes ran): the step
    raises ``HostCopyError`` before any promoted page is written, and once the engine's requests
    are aborted every device page is back and the host tier holds no pin."""
    kw, tight, host, _ = FAMILIES["gemma3"]
    path = model_dir("gemma3", tmp_path_factory.getbasetemp())
    llm = engine(path, jenga=True, num_blocks=tight, max_model_len=320, kv_offloading_size=host, **kw)
    copies, sched = get_kv_transfer_group().copies, scheduler(llm)
    seen = {}
    execute, gather = HostPageCopies.execute, HostPageCopies._gather

    def recording(self, plan):
        if plan is not None and plan.promote:  # the promote targets' bytes before the plan
            seen["plan"] = plan
            seen["before"] = {g: self.device_rows[g][p[:, 1]].clone() for g, p in plan.promote.items()}
        return execute(self, plan)

    def failing(self, rows, ids, to):
        if any(rows is r for r in self.host_rows):  # a promotion's host read
            raise RuntimeError("injected copy failure")
        return gather(self, rows, ids, to)

    monkeypatch.setattr(HostPageCopies, "execute", recording)
    monkeypatch.setattr(HostPageCopies, "_gather", failing)
    with pytest.raises(Exception) as info:
        for ps in rounds():
            greedy(llm, ps)
    assert "injected copy failure" in repr(info.value) or isinstance(info.value, HostCopyError)
    plan = seen["plan"]
    for g, pairs in plan.promote.items():
        assert (copies.device_rows[g][pairs[:, 1]] == seen["before"][g]).all()  # no promoted page written
    assert copies.pages_promoted == 0
    sched.finish_requests(list(sched.requests), RequestStatus.FINISHED_ABORTED)
    mgr = sched.jenga
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()
    monkeypatch.undo()
    close(llm)
    assert copies.host_bytes == 0
