"""``jenga.LLM`` end to end vs Hugging Face transformers' own ``generate`` (same fp32 weights).

Greedy tokens must be identical and every generated token's logits must agree to 1e-4, for
each family (Llama, Mistral with every-layer sliding window, Gemma-2, Gemma-3, Llama-4),
under chunked prefill, prefix-cache hits, eviction and preemption, with the ``jenga`` and
the ``paged`` managers.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams
from jenga.errors import InsufficientMemoryError, InvalidArgumentError

HF_CLASSES = {"tiny-llama": tf.LlamaForCausalLM, "tiny-mistral": tf.MistralForCausalLM,
              "tiny-gemma2": tf.Gemma2ForCausalLM, "tiny-gemma3": tf.Gemma3ForCausalLM,
              "tiny-llama4": tf.Llama4ForCausalLM}
_HF_CACHE: dict = {}
torch.set_num_threads(1)  # tiny models: threads only add contention under pytest -n 2


def hf_twin(llm):
    """HF's model with the engine's weights (cached per config)."""
    key = (llm.config.model_type, llm.config.num_hidden_layers, getattr(llm.config, "sliding_window", None))
    if key not in _HF_CACHE:
        cls = next(c for name, c in HF_CLASSES.items() if llm.config.model_type in c.config_class.model_type
                   or c.config_class.model_type == llm.config.model_type)
        hf = cls(llm.config).eval()
        hf.load_state_dict(llm.model.state_dict())
        _HF_CACHE[key] = hf
    return _HF_CACHE[key]


def rand_prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in lengths]


def check_against_hf(llm, outs, max_tokens):
    hf = hf_twin(llm)
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        want = res.sequences[0, ids.shape[1]:].tolist()
        assert out.token_ids == want, f"request {out.request_id}: greedy tokens differ from HF generate"
        assert len(out.logits) == len(want)
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)


GREEDY = SamplingParams(max_tokens=6, return_logits=True)


@pytest.mark.parametrize("name", list(HF_CLASSES))
def test_greedy_matches_hf_with_chunked_prefill(name):
    llm = jenga.LLM(name, kv_memory="8MiB", max_num_batched_tokens=29)
    outs = llm.generate(rand_prompts([75, 41, 20]), GREEDY)
    assert llm.scheduler.stats.steps > 3 + 5  # prefill was chunked
    check_against_hf(llm, outs, 6)


@pytest.mark.parametrize("manager", ["jenga", "paged"])
def test_prefix_hit_matches_hf(manager):
    llm = jenga.LLM("tiny-gemma3", manager=manager, kv_memory="8MiB", max_num_batched_tokens=64)
    shared = rand_prompts([150], seed=1)[0]
    a, b = rand_prompts([17, 9], seed=2)
    first = llm.generate([shared + a], GREEDY)
    second = llm.generate([shared + b], GREEDY)
    assert first[0].prefix_hit_tokens == 0
    assert second[0].prefix_hit_tokens >= 144, "the shared 150-token prefix should be reused"
    assert llm.manager.stats().prefix_hit_tokens >= 144
    check_against_hf(llm, first + second, 6)


@pytest.mark.parametrize("manager", ["jenga", "paged"])
def test_eviction_and_preemption_match_hf(manager):
    # about two requests fit at a time; decode growth (full layer) forces preemption
    memory = {"jenga": "1152KiB", "paged": "1536KiB"}[manager]
    llm = jenga.LLM("tiny-gemma3", manager=manager, kv_memory=memory, max_num_batched_tokens=128)
    params = SamplingParams(max_tokens=40, return_logits=True, ignore_eos=True)
    outs = llm.generate(rand_prompts([120, 90, 110, 70, 100, 80], seed=3), params)
    assert llm.scheduler.stats.preemptions > 0, "budget should force preemption"
    assert llm.manager.stats().evicted_pages > 0, "budget should force prefix-cache eviction"
    assert any(o.num_preemptions for o in outs)
    hf = hf_twin(llm)
    for out in outs:  # ignore_eos: compare against HF's forward on the full sequence
        seq = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            ref = hf(seq).logits[0, len(out.prompt_token_ids) - 1:-1]
        assert out.token_ids == ref.argmax(-1).tolist()
        torch.testing.assert_close(torch.stack(out.logits), ref, atol=1e-4, rtol=1e-4)


def test_sampling_seeded_and_stop():
    llm = jenga.LLM("tiny-llama", kv_memory="4MiB")
    p = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    alone = llm.generate("The quick brown fox", p)[0]
    batched = llm.generate(["The quick brown fox", "Pack my box", [5, 6, 7]], p)[0]
    assert alone.token_ids == batched.token_ids and len(alone.token_ids) == 12
    assert alone.text == llm.tokenizer.decode(alone.token_ids)
    stop = llm.tokenizer.decode(alone.token_ids[3:5])
    if stop:
        cut = llm.generate("The quick brown fox", SamplingParams(**{**p.__dict__, "stop": (stop,)}))[0]
        assert cut.finish_reason == "stop" and cut.stop_reason == stop and stop not in cut.text


def test_errors():
    with pytest.raises(InvalidArgumentError, match="tiny-gemma3"):
        jenga.LLM("no-such-model")
    with pytest.raises(InvalidArgumentError):
        SamplingParams(max_tokens=0)
    llm = jenga.LLM("tiny-llama", kv_memory="4MiB")
    with pytest.raises(InvalidArgumentError):
        llm.generate([[1, 2, 100000]])
    with pytest.raises(InsufficientMemoryError):
        jenga.LLM("tiny-llama", kv_memory="300KiB").generate([[5] * 600], SamplingParams(max_tokens=2))


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, jenga; assert 'torch' not in sys.modules; jenga.SamplingParams; print('ok')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


def test_local_hf_directory(tmp_path):
    """A saved HF checkpoint + tokenizer.json serves exactly like the in-memory tiny model."""
    ref = jenga.LLM("tiny-llama", kv_memory="4MiB")
    hf_twin(ref).save_pretrained(tmp_path)
    ref.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    llm = jenga.LLM(tmp_path, kv_memory="4MiB")
    p = SamplingParams(max_tokens=5)
    assert llm.generate("Once upon a time", p)[0].token_ids == ref.generate("Once upon a time", p)[0].token_ids
