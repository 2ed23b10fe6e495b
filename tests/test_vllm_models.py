"""vLLM + jenga on tiny Llama-4 text (3 chunked local-attention layers : 1 full, 64-token
chunks), gpt-oss (attention sinks; sliding, full, sliding layers, 64-token window), Gemma-2
(sliding / full alternating, logit soft-capping) and Mistral with Ministral's interleaved windows
(3 sliding : 1 full):
greedy tokens equal stock vLLM's with ample memory and with a budget that forces
preemption and eviction.  One engine set per model (``xdist_group`` keeps a model's
tests in one worker)."""

from __future__ import annotations

import pytest
from vllm_support import check_ample, check_reclaimed, check_tight, close, compare

from jenga.vllm.admission import ADMISSION_ENV

KINDS = {"llama4": ["chunked", "full"], "gptoss": ["full", "sliding"], "gemma2": ["full", "sliding"],
         "ministral": ["full", "sliding"]}
# Llama-4 (chunked pages) serves the pressure workload without a preemption at any budget vLLM
# starts with when cached prefixes are admitted first (jenga.vllm.admission): it runs in vLLM's
# FCFS order here, so the preemption path stays covered
FCFS = {"llama4"}


@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group(f"vllm-{f}"))
                                        for f in KINDS])
def runs(request, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        if request.param in FCFS:
            mp.setenv(ADMISSION_ENV, "fcfs")
        out = compare(request.param, tmp_path_factory.getbasetemp(), tight_blocks=48)
    out["family"] = request.param
    yield out
    for llm in out["engines"]:
        close(llm)


def test_groups_are_jenga_kinds(runs):
    assert sorted(g.spec.kind for g in runs["ample"].jenga.model.groups) == KINDS[runs["family"]]


def test_ample_memory_equals_stock_with_prefix_hits(runs):
    check_ample(runs, min_hit_tokens=6 * 128)


def test_tight_budget_preempts_evicts_and_equals_stock(runs):
    check_tight(runs)


def test_every_page_reclaimed(runs):
    check_reclaimed(runs)
