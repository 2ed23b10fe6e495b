"""Speculative decoding inside vLLM with jenga's scheduler: greedy tokens equal stock vLLM's
with the same speculative config, with ample memory (prefix hits) and with a budget that
forces preemption and eviction; vLLM's acceptance counters are the same with and without
jenga.  Draft slots go through jenga's lookahead allocation, rejected drafts through its
``num_rejected`` path (the adapter's token sync).

* n-gram proposals on the tiny Gemma-3 (5 sliding-window layers : 1 full);
* a separate draft model (the tiny Llama's weights plus noise, so drafts are both accepted
  and rejected) on the tiny Llama: the draft's layers are laid out in jenga's one pool next to
  the target's (the plugin's page-layer rewrite groups them by kind with the target's).
* EAGLE (a one-layer EAGLE head on the tiny Llama; random quality: vLLM rejects most of its proposals),
  its layer in jenga's pool likewise;
* EAGLE-3 (a head over three of the tiny Llama's hidden states, with its own smaller draft vocabulary),
  its layer in jenga's pool likewise;
* MTP (a tiny MiMo target: Qwen2 layers plus one multi-token-prediction layer that vLLM runs as the
  drafter), the MTP layer's KV in jenga's pool next to the target's;
* MTP on a Mamba hybrid: ``tests/test_vllm_spec_hybrid.py`` (its own module: this module's engines,
  held by the fixture until the module ends, would share the process's parallel groups with it).

The draft-model, EAGLE, EAGLE-3 and MTP runs (45-80 s each on 2 shared cores) are in ``make test-vllm-slow``;
the n-gram runs (about 35 s) cover the lookahead and rejection paths in ``make test``.
"""

from __future__ import annotations

import pytest
from vllm_support import (
    allow_engines_after_numba,
    check_pages_reclaimed,
    check_pressure_effects,
    close,
    draft_dir,
    eagle3_dir,
    eagle_dir,
    engine,
    greedy,
    mimo_dir,
    model_dir,
    scheduler,
    spec_stats,
    workloads,
)

K = 3
MAX_TOKENS = 16


def counted(llm, prompts):
    """Greedy tokens of ``prompts`` and the spec-decoding counters these prompts moved."""
    before = spec_stats(llm)
    out = greedy(llm, prompts, max_tokens=MAX_TOKENS)
    after = spec_stats(llm)
    return out, {k: after.get(k, 0) - before.get(k, 0) for k in after}


def side_by_side(path: str, spec: dict, tight_blocks: int) -> dict:
    """Stock (ample) gives the reference of every workload; jenga runs ``first`` + ``shared``
    with ample memory and ``pressure`` with ``tight_blocks`` of vLLM's blocks of budget."""
    allow_engines_after_numba()
    w = workloads()
    ample_set = w["first"] + w["shared"][:4]
    kw = dict(speculative_config=spec, disable_log_stats=False)
    stock = engine(path, jenga=False, **kw)
    ref_ample, stock_ample = counted(stock, ample_set)
    ref_tight, stock_tight = counted(stock, w["pressure"])
    close(stock)
    ample = engine(path, jenga=True, **kw)
    got_ample, jenga_ample = counted(ample, ample_set)
    tight = engine(path, jenga=True, num_blocks=tight_blocks, max_model_len=320, **kw)
    got_tight, jenga_tight = counted(tight, w["pressure"])
    return dict(ref=(ref_ample, ref_tight), got=(got_ample, got_tight), stock=(stock_ample, stock_tight),
                jenga=(jenga_ample, jenga_tight), ample=scheduler(ample), tight=scheduler(tight),
                engines=(ample, tight))


NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module", params=[pytest.param("ngram", marks=pytest.mark.xdist_group("vllm-spec-ngram")),
                                        pytest.param("draft", marks=[pytest.mark.xdist_group("vllm-spec-draft"),
                                                                     pytest.mark.slow]),
                                        pytest.param("eagle", marks=[pytest.mark.xdist_group("vllm-spec-eagle"),
                                                                     pytest.mark.slow]),
                                        pytest.param("eagle3", marks=[pytest.mark.xdist_group("vllm-spec-eagle3"),
                                                                      pytest.mark.slow]),
                                        pytest.param("mtp", marks=[pytest.mark.xdist_group("vllm-spec-mtp"),
                                                                   pytest.mark.slow])])
def runs(request, tmp_path_factory):
    root = tmp_path_factory.getbasetemp()
    if request.param == "ngram":
        out = side_by_side(model_dir("gemma3", root), NGRAM, 128)
    elif request.param == "draft":
        target = model_dir("llama", root)
        out = side_by_side(target, {"model": draft_dir(target, root), "num_speculative_tokens": K}, 24)
    elif request.param in ("eagle", "eagle3"):
        target = model_dir("llama", root)
        head = (eagle_dir if request.param == "eagle" else eagle3_dir)(target, root)
        out = side_by_side(target, {"method": request.param, "model": head, "num_speculative_tokens": K}, 24)
    else:  # the MTP layer is in the target's own checkpoint
        out = side_by_side(mimo_dir(root), {"method": "mtp", "num_speculative_tokens": K}, 24)
    out["method"] = request.param
    yield out
    for llm in out["engines"]:
        close(llm)


def test_ample_memory_equals_stock_with_prefix_hits(runs):
    sched = runs["ample"]
    assert runs["got"][0] == runs["ref"][0]
    assert sched.num_preemptions == 0
    assert sched.jenga.stats().prefix_hit_tokens >= 4 * 128


def test_tight_budget_preempts_evicts_and_equals_stock(runs):
    assert runs["got"][1] == runs["ref"][1]
    check_pressure_effects(runs["tight"])


def test_drafts_are_proposed_accepted_and_rejected_as_with_stock(runs):
    for counters in (*runs["stock"], *runs["jenga"]):
        assert counters["draft_tokens"] > 0
        if runs["method"] != "eagle":  # the random EAGLE head: none accepted in the ample run
            assert 0 < counters["accepted_tokens"] < counters["draft_tokens"]  # both accept and reject paths ran
    # same tokens and same prefix hits in the ample run: the same proposals and acceptances
    assert runs["jenga"][0] == runs["stock"][0]


def test_draft_layers_live_in_jengas_pool(runs):
    sched = runs["ample"]
    layers = [name for g in sched.kv_cache_config.kv_cache_groups for name in g.layer_names]
    num_target = sched.vllm_config.model_config.get_num_layers(sched.vllm_config.parallel_config)
    if runs["method"] != "ngram":
        assert len(layers) > num_target  # the draft's attention layers are laid out by jenga too
    else:
        assert len(layers) == num_target
    assert sched.jenga.model.num_layers == len(layers)
    assert len(sched.kv_cache_config.kv_cache_tensors) == len(sched.jenga.model.groups)


def test_every_page_reclaimed(runs):
    check_pages_reclaimed(runs["ample"], runs["tight"])
