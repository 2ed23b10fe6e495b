"""Llama-3.2-Vision (``MllamaForConditionalGeneration``) on jenga pages vs HF transformers.

Same random fp32 weights (``tiny-mllama``: tanh gates ~1, so images change the text); HF runs
``generate(input_ids, pixel_values, aspect_ratio_ids, aspect_ratio_mask, cross_attention_mask)``
with the mask its processor writes (``get_cross_attention_token_mask`` +
``convert_sparse_cross_attention_mask_to_dense``), one prompt at a time.  Greedy tokens must be
identical and every generated token's logits agree to 1e-4.  The cross-attention K/V live in the
manager's cross pages: the encoder runs once per image, every later step reads the pages.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.models.mllama.processing_mllama import (
    convert_sparse_cross_attention_mask_to_dense,
    get_cross_attention_token_mask,
)

import jenga
from jenga import SamplingParams
from jenga.engine.mllama_images import dense_mask, image_ranges
from jenga.engine.models.weights import TINY_MLLAMA_IMAGE as IMG
from jenga.errors import InvalidArgumentError

torch.set_num_threads(1)
# transformers' own MllamaVisionEncoder calls its layers with a deprecated keyword (HF's warning, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:`hidden_state` is deprecated:FutureWarning")
P = SamplingParams(max_tokens=5, return_logits=True)
TILES = {1: 1, 2: 2, 3: 2}  # aspect-ratio id -> real tiles (1x1, 1x2, 2x1)
_HF: dict = {}


def hf_twin(llm):
    if "hf" not in _HF:
        hf = tf.MllamaForConditionalGeneration(llm.config).eval()
        hf.load_state_dict(llm.model.state_dict(), strict=True)
        _HF["hf"] = hf
    return _HF["hf"]


def image_inputs(ratio_ids, seed=0):
    """Processor-shaped inputs for images of the given aspect-ratio ids (padding tiles zero)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(ratio_ids)
    pv = torch.randn(1, n, 2, 3, 32, 32, generator=gen)
    mask = torch.zeros(1, n, 2, dtype=torch.long)
    for j, a in enumerate(ratio_ids):
        pv[0, j, TILES[a]:] = 0
        mask[0, j, :TILES[a]] = 1
    return {"pixel_values": pv, "aspect_ratio_ids": torch.tensor([ratio_ids]), "aspect_ratio_mask": mask}


def prompt(text_lens, ratio_ids, seed=0, img_seed=None):
    """Text runs with one ``<|image|>`` token between consecutive runs."""
    gen = torch.Generator().manual_seed(seed)
    ids = []
    for i, n in enumerate(text_lens):
        ids += torch.randint(3, 500, (n,), generator=gen).tolist()
        if i < len(ratio_ids):
            ids.append(IMG)
    if not ratio_ids:
        return {"prompt_token_ids": ids}
    data = image_inputs(ratio_ids, seed if img_seed is None else img_seed)
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": data}}


def hf_generate(llm, p, max_tokens):
    ids = p["prompt_token_ids"]
    x = torch.tensor([ids])
    kw = {}
    if "multi_modal_data" in p:
        img = p["multi_modal_data"]["image"]
        tiles = [[TILES[a] for a in img["aspect_ratio_ids"][0].tolist()]]
        cam = convert_sparse_cross_attention_mask_to_dense([get_cross_attention_token_mask(ids, IMG)], tiles, 2,
                                                           len(ids))
        kw = dict(img, cross_attention_mask=torch.tensor(cam))
    with torch.no_grad():
        return hf_twin(llm).generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=0, output_logits=True,
                                     return_dict_in_generate=True, **kw)


def check(llm, prompts, outs, max_tokens=5):
    for p, out in zip(prompts, outs, strict=True):
        res = hf_generate(llm, p, max_tokens)
        assert out.token_ids == res.sequences[0, len(p["prompt_token_ids"]):].tolist()
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)


def no_leak(llm):
    llm.manager.check_integrity()
    assert llm.manager.stats().used_bytes == 0


def test_one_image_matches_hf_and_encodes_once():
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB")
    assert [(g.kind, g.layers) for g in llm.manager.model.groups] == [("full", (0, 2)), ("cross", (1, 3))]
    p = prompt([5, 12], [2])
    outs = llm.generate(p, P)
    assert llm.metrics.encoder_runs == 1  # prefill + 4 decode steps read the cross pages
    check(llm, [p], outs)
    other = {**p, "multi_modal_data": {"image": image_inputs([2], seed=99)}}
    assert llm.generate(other, P)[0].logits[0].sub(outs[0].logits[0]).abs().max() > 1e-2  # the image matters
    no_leak(llm)


def test_chunked_prefill_matches_hf():
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB", max_num_batched_tokens=4)
    p = prompt([6, 3, 9], [1, 3], seed=1)  # two images, one with a padding tile; 20 tokens in 4-token chunks
    outs = llm.generate(p, P)
    assert llm.scheduler.stats.steps >= 5 + 4
    assert llm.metrics.encoder_runs == 2
    check(llm, [p], outs)
    no_leak(llm)


def test_batched_requests_with_and_without_images_match_hf():
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB", max_num_batched_tokens=64)
    ps = [prompt([3, 9], [1], seed=2), prompt([0, 14], [3], seed=3), prompt([11], [], seed=4),
          prompt([4, 0, 6], [2, 1], seed=5)]  # image first; text only; two consecutive image tokens
    outs = llm.generate(ps, P)
    assert llm.scheduler.stats.steps == 5  # one prefill step for all four, then decodes together
    assert llm.metrics.encoder_runs == 4
    check(llm, ps, outs)
    no_leak(llm)


def test_forced_preemption_matches_hf_and_leaks_nothing():
    llm = jenga.LLM("tiny-mllama", kv_memory=448 << 10, max_num_batched_tokens=32)
    ps = [prompt([20, 10], [1 + i % 3], seed=10 + i) for i in range(4)]
    outs = llm.generate(ps, SamplingParams(max_tokens=20, return_logits=True))
    assert llm.scheduler.stats.preemptions > 0
    check(llm, ps, outs, max_tokens=20)
    no_leak(llm)


def test_same_image_reuses_cached_cross_kv_under_the_same_salt():
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB")
    a = prompt([6, 5], [2], seed=20, img_seed=7)
    b = prompt([9, 3], [2], seed=21, img_seed=7)  # other text, same image
    outs = llm.generate(a, P) + llm.generate(b, P)
    assert outs[1].prefix_hit_tokens == 0
    assert llm.metrics.encoder_runs == 1  # the second request read the cached cross pages
    check(llm, [a, b], outs)
    llm.generate({**b, "cache_salt": "tenant-2"}, P)
    assert llm.metrics.encoder_runs == 2  # another salt never reads them
    # a full page of text before the image: the same text with the same image hits it, with
    # another image it must not (HF's rows before the image attend to every image)
    d = prompt([20, 4], [2], seed=22, img_seed=7)
    assert llm.generate(d, P)[0].prefix_hit_tokens == 0
    assert llm.generate(d, P)[0].prefix_hit_tokens == 16
    c = {**d, "multi_modal_data": {"image": image_inputs([2], seed=8)}}
    out_c = llm.generate(c, P)
    assert out_c[0].prefix_hit_tokens == 0
    check(llm, [c], out_c)
    no_leak(llm)


@pytest.mark.parametrize("ids", [[IMG, 5, 6], [5, 6, IMG, 7, IMG, 8, 9], [5, IMG, IMG, 6, 7, IMG, 8],
                                 [IMG, IMG, 5], [5, 6, 7, IMG]])
def test_cross_attention_mask_equals_hf_processor(ids):
    ranges = image_ranges(ids, IMG)
    tiles = [1 + j % 2 for j in range(len(ranges))]
    ref = convert_sparse_cross_attention_mask_to_dense([get_cross_attention_token_mask(ids, IMG)], [tiles], 2,
                                                       len(ids))
    assert torch.equal(dense_mask(ranges, tiles, 2, len(ids)), torch.tensor(ref[0]))


def test_bad_image_inputs_raise_before_queueing():
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB")
    p = prompt([4, 4], [2])
    img = p["multi_modal_data"]["image"]

    def bad(match, **change):
        with pytest.raises(InvalidArgumentError, match=match):
            llm.add_request({**p, "multi_modal_data": {"image": {**img, **change}}})

    with pytest.raises(InvalidArgumentError, match="1 images but 0 image tokens"):
        llm.add_request({"prompt_token_ids": [5, 6, 7], "multi_modal_data": p["multi_modal_data"]})
    with pytest.raises(InvalidArgumentError, match="mapping"):
        llm.add_request({**p, "multi_modal_data": {"image": img["pixel_values"]}})
    bad("pixel_values", pixel_values=torch.zeros(1, 1, 2, 3, 16, 16))
    bad("aspect_ratio_id 4", aspect_ratio_ids=torch.tensor([[4]]))
    bad("does not mark", aspect_ratio_mask=torch.tensor([[[1, 0]]]))
    bad("unknown image inputs", pixel_mask=torch.ones(1))
    bad("must be a torch tensor", aspect_ratio_ids=[2])
    bad("custom masks", cross_attention_mask=torch.ones(1, 9, 1, 2, dtype=torch.long))
    assert not llm.scheduler.has_unfinished
    no_leak(llm)
    with pytest.raises(InvalidArgumentError, match="token ids must be in"):
        llm.add_request([5, IMG + 8])


@pytest.mark.parametrize("manager", ["paged", "uniform", "static"])
def test_baseline_managers_match_hf(manager):
    # paged: one text group and one image group over every layer (vLLM v0); only the right slots are used
    llm = jenga.LLM("tiny-mllama", kv_memory="8MiB", manager=manager)
    p = prompt([5, 7], [3], seed=30)
    outs = llm.generate(p, P)
    assert llm.metrics.encoder_runs == 1
    check(llm, [p], outs)
    no_leak(llm)


def test_directory_with_pre_v5_parameter_names_loads(tmp_path):
    from safetensors.torch import save_file

    tiny = jenga.LLM("tiny-mllama", kv_memory="8MiB")
    old = {}
    for name, t in tiny.model.state_dict().items():  # the Hub's Llama-3.2-Vision names (transformers 4.x)
        for new, was in (("model.language_model.", "language_model.model."), ("model.vision_model.", "vision_model."),
                         ("model.multi_modal_projector.", "multi_modal_projector."), ("lm_head.", "language_model.lm_head.")):
            if name.startswith(new):
                name = was + name[len(new):]
        old[name] = t.contiguous().clone()
    save_file(old, str(tmp_path / "model.safetensors"))
    tiny.config.save_pretrained(tmp_path)
    llm = jenga.LLM(tmp_path, kv_memory="8MiB")
    p = prompt([5, 7], [2], seed=31)
    assert llm.generate(p, P)[0].token_ids == tiny.generate(p, P)[0].token_ids
