"""Text prompts with raw images through the model directory's HF processor, vs HF transformers.

Each family gets a tiny local directory: the tiny model's random weights saved by HF's
``save_pretrained``, a byte-level tokenizer with the family's special tokens at the config's ids
and the family's processor (``Gemma3Processor`` with 32x32 images and 16 tokens per image;
``MllamaProcessor`` with 32x32 tiles, at most 2 -- aspect ratios 1x1, 1x2, 2x1 as the tiny config).
``LLM(dir).generate({"prompt": text, "multi_modal_data": {"image": PIL / numpy / tensor}})`` must
equal HF ``generate`` on the processor's outputs for the same text and images (greedy fp32, tokens
identical, logits to 1e-4) and the engine's own id + tensor path.  Gemma-3: HF runs without the
processor's ``token_type_ids`` (the engine's causal attention over image tokens, vLLM's convention).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from PIL import Image
from tokenizers import Tokenizer

import jenga
from jenga import SamplingParams
from jenga.engine.models.weights import TINY_BOI, TINY_MLLAMA_IMAGE
from jenga.engine.tokenizer import tiny_tokenizer
from jenga.errors import InvalidArgumentError

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:`hidden_state` is deprecated:FutureWarning")
P = SamplingParams(max_tokens=5, return_logits=True)


def tokenizer(first_special: int, specials: list[str], **named):
    """The tiny byte-level BPE, padded with unused tokens so ``specials`` start at ``first_special``."""
    tok = Tokenizer.from_str(tiny_tokenizer(first_special).backend.to_str())  # a copy: the trained one is cached
    tok.add_special_tokens([f"<unused{i}>" for i in range(first_special - tok.get_vocab_size())] + specials)
    assert tok.token_to_id(specials[0]) == first_special
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                      **named)


def save_dir(path, tiny_name, hf_cls, processor=None):
    tiny = jenga.LLM(tiny_name, kv_memory="4MiB")
    hf = hf_cls(tiny.config).eval()
    hf.load_state_dict(tiny.model.state_dict(), strict=True)
    hf.save_pretrained(path)
    if processor is not None:
        processor.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = tokenizer(TINY_BOI, ["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
                    extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                                          "image_token": "<image_soft_token>"})
    proc = tf.Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
                              tokenizer=tok, image_seq_length=16)
    path = tmp_path_factory.mktemp("gemma3")
    hf = save_dir(path, "tiny-gemma3-vision", tf.Gemma3ForConditionalGeneration, proc)
    return path, hf, tf.AutoProcessor.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def mllama(tmp_path_factory):
    from transformers.models.mllama.image_processing_pil_mllama import MllamaImageProcessorPil

    proc = tf.MllamaProcessor(image_processor=MllamaImageProcessorPil(size={"height": 32, "width": 32},
                                                                      max_image_tiles=2),
                              tokenizer=tokenizer(TINY_MLLAMA_IMAGE, ["<|image|>"]))
    path = tmp_path_factory.mktemp("mllama")
    hf = save_dir(path, "tiny-mllama", tf.MllamaForConditionalGeneration, proc)
    return path, hf, tf.AutoProcessor.from_pretrained(path, local_files_only=True)


def pil(h, w, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def hf_generate(hf, inputs):
    with torch.no_grad():
        return hf.generate(**inputs, max_new_tokens=P.max_tokens, do_sample=False, pad_token_id=0,
                           output_logits=True, return_dict_in_generate=True)


def assert_equal(out, ref, n_prompt):
    assert out.token_ids == ref.sequences[0, n_prompt:].tolist()
    for got, want in zip(out.logits, ref.logits, strict=True):
        torch.testing.assert_close(got, want[0].float(), atol=1e-4, rtol=1e-4)


def test_gemma3_text_and_images_equal_hf_and_the_id_path(gemma3):
    path, hf, proc = gemma3
    llm = jenga.LLM(path, kv_memory="8MiB")
    arr = np.asarray(pil(32, 32, 2))
    cases = [("Describe <start_of_image> this picture, and <start_of_image> that one.", [pil(40, 50, 1), arr]),
             ("The numbers <start_of_image> one two", torch.from_numpy(np.array(pil(24, 36, 3))).permute(2, 0, 1))]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": imgs}} for t, imgs in cases], P)
    for (text, imgs), out in zip(cases, outs, strict=True):
        inputs = proc(text=text, images=[imgs if isinstance(imgs, list) else [imgs]], return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        assert ids.count(TINY_BOI) == (2 if isinstance(imgs, list) else 1) and out.prompt_token_ids == ids
        inputs.pop("token_type_ids")  # the engine's causal image attention (module docstring)
        assert_equal(out, hf_generate(hf, inputs), len(ids))
        mine = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": list(inputs["pixel_values"])}}, P)
        assert mine[0].token_ids == out.token_ids
    # token ids + raw images: the processor's image part; another image changes the logits
    ids = outs[0].prompt_token_ids
    raw = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": cases[0][1]}}, P)[0]
    assert raw.token_ids == outs[0].token_ids
    other = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": [pil(40, 50, 9), arr]}}, P)[0]
    assert (other.logits[0] - outs[0].logits[0]).abs().max() > 1e-3


def test_mllama_text_and_images_equal_hf_and_the_id_path(mllama):
    path, hf, proc = mllama
    llm = jenga.LLM(path, kv_memory="8MiB")
    cases = [("<|image|>Describe this picture", [pil(30, 60, 4)]),  # 1x2 tiles
             ("The numbers <|image|> one <|image|> two", [pil(64, 30, 5), np.asarray(pil(32, 32, 6))])]
    outs = llm.generate([{"prompt": t, "multi_modal_data": {"image": imgs}} for t, imgs in cases], P)
    for (text, imgs), out in zip(cases, outs, strict=True):
        inputs = proc(text=text, images=[imgs], return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        assert ids.count(TINY_MLLAMA_IMAGE) == len(imgs) and out.prompt_token_ids == ids
        assert_equal(out, hf_generate(hf, inputs), len(ids))
        data = {k: inputs[k] for k in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}
        mine = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": data}}, P)
        assert mine[0].token_ids == out.token_ids
    assert inputs["aspect_ratio_ids"][0].tolist() == [3, 1]  # 2x1 tiles, 1x1: the tiny config's ratios
    ids = outs[1].prompt_token_ids
    raw = llm.generate({"prompt_token_ids": ids, "multi_modal_data": {"image": cases[1][1]}}, P)[0]
    assert raw.token_ids == outs[1].token_ids


def nothing_queued(llm):
    assert not llm.scheduler.has_unfinished and llm.manager.stats().used_bytes == 0


def test_text_with_images_needs_a_processor(gemma3, tmp_path):
    img = {"image": pil(32, 32, 0)}
    tiny = jenga.LLM("tiny-gemma3-vision", kv_memory="4MiB")
    with pytest.raises(InvalidArgumentError, match="tiny model has no HF processor"):
        tiny.generate({"prompt": "a <start_of_image> b", "multi_modal_data": img}, P)
    with pytest.raises(InvalidArgumentError, match="tiny model has no HF processor"):
        tiny.generate({"prompt_token_ids": [5, 6], "multi_modal_data": img}, P)
    nothing_queued(tiny)
    path, hf, proc = gemma3
    hf.save_pretrained(tmp_path)
    proc.tokenizer.save_pretrained(tmp_path)  # tokenizer files but no processor
    bare = jenga.LLM(tmp_path, kv_memory="4MiB")
    with pytest.raises(InvalidArgumentError, match="processor_config.json / preprocessor_config.json"):
        bare.generate({"prompt": "a <start_of_image> b", "multi_modal_data": img}, P)
    nothing_queued(bare)
    with pytest.raises(InvalidArgumentError, match="takes no images"):
        jenga.LLM("tiny-llama", kv_memory="4MiB").generate({"prompt": "a", "multi_modal_data": img}, P)


def test_bad_text_image_prompts_raise_before_queueing(gemma3, mllama):
    for path, marker in ((gemma3[0], "<start_of_image>"), (mllama[0], "<|image|>")):
        llm = jenga.LLM(path, kv_memory="8MiB")
        bad = [({"prompt": f"a {marker} b {marker}", "multi_modal_data": {"image": pil(32, 32, 0)}}, "rejected"),
               ({"prompt": "no marker", "multi_modal_data": {"image": [pil(32, 32, 0)]}}, "rejected"),
               ({"prompt": f"a {marker}", "multi_modal_data": {"image": ["x.png"]}}, "PIL images"),
               ({"prompt": 7, "multi_modal_data": {"image": pil(32, 32, 0)}}, "prompt must be text"),
               ({"prompt": f"a {marker}", "multi_modal_data": {"video": pil(32, 32, 0)}}, "needs 'image'")]
        for prompt, msg in bad:
            with pytest.raises(InvalidArgumentError, match=msg):
                llm.add_request(prompt, P)
        nothing_queued(llm)
