"""Gemma-3 with images (``Gemma3ForConditionalGeneration``) on jenga pages vs HF transformers.

Same random fp32 weights; HF runs ``generate(input_ids, pixel_values=...)`` (no
``token_type_ids``: vLLM's prompt convention, causal attention over image tokens).  Greedy
tokens must be identical and every generated token's logits agree to 1e-4.  The vision
embeddings live in the manager's vision pages: the encoder runs once per image even when the
image's tokens are split across prefill chunks, a second request showing a cached image runs
no encoder, and an evicted image is encoded again.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams
from jenga.engine.models.weights import TINY_BOI, TINY_EOI, TINY_IMAGE
from jenga.errors import InvalidArgumentError

torch.set_num_threads(1)
N_IMG = 16  # tiny model's mm_tokens_per_image
P = SamplingParams(max_tokens=5, return_logits=True)
_HF: dict = {}


def hf_twin(llm):
    if "hf" not in _HF:
        hf = tf.Gemma3ForConditionalGeneration(llm.config).eval()
        hf.load_state_dict(llm.model.state_dict(), strict=True)
        _HF["hf"] = hf
    return _HF["hf"]


def images(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 32, 32, generator=gen) for _ in range(n)]


def prompt(text_lens, imgs, seed=0):
    """Text runs with one ``boi, 16 x image, eoi`` block between consecutive runs."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for i, n in enumerate(text_lens):
        ids += torch.randint(3, 500, (n,), generator=gen).tolist()
        if i < len(imgs):
            ids += [TINY_BOI] + [TINY_IMAGE] * N_IMG + [TINY_EOI]
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": list(imgs)}}


def check(llm, prompts, outs, max_tokens=5):
    hf = hf_twin(llm)
    for p, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([p["prompt_token_ids"]])
        with torch.no_grad():
            res = hf.generate(ids, pixel_values=torch.stack(p["multi_modal_data"]["image"]),
                              attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert out.token_ids == res.sequences[0, ids.shape[1]:].tolist()
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)


def test_image_split_across_chunks_encodes_once():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=7)
    assert [g.kind for g in llm.manager.model.groups] == ["sliding", "full", "vision"]
    p = prompt([5, 12], images(1))
    outs = llm.generate(p, P)
    assert llm.scheduler.stats.steps >= 5 + 4  # 35 prompt tokens in 7-token chunks: the image spans 3-4 chunks
    assert llm.metrics.encoder_runs == 1
    check(llm, [p], outs)


def test_two_images_per_prompt_and_batched_requests():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=40)
    a, b, c = images(3, seed=1)
    ps = [prompt([3, 9, 4], [a, b], seed=2), prompt([20, 6], [c], seed=3)]
    outs = llm.generate(ps, P)
    assert llm.metrics.encoder_runs == 3
    check(llm, ps, outs)


def test_shared_image_reuses_cached_embeddings():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=64)
    (img,) = images(1, seed=4)
    first = prompt([6, 5], [img], seed=5)
    second = prompt([9, 3], [img], seed=6)  # other text around the same image: no text prefix hit
    outs = llm.generate(first, P) + llm.generate(second, P)
    assert outs[1].prefix_hit_tokens == 0
    assert llm.metrics.encoder_runs == 1  # the second request read the cached embedding pages
    both = llm.generate([prompt([4, 2], [img], seed=7), prompt([8, 1], [img], seed=8)], P)
    assert llm.metrics.encoder_runs == 1  # still cached; two requests in one step share it too
    check(llm, [first, second], outs)
    check(llm, [prompt([4, 2], [img], seed=7), prompt([8, 1], [img], seed=8)], both)


def test_shared_image_in_one_step_encodes_once():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=128)
    (img,) = images(1, seed=9)
    ps = [prompt([4, 2], [img], seed=10), prompt([8, 1], [img], seed=11)]
    outs = llm.generate(ps, P)
    assert llm.metrics.encoder_runs == 1
    check(llm, ps, outs)


def test_evicted_image_is_encoded_again():
    # ~0.56 MiB of pages: the filler requests' KV pushes the cached image pages out
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory=640 << 10, max_num_batched_tokens=64)
    (img,) = images(1, seed=12)
    first = prompt([6, 5], [img], seed=13)
    outs = llm.generate(first, P)
    assert llm.metrics.encoder_runs == 1
    gen = torch.Generator().manual_seed(14)
    fillers = [torch.randint(3, 500, (60,), generator=gen).tolist() for _ in range(4)]
    llm.generate(fillers, SamplingParams(max_tokens=4))
    again = prompt([7, 4], [img], seed=15)
    outs += llm.generate(again, P)
    assert llm.metrics.encoder_runs == 2  # the image's pages were evicted, so it ran again
    check(llm, [first, again], outs)


def test_without_embedding_cache_reruns_encoder_per_chunk():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=7, mm_embedding_cache=False)
    assert "vision" not in [g.kind for g in llm.manager.model.groups]
    p = prompt([5, 12], images(1))
    outs = llm.generate(p, P)
    assert llm.metrics.encoder_runs == 4  # image tokens 6..21 touch chunks [0,7) [7,14) [14,21) [21,28)
    check(llm, [p], outs)


def test_preemption_with_images_matches_hf():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory=1100 << 10, max_num_batched_tokens=32)
    ps = [prompt([30, 20], images(1, seed=20 + i), seed=30 + i) for i in range(4)]
    outs = llm.generate(ps, SamplingParams(max_tokens=24, return_logits=True))
    assert llm.scheduler.stats.preemptions > 0
    check(llm, ps, outs, max_tokens=24)


def test_bad_image_inputs_raise_before_queueing():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB")
    p = prompt([4, 4], images(1))
    with pytest.raises(InvalidArgumentError, match="1 images but 0 runs"):
        llm.add_request({"prompt_token_ids": [5, 6, 7], "multi_modal_data": p["multi_modal_data"]})
    with pytest.raises(InvalidArgumentError, match="shape"):
        llm.add_request({**p, "multi_modal_data": {"image": torch.zeros(3, 8, 8)}})
    with pytest.raises(InvalidArgumentError, match="video"):
        llm.add_request({**p, "multi_modal_data": {"video": []}})
    assert not llm.scheduler.has_unfinished
    text = jenga.LLM("tiny-gemma3", kv_memory="8MiB")
    with pytest.raises(InvalidArgumentError, match="no vision tower"):
        text.add_request(p)


def test_image_pages_are_kept_apart_by_cache_salt():
    llm = jenga.LLM("tiny-gemma3-vision", kv_memory="8MiB", max_num_batched_tokens=64)
    (img,) = images(1, seed=16)
    a, b = prompt([6, 5], [img], seed=17), prompt([9, 3], [img], seed=18)
    llm.generate({**a, "cache_salt": "tenant-1"}, P)
    llm.generate({**b, "cache_salt": "tenant-2"}, P)
    assert llm.metrics.encoder_runs == 2  # another salt never reads tenant-1's embedding pages
    llm.generate({**b, "cache_salt": "tenant-1"}, P)
    assert llm.metrics.encoder_runs == 2  # the same salt does
