"""``JengaAsyncScheduler`` with async scheduling really on: in-flight placeholder tokens end to end
through vLLM's ``AsyncScheduler`` and jenga's manager, against stock ``AsyncScheduler``.

vLLM's CPU platform forces ``async_scheduling = False`` (``vllm/platforms/cpu.py``) and its CPU
model runner has no async output path (CUDA streams / events), so a real engine here never
schedules ahead.  This module switches async scheduling on in the config after the platform's
check and drives both schedulers with the stand-in runner of :mod:`vllm_async_driver`, which
checks every computed token's KV slot through the block tables the scheduler sent.  Greedy
"outputs" (a hash of the tokens read back) equal stock's token for token, with ample memory
(prefix hits) and with a budget that forces preemption."""

from __future__ import annotations

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm_async_driver import async_config, kv_config, make_scheduler, run
from vllm_support import model_dir, workloads

from jenga.vllm import JengaAsyncScheduler
from jenga.vllm.plan import rewrite_config

pytestmark = pytest.mark.xdist_group("vllm-async")

LAYERS = 2  # vllm_support's tiny Llama


def prompts():
    w = workloads()
    ps = w["first"] + w["shared"] + w["pressure"]
    # the first request alone, the shared-prefix wave 4 steps later, the long ones together after
    return ps, [0] + [4] * len(w["shared"]) + [8] * len(w["pressure"])


@pytest.fixture(scope="module", params=[("ample", 512), ("tight", 20)], ids=lambda p: p[0])
def runs(request, tmp_path_factory):
    path = model_dir("llama", tmp_path_factory.getbasetemp())
    ps, arrivals = prompts()
    out = {}
    for name, cls in (("stock", AsyncScheduler), ("jenga", JengaAsyncScheduler)):
        cfg = async_config(path)
        kv = kv_config(cfg, LAYERS, request.param[1])
        if cls is JengaAsyncScheduler:  # what jenga's vllm.general_plugins entry point does in the engine core
            kv = rewrite_config(kv, cfg.model_config.max_model_len)
        sched, hash_block = make_scheduler(cls, cfg, kv)
        tokens, runner, steps, placeholders = run(sched, hash_block, kv, ps, arrivals=arrivals)
        out[name] = dict(sched=sched, tokens=tokens, runner=runner, steps=steps, placeholders=placeholders)
    out["budget"] = request.param[0]
    return out


def test_async_scheduling_is_on_with_jengas_scheduler(runs):
    assert type(runs["jenga"]["sched"]) is JengaAsyncScheduler
    assert runs["jenga"]["sched"].scheduler_config.async_scheduling


def test_tokens_computed_before_their_ids_are_known(runs):
    for name in ("stock", "jenga"):
        assert runs[name]["placeholders"] > 0, name


def test_outputs_equal_stock_async_scheduler(runs):
    assert runs["jenga"]["tokens"] == runs["stock"]["tokens"]
    assert all(len(t) == 24 for t in runs["jenga"]["tokens"])
    assert runs["jenga"]["runner"].checked > 0  # earlier positions were read back through jenga's tables


def test_hits_or_preemption_and_every_page_reclaimed(runs):
    sched = runs["jenga"]["sched"]
    mgr = sched.jenga
    st = mgr.stats()
    assert st.prefix_hit_tokens > 0
    if runs["budget"] == "tight":
        assert sched.num_preemptions > 0 and st.evicted_pages > 0, (sched.num_preemptions, st)
    else:
        assert sched.num_preemptions == 0
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()
