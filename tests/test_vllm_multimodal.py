"""Image prompts inside vLLM with jenga's scheduler: a tiny Idefics3 (SigLIP-style vision
tower, pixel-shuffle connector, Llama text model with 3 sliding-window layers : 1 full),
written with transformers' ``save_pretrained`` plus its processor and tokenizer.

Greedy tokens equal stock vLLM's with ample memory and with a tight budget (preemption);
per-request prefix hits (``num_cached_tokens``): a prompt with the same image and text hits as
in stock, one with another image at the same text does not, one sharing only the text before
its (different) image hits that text's blocks (jenga already on that text's second use).  vLLM's encoder cache stays vLLM's:
jenga keys its pages by vLLM's ``request.block_hashes``, which carry the images' hashes.

Why Idefics3 and not Gemma-3: vLLM 0.32's Gemma-3 (and PaliGemma, LLaVA, Pixtral, Qwen-VL)
import transformers' torchvision-only image processors, and the only torchvision builds for
torch 2.13 this install can reach are CUDA builds that fail to load against the CPU torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from vllm_images import pictures, print_figures, run_phases, words
from vllm_support import check_pages_reclaimed, check_pressure_effects, close, engine, randomized, scheduler

pytestmark = pytest.mark.xdist_group("vllm-multimodal")

SPECIAL = ["<pad>", "<bos>", "<eos>", "<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
IMAGE = 3  # "<image>": 64 per picture (256 px, 16 px patches, pixel shuffle 2)
MAX_TOKENS = 8
TEXT = dict(vocab_size=512, hidden_size=128, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=64, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)
PRESSURE_TOKENS = 16


def vision_dir(root: Path) -> str:
    """Tiny Idefics3 (seeded random weights) with a word-level tokenizer (``w5`` .. ``w511``) and
    the PIL image processor (no tiling: one 64-token image per picture)."""
    import torch
    import transformers as tf
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    out = root / "idefics3"
    if (out / "config.json").exists():
        return str(out)
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    vocab["\n"] = len(vocab)
    vocab.update({f"w{i}": i for i in range(len(vocab), TEXT["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    text = tf.LlamaConfig(**TEXT, num_hidden_layers=4, sliding_window=64,
                          layer_types=["sliding_attention"] * 3 + ["full_attention"])
    vision = tf.Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     image_size=256, patch_size=16)
    cfg = tf.Idefics3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), image_token_id=IMAGE,
                            scale_factor=2, pad_token_id=0)
    cfg.dtype = "float32"
    torch.manual_seed(0)
    randomized(tf.Idefics3ForConditionalGeneration(cfg)).save_pretrained(out)
    hf_tok = tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    images = tf.Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 256},
                                          max_image_size={"longest_edge": 256})
    tf.Idefics3Processor(image_processor=images, tokenizer=hf_tok, image_seq_len=64).save_pretrained(out)
    return str(out)


def phases():
    """(name, prompts) run one after another: each prompt is (text with ``<image>``, picture)."""
    rng = np.random.default_rng(1)
    img = pictures(4, 256)
    body, lead = words(rng, 120), words(rng, 100)
    docs = [words(rng, 60), words(rng, 60)]
    return [
        ("cold", [("<image>" + body + " w300", img[0])]),
        ("same image", [("<image>" + body + " w301", img[0])]),  # image + 120 words shared: hits
        ("other image", [("<image>" + body + " w300", img[1])]),  # same text, another image: no hit
        ("lead", [(lead + "<image>" + body, img[0])]),
        ("lead, other image", [(lead + "<image>" + body, img[2])]),  # the 100 words before the image hit
        ("lead, third image", [(lead + "<image>" + body, img[3])]),
        # more than the tight budget holds at once: two pictures over two documents
        ("pressure", [("<image>" + docs[i % 2] + " " + words(rng, int(rng.integers(5, 30))), img[i % 2])
                      for i in range(6)]),
    ]


ALL = [name for name, _ in phases()]
SINGLE = ALL[:-1]  # one request at a time, ample memory
KW = dict(limit_mm_per_prompt={"image": 1})
TOKENS = dict(max_tokens=MAX_TOKENS, pressure_tokens=PRESSURE_TOKENS)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = vision_dir(tmp_path_factory.getbasetemp())
    stock = engine(path, jenga=False, **KW)
    ref = run_phases(stock, phases(), ALL, **TOKENS)
    close(stock)
    ample = engine(path, jenga=True, **KW)
    got = run_phases(ample, phases(), SINGLE, **TOKENS)
    print_figures(ref, got)
    tight = engine(path, jenga=True, num_blocks=32, max_model_len=224, **KW)
    got["pressure"] = run_phases(tight, phases(), ["pressure"], **TOKENS)["pressure"]
    yield dict(ref=ref, got=got, sched=scheduler(ample), tight_sched=scheduler(tight))
    close(ample)
    close(tight)


def test_ample_memory_equals_stock_tokens_and_hits(runs):
    ref, got = runs["ref"], runs["got"]
    for name in SINGLE:
        assert got[name]["tokens"] == ref[name]["tokens"], name
        assert got[name]["encoded"] == ref[name]["encoded"], name
    assert runs["sched"].num_preemptions == 0
    # the random model's tokens depend on the picture: a mixed-up image would change them
    assert got["same image"]["tokens"][0][:1] == got["cold"]["tokens"][0][:1]
    assert got["other image"]["tokens"] != got["cold"]["tokens"]


def test_prefix_hits_follow_the_image(runs):
    ref, got = runs["ref"], runs["got"]
    for name in ("cold", "same image", "other image", "lead"):
        assert got[name]["cached"] == ref[name]["cached"], name
    assert got["cold"]["cached"] == [0]
    # <fake><global-img> + 64 image tokens + <fake> + 120 words shared: 187 tokens, 5 full blocks of 32
    assert got["same image"]["cached"] == [160]
    assert got["other image"]["cached"] == [0]  # the same words after another picture: nothing shared
    assert got["lead"]["cached"] == [0]
    # the 100 words before another picture: their 3 full blocks hit.  Stock vLLM 0.32 misses them once:
    # its sliding-window groups keep only part of a finished prompt's out-of-window blocks, and the miss
    # pins that junction, so the third prompt with these words hits.  jenga's sliding-window pages of the
    # finished prompt stay cached until memory is needed: the second prompt hits already
    assert got["lead, other image"]["cached"] == got["lead, third image"]["cached"] == [96]
    assert ref["lead, other image"]["cached"] == [0] and ref["lead, third image"]["cached"] == [96]
    # vLLM's encoder cache (not jenga's pool) serves a picture seen before, at any position: "same image"
    # needs no encoder input (its KV hit covers the picture), "lead" takes img[0]'s cached embeddings
    assert [got[n]["encoded"] for n in SINGLE] == [1, 0, 1, 0, 1, 1]


def test_tight_budget_preempts_and_equals_stock(runs):
    assert runs["got"]["pressure"]["tokens"] == runs["ref"]["pressure"]["tokens"]
    check_pressure_effects(runs["tight_sched"])


def test_every_page_reclaimed(runs):
    check_pages_reclaimed(runs["sched"], runs["tight_sched"])


def test_jengas_own_hashes_are_salted_by_the_images():
    """When jenga hashes a prompt itself (vLLM's block hashes unusable), another picture behind
    the same placeholder tokens, or the same picture elsewhere, gives another salt."""
    from types import SimpleNamespace

    from jenga.vllm.adapter import JengaKVCacheAdapter

    def req(*images, salt=None):
        feats = [SimpleNamespace(identifier=h, mm_position=SimpleNamespace(offset=o, length=67)) for h, o in images]
        return SimpleNamespace(cache_salt=salt, lora_request=None, mm_features=feats)

    salts = [JengaKVCacheAdapter.cache_salt(r) for r in (
        req(), req(("a", 0)), req(("b", 0)), req(("a", 100)), req(("a", 0), ("b", 200)), req(("a", 0), salt="t1"))]
    assert salts[0] is None
    assert len(set(salts)) == 6
    assert salts[1] == JengaKVCacheAdapter.cache_salt(req(("a", 0)))

