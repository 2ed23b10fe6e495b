"""Qwen2 (biased q/k/v, sliding layers from ``max_window_layers`` on), Qwen3 (per-head q/k norms)
and Qwen3-MoE (top-k experts every other layer) on jenga pages vs transformers (same fp32 weights).

Greedy tokens equal HF ``generate`` and every generated token's logits agree to 1e-4 under
chunked prefill, a prefix-cache hit, and a budget so small that requests are preempted and cached
pages evicted (both asserted).
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams

#: tiny model -> a KV budget where about two of the preemption test's requests fit
QWEN = {"tiny-qwen2": "700KiB", "tiny-qwen3": "400KiB", "tiny-qwen3-moe": "400KiB"}
GREEDY = SamplingParams(max_tokens=5, return_logits=True)
_HF: dict = {}
torch.set_num_threads(1)


def hf_model(llm):
    key = llm.config.model_type
    if key not in _HF:
        hf = tf.AutoModelForCausalLM.from_config(llm.config).eval()
        hf.load_state_dict(llm.model.state_dict())
        _HF[key] = hf
    return _HF[key]


def prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in lengths]


def assert_hf_equal(llm, outs):
    hf = hf_model(llm)
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(out.token_ids),
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert out.token_ids == res.sequences[0, ids.shape[1]:].tolist(), f"request {out.request_id}: tokens differ"
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)


def test_layer_kinds():
    kinds = {name: [a.kind for a in jenga.LLM(name, kv_memory="4MiB").model.layer_attention()] for name in QWEN}
    assert kinds == {"tiny-qwen2": ["full", "sliding", "sliding"], "tiny-qwen3": ["full", "full"],
                     "tiny-qwen3-moe": ["full"] * 4}


@pytest.mark.parametrize("name", QWEN)
def test_chunked_batch_and_prefix_hit_match_hf(name):
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=29)
    batch = llm.generate(prompts([75, 41, 20]), GREEDY)
    assert llm.scheduler.stats.steps >= 5 + 4  # the batch's 136 prompt tokens took 5 chunks of <= 29
    shared, a, b = prompts([100, 9, 13], seed=1)
    first = llm.generate([shared + a], GREEDY)
    second = llm.generate([shared + b], GREEDY)
    assert first[0].prefix_hit_tokens == 0 and second[0].prefix_hit_tokens == 96
    assert_hf_equal(llm, batch + first + second)


@pytest.mark.parametrize("name", QWEN)
def test_preemption_and_eviction_match_hf(name):
    llm = jenga.LLM(name, kv_memory=QWEN[name], max_num_batched_tokens=128)
    params = SamplingParams(max_tokens=30, return_logits=True, ignore_eos=True)
    outs = llm.generate(prompts([120, 90, 110, 70, 100, 80], seed=3), params)
    assert llm.scheduler.stats.preemptions > 0, "budget should force preemption"
    assert llm.manager.stats().evicted_pages > 0, "budget should force prefix-cache eviction"
    hf = hf_model(llm)
    for out in outs:  # ignore_eos: compare against HF's forward on the full sequence
        seq = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            ref = hf(seq).logits[0, len(out.prompt_token_ids) - 1:-1]
        assert out.token_ids == ref.argmax(-1).tolist()
        torch.testing.assert_close(torch.stack(out.logits), ref, atol=1e-4, rtol=1e-4)
