"""Gemma-3 with images inside vLLM with jenga's scheduler: a tiny ``Gemma3ForConditionalGeneration``
(SigLIP tower, 16 tokens per picture; text model with 3 sliding-window layers of 48 tokens : 1
full) written with transformers' ``save_pretrained``, its ``Gemma3Processor`` and a word-level
tokenizer saved next to it.

Greedy tokens equal stock vLLM's with ample memory and with a tight budget (preemption, eviction);
per-request prefix hits (``num_cached_tokens``): the same picture and text hit, the same text after
another picture does not, the text before another picture hits up to the picture.  jenga keys its
pages by vLLM's ``request.block_hashes``, which carry the pictures' hashes.

vLLM 0.32's ``gemma3_mm`` imports transformers' torchvision image processor, and torchvision
cannot be installed here; ``gemma3_site/`` (on ``sys.path`` here and on ``PYTHONPATH`` for
vLLM's subprocesses) answers that import with transformers' PIL processor of the same name, and
both engines run with it.  The checkpoint's SigLIP weights are renamed to the published Gemma-3
layout (``vision_tower.vision_model.*``), which vLLM 0.32 loads; transformers 5.19 writes them
without ``vision_model.`` and reads both (checked on the reloaded weights)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from vllm_images import pictures, print_figures, run_phases, words
from vllm_support import check_pages_reclaimed, check_pressure_effects, close, engine, randomized, scheduler

SITE = str(Path(__file__).parent / "gemma3_site")
sys.path.insert(0, SITE)
import gemma3_image_shim  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm-gemma3-images")

SPECIAL = ["<pad>", "<bos>", "<eos>"]
NEWLINES = ["\n" * k for k in range(1, 5)]  # vLLM's Gemma-3 merges "\n" runs around a picture into these
IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]  # ids 509, 510, 511
MAX_TOKENS, PRESSURE_TOKENS = 8, 16
TOKENS = dict(max_tokens=MAX_TOKENS, pressure_tokens=PRESSURE_TOKENS)
TEXT = dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)
KW = dict(limit_mm_per_prompt={"image": 1})
TIGHT_BLOCKS = 24  # vLLM blocks of 32 tokens: the pressure phase does not fit at once


def gemma3_dir(root: Path) -> str:
    """Tiny Gemma-3 VLM (seeded random weights; the SigLIP LayerNorms around 1 and a projection
    10x the text weights' scale, so that the picture changes the greedy tokens) with a word-level tokenizer (``w7`` .. ``w508``) and the PIL
    ``Gemma3ImageProcessorPil`` (32x32 pictures, 8x8 patches pooled to 16 tokens)."""
    import torch
    import transformers as tf
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    out = root / "gemma3-vision"
    if (out / "config.json").exists():
        return str(out)
    vocab = {t: i for i, t in enumerate(SPECIAL + NEWLINES)}
    vocab.update({f"w{i}": i for i in range(len(vocab), 509)})
    vocab.update({t: 509 + i for i, t in enumerate(IMAGE_TOKENS)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL + IMAGE_TOKENS])
    tok.add_tokens([AddedToken(t, normalized=False) for t in NEWLINES])
    text = tf.Gemma3TextConfig(**TEXT, num_hidden_layers=4, sliding_window=48, query_pre_attn_scalar=64,
                               layer_types=["sliding_attention"] * 3 + ["full_attention"])
    vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   image_size=32, patch_size=4, vision_use_head=False)
    cfg = tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=16,
                          boi_token_index=509, eoi_token_index=510, image_token_index=511)
    cfg.dtype = "float32"
    torch.manual_seed(0)
    # the text model's norms scale by 1 + weight, SigLIP's by weight
    model = randomized(tf.Gemma3ForConditionalGeneration(cfg),
                       unit_norm=lambda name: "vision_tower" in name and "norm" in name and name.endswith("weight"))
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.5)
    model.save_pretrained(out)
    weights = load_file(out / "model.safetensors")
    tower = "vision_tower."
    save_file({(tower + "vision_model." + k[len(tower):] if k.startswith(tower) else k): v for k, v in weights.items()},
              out / "model.safetensors", metadata={"format": "pt"})
    back = tf.Gemma3ForConditionalGeneration.from_pretrained(out).state_dict()
    mine = model.state_dict()
    assert back.keys() == mine.keys() and all(torch.equal(back[k], mine[k]) for k in mine)
    hf_tok = tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                        extra_special_tokens=dict(zip(("boi_token", "eoi_token", "image_token"),
                                                                      IMAGE_TOKENS, strict=True)))
    tf.Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": 32, "width": 32}), tokenizer=hf_tok,
                       image_seq_length=16).save_pretrained(out)
    # the saved processor loads without torchvision (vLLM loads it the same way)
    assert type(tf.AutoProcessor.from_pretrained(out).image_processor) is Gemma3ImageProcessorPil
    return str(out)


def phases():
    """(name, prompts) run one after another: each prompt is (text with ``<start_of_image>``,
    picture); vLLM expands the marker to ``\\n\\n`` + marker + 16 image tokens + end + ``\\n\\n``."""
    rng = np.random.default_rng(1)
    img = pictures(4, 32)
    body, lead = words(rng, 120), words(rng, 100)
    docs = [words(rng, 60), words(rng, 60)]
    return [
        ("cold", [("<start_of_image>" + body + " w300", img[0])]),
        ("same image", [("<start_of_image>" + body + " w301", img[0])]),  # picture + 120 words shared: hits
        ("other image", [("<start_of_image>" + body + " w300", img[1])]),  # same text, another picture: no hit
        ("lead", [(lead + " <start_of_image>" + body, img[0])]),
        ("lead, other image", [(lead + " <start_of_image>" + body, img[2])]),  # the 100 words before it hit
        ("lead, third image", [(lead + " <start_of_image>" + body, img[3])]),
        # more than the tight budget holds at once: two pictures over two documents
        ("pressure", [("<start_of_image>" + docs[i % 2] + " " + words(rng, int(rng.integers(5, 30))), img[i % 2])
                      for i in range(6)]),
    ]


ALL = [name for name, _ in phases()]
SINGLE = ALL[:-1]  # one request at a time, ample memory


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    gemma3_image_shim.install()
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, old) if p)  # vLLM's model-inspection subprocess
    try:
        path = gemma3_dir(tmp_path_factory.getbasetemp())
        stock = engine(path, jenga=False, **KW)
        ref = run_phases(stock, phases(), ALL, **TOKENS)
        close(stock)
        ample = engine(path, jenga=True, **KW)
        got = run_phases(ample, phases(), SINGLE, **TOKENS)
        tight = engine(path, jenga=True, num_blocks=TIGHT_BLOCKS, max_model_len=160, **KW)
        got["pressure"] = run_phases(tight, phases(), ["pressure"], **TOKENS)["pressure"]
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    print_figures(ref, got)
    st = scheduler(tight).jenga.stats()
    print(f"tight budget ({TIGHT_BLOCKS} blocks): {scheduler(tight).num_preemptions} preemptions, "
          f"{st.evicted_pages} pages evicted, {st.prefix_hit_tokens} prefix-hit tokens")
    yield dict(ref=ref, got=got, sched=scheduler(ample), tight_sched=scheduler(tight))
    close(ample)
    close(tight)



def test_ample_memory_equals_stock_tokens_and_hits(runs):
    ref, got = runs["ref"], runs["got"]
    for name in SINGLE:
        assert got[name]["tokens"] == ref[name]["tokens"], name
        assert got[name]["encoded"] == ref[name]["encoded"], name
    assert runs["sched"].num_preemptions == 0
    # the random model's tokens depend on the picture: a mixed-up picture would change them
    assert got["other image"]["tokens"] != got["cold"]["tokens"]


def test_prefix_hits_follow_the_image(runs):
    ref, got = runs["ref"], runs["got"]
    for name in ("cold", "same image", "other image", "lead", "lead, third image"):
        assert got[name]["cached"] == ref[name]["cached"], name
    assert got["cold"]["cached"] == [0]
    # "\n\n" <start_of_image> + 16 image tokens + <end_of_image> "\n\n" + 120 words shared: 140 tokens,
    # 4 full blocks of 32
    assert got["same image"]["cached"] == [128]
    assert got["other image"]["cached"] == [0]  # the same words after another picture: nothing shared
    assert got["lead"]["cached"] == [0]
    # the 100 words before another picture: their 3 full blocks hit (the 4th holds the picture's start).
    # Stock vLLM 0.32 misses them on their second use and hits them on the third, as with Idefics3 (see
    # test_vllm_multimodal.py); jenga keeps the finished prompt's sliding-window pages until memory is needed
    assert got["lead, other image"]["cached"] == got["lead, third image"]["cached"] == [96]
    assert ref["lead, other image"]["cached"] == [0] and ref["lead, third image"]["cached"] == [96]
    # vLLM's encoder cache (not jenga's pool) serves a picture seen before at a new position ("lead")
    assert [got[n]["encoded"] for n in SINGLE] == [1, 0, 1, 0, 1, 1]


def test_tight_budget_preempts_and_equals_stock(runs):
    assert runs["got"]["pressure"]["tokens"] == runs["ref"]["pressure"]["tokens"]
    check_pressure_effects(runs["tight_sched"])


def test_every_page_reclaimed(runs):
    check_pages_reclaimed(runs["sched"], runs["tight_sched"])
