"""The longest request the engine promises (``capacity.max_context_tokens``: `jenga plan`'s
figure and the server's length check) runs alone on a fresh engine.

A sliding layer holds its window plus every token of the step, so the scheduler shrinks a
prefill chunk that does not fit (down to one token a step) instead of refusing the request,
and the capacity rule counts the most pages any step of the request holds (a sliding or
chunked group's count is not monotone in the length).
"""

from __future__ import annotations

import httpx
import pytest

import jenga
from jenga.baselines import make_manager
from jenga.capacity import max_context_tokens, pages_for_context, peak_pages
from jenga.core.specs import ModelSpec
from jenga.engine.tiny import TINY_MODELS, tiny_hf_config
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.scheduler import Scheduler
from jenga.sched.sequence import Sequence
from jenga.server.app import create_app
from jenga.server.launch import BackgroundServer

OUT = 2  # output tokens: the promise covers prompt + output


def run_alone(mgr, total: int, budget: int = 2048) -> tuple[Sequence, Scheduler]:
    """One request of ``total`` tokens (prompt + OUT outputs) through the engine's scheduler,
    tokens 'sampled' without a model (the scheduler and manager are torch-free)."""
    sched = Scheduler(mgr, max_num_batched_tokens=budget)
    seq = Sequence("r", [5] * (total - OUT), SamplingParams(max_tokens=OUT, ignore_eos=True, temperature=0.0))
    sched.add(seq)
    while sched.has_unfinished:
        plan = sched.schedule()
        sched.update(plan, [7 if item.sample else None for item in plan.scheduled])
    return seq, sched


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
@pytest.mark.parametrize("mib", [1, 2, 4])
def test_promised_longest_request_runs_alone(name, mib):
    spec = ModelSpec.from_hf_config(tiny_hf_config(name), dtype="fp32")  # the engine's default dtype
    mgr = make_manager("jenga", spec, mib << 20)
    cap = max_context_tokens(mgr)
    total = min(cap or spec.max_model_len, spec.max_model_len)
    seq, _ = run_alone(mgr, total)
    assert seq.finish_reason == "length" and len(seq.output_token_ids) == OUT
    assert not mgr.requests
    mgr.check_integrity()


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-ministral", "tiny-gemma2"])
def test_the_rule_is_the_schedulers(name):
    """``max_context_tokens`` = L says the step computing token L fits (the next token's page
    too); the last sampled token is never computed, so a request of L + 2 tokens runs alone
    and one of L + 3 fails with the typed error: the rule is the scheduler's, not a guess.
    (With two kinds whose counts peak at different lengths, e.g. tiny-llama4's chunked and
    full layers, the summed peaks are an upper bound, so the promise may be shorter.)"""
    spec = ModelSpec.from_hf_config(tiny_hf_config(name), dtype="fp32")
    mgr = make_manager("jenga", spec, 1 << 20)
    cap = max_context_tokens(mgr)
    assert cap is not None and cap + 3 < spec.max_model_len
    assert run_alone(mgr, cap + 2)[0].finish_reason == "length"
    with pytest.raises(jenga.errors.InsufficientMemoryError):
        run_alone(mgr, cap + 3)


def test_chunked_peak_is_inside_a_chunk():
    """tiny-llama4's chunked layers (chunk 32, pages of 16): at a length just past a chunk start
    the group holds one page, but 16 tokens earlier it held two; the peak counts the two."""
    spec = ModelSpec.from_hf_config(tiny_hf_config("tiny-llama4"))
    mgr = make_manager("jenga", spec, 1 << 20)
    assert pages_for_context(mgr, 1903)[0] == 1 and pages_for_context(mgr, 1887)[0] == 2
    assert peak_pages(mgr, 1903)[0] == 2


def test_a_sliding_prefill_is_chunked_to_fit():
    """tiny-gemma3 at 1 MiB: a 2048-token first chunk does not fit beside the window, so the
    scheduler runs the prompt in shorter chunks (no error, no preemption)."""
    spec = ModelSpec.from_hf_config(tiny_hf_config("tiny-gemma3"), dtype="fp32")
    mgr = make_manager("jenga", spec, 1 << 20)
    total = max_context_tokens(mgr)
    seq, sched = run_alone(mgr, total)
    assert sched.stats.preemptions == 0 and sched.stats.steps > OUT + 1  # the prompt took several steps
    assert seq.num_tokens == total


def test_server_completes_the_longest_admitted_request():
    """Through the server (and so the engine with its model): the longest request its length
    check admits completes; one token more gets the 400."""
    tight_llm = jenga.LLM("tiny-gemma3", random_weights=True, kv_memory="1MiB")
    with BackgroundServer(create_app(tight_llm, model_name="tiny", max_waiting=4)) as srv:
        longest = httpx.get(srv.url + "/v1/models").json()["data"][0]["max_model_len"]
        assert longest == max_context_tokens(tight_llm.manager) < 4096  # the KV cache is the limit
        body = {"model": "tiny", "prompt": [5] * (longest - OUT), "max_tokens": OUT, "ignore_eos": True}
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == OUT
        body["max_tokens"] = OUT + 1
        r = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
