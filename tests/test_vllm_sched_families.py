"""jenga's scheduler against vLLM's own on attention families, at the scheduler level: the real
``Scheduler`` with jenga's adapter and with vLLM's ``KVCacheManager``, the real KV-cache
planning (vLLM's grouping, then the plugin's page-layer rewrite on jenga's side), real
``Request``s, and the stand-in runner of :mod:`vllm_async_driver` that writes every computed
token through the block tables and reads back every position a layer attends to (a sliding
window's last ``W`` tokens, a local chunk).  No model runs, so this module runs on every vLLM
version ``make test`` installs (0.32 in ``.venv``, 0.33 and 0.34, whose CPU builds do not exist).

Greedy "outputs" (hashes of what was read back) equal stock's token for token with ample memory
(prefix hits) and with a budget that forces preemption and eviction."""

from __future__ import annotations

import pytest
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_async_driver import async_config, kv_config, make_scheduler, run
from vllm_support import model_dir, workloads

from jenga.vllm import JengaScheduler
from jenga.vllm.admission import ADMISSION_ENV
from jenga.vllm.plan import rewrite_config

pytestmark = pytest.mark.xdist_group("vllm-async")

#: family -> (tiny model folder of vllm_support, one kind per layer, tight budget in vLLM blocks per layer)
FAMILIES = {
    "gemma3": ("gemma3", [("sliding", 64)] * 5 + ["full"], 16),
    "llama4": ("llama4", [("chunked", 64)] * 3 + ["full"], 16),
    # a Mamba hybrid in align mode (3 state layers : 1 full-attention layer, model runner V2's
    # state columns); the model folder only gives vLLM a config, the kinds come from here
    "hybrid": ("llama", ["mamba"] * 3 + ["full"], 16),
}


def prompts():
    w = workloads()
    ps = w["first"] + w["shared"] + w["pressure"]
    return ps, [0] + [4] * len(w["shared"]) + [8] * len(w["pressure"])


#: rows run in vLLM's first-come-first-served order, so the preemption path stays covered
FCFS = {("llama4", "tight")}


@pytest.fixture(scope="module", params=[(f, b) for f in FAMILIES for b in ("ample", "tight")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def runs(request, tmp_path_factory):
    family, budget = request.param
    folder, layers, tight = FAMILIES[family]
    path = model_dir(folder, tmp_path_factory.getbasetemp())
    ps, arrivals = prompts()
    out = {"budget": budget, "family": family}
    mp = pytest.MonkeyPatch()
    if (family, budget) in FCFS:  # vLLM's order: hits-first admission avoids every preemption here
        mp.setenv(ADMISSION_ENV, "fcfs")
    for name, cls in (("stock", Scheduler), ("jenga", JengaScheduler)):
        cfg = async_config(path, max_model_len=512 if budget == "ample" else 320)
        cfg.scheduler_config.async_scheduling = False
        kv = kv_config(cfg, layers, 512 if budget == "ample" else tight)
        if cls is JengaScheduler:  # what jenga's vllm.general_plugins entry point does in the engine core
            kv = rewrite_config(kv, cfg.model_config.max_model_len)
        sched, hash_block = make_scheduler(cls, cfg, kv)
        tokens, runner, steps, _ = run(sched, hash_block, kv, ps, arrivals=arrivals)
        out[name] = dict(sched=sched, tokens=tokens, runner=runner, kv=kv)
    mp.undo()
    return out


def test_vllm_groups_the_layers_by_kind(runs):
    kinds = {type(g.kv_cache_spec).__name__ for g in runs["stock"]["kv"].kv_cache_groups}
    assert len(kinds) == 2 and "FullAttentionSpec" in kinds, kinds
    assert {g.spec.kind for g in runs["jenga"]["sched"].jenga.model.groups} >= {"full"}


def test_outputs_equal_stock_scheduler(runs):
    assert runs["jenga"]["tokens"] == runs["stock"]["tokens"]
    assert all(len(t) == 24 for t in runs["jenga"]["tokens"])
    assert runs["jenga"]["runner"].checked > 0
    if runs["family"] == "hybrid":  # states resumed through the block table, after a hit or a chunk
        assert runs["jenga"]["runner"].states_checked > 0 and runs["stock"]["runner"].states_checked > 0


def test_hits_and_preemption_with_eviction_under_pressure(runs):
    sched = runs["jenga"]["sched"]
    st = sched.jenga.stats()
    assert st.prefix_hit_tokens > 0
    if runs["budget"] == "tight":
        assert sched.num_preemptions > 0 and st.evicted_pages > 0, (sched.num_preemptions, st)
    else:
        assert sched.num_preemptions == 0
    assert sched.jenga.used_bytes == 0 and not sched.jenga.requests
    sched.jenga.check_integrity()
