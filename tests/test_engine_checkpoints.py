"""Checkpoints as transformers writes them load into the engine and equal HF.

Per engine family: transformers' own class builds a tiny model (random weights), its own
``save_pretrained`` writes it (safetensors; MoE experts one by one, as the published Jamba /
Qwen3-Next / Qwen3-MoE checkpoints are), ``jenga.LLM(dir)`` loads it, and greedy tokens and
every generated token's logits equal HF ``generate`` on the saved model.  Plus a sharded
checkpoint whose experts are split across shards, tied and untied embeddings, and the loader's
typed errors.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams
from jenga.engine.models.weights import load_model, tiny_config
from jenga.errors import CheckpointError

GREEDY = SamplingParams(max_tokens=4, return_logits=True)
SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
#: variant -> (family, overrides of ``tiny_config(family)``)
FAMILIES = {f: (f, {}) for f in (
    "llama", "mistral", "ministral", "gemma2", "gemma3", "llama4", "jamba", "nemotron_h", "falcon_h1", "qwen3_next",
    "qwen2", "qwen3", "qwen3_moe", "bamba", "granitemoehybrid")}
FAMILIES["nemotron_h_moe"] = ("nemotron_h_moe", {})
FAMILIES["nemotron_h_moe_latent"] = ("nemotron_h_moe", dict(moe_latent_size=32))  # Nemotron-3 Super's latent experts
FAMILIES["granitemoehybrid_dense"] = ("granitemoehybrid", dict(num_local_experts=0, position_embedding_type="rope"))
#: families whose own saved checkpoint holds a tensor under a name the engine's model lacks (per-expert
#: tensors, Granite's ``input_linear``): transformers' conversion maps it
SAVED_FORMAT = {"jamba": "feed_forward.experts.0.gate_proj.weight", "qwen3_next": "mlp.experts.0.gate_proj.weight",
                "qwen3_moe": "mlp.experts.0.gate_proj.weight", "granitemoehybrid": "block_sparse_moe.input_linear.weight",
                "nemotron_h_moe": "mixer.experts.0.up_proj.weight"}
torch.set_num_threads(1)


@torch.no_grad()
def hf_random(config, seed: int = 0):
    """transformers' own model for ``config`` with N(0, 0.05) weights (norm weights around 1)."""
    config._attn_implementation = "eager"
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    gen = torch.Generator().manual_seed(seed)
    offset = config.model_type not in ("gemma2", "gemma3_text", "qwen3_next")  # their norms are 1 + w
    for name, p in model.named_parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        if offset and name.endswith("norm.weight"):
            p.add_(1.0)
    for name, b in model.named_buffers():  # a router's score bias is saved too: make it matter
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn(b.shape, generator=gen) * 0.05)
    return model


def saved(tmp_path_factory, variant: str, **kwargs):
    """``(hf model, directory)`` of a tiny ``variant`` model written by ``save_pretrained(**kwargs)``."""
    family, overrides = FAMILIES[variant]
    config = tiny_config(family, **{**SPECIAL, **overrides, **kwargs.pop("config", {})})
    hf = hf_random(config)
    path = tmp_path_factory.mktemp(variant)
    hf.save_pretrained(path, **kwargs)
    return hf, path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One saved checkpoint per family, built on first use and shared by the tests of this module."""
    cache: dict = {}

    def get(family):
        if family not in cache:
            cache[family] = saved(tmp_path_factory, family)
        return cache[family]
    return get


def prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 512, (n,), generator=gen).tolist() for n in lengths]


def assert_hf_equal(hf, outs):
    for out in outs:
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(out.token_ids),
                              do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert out.token_ids == res.sequences[0, ids.shape[1]:].tolist(), f"request {out.request_id}: tokens differ"
        for got, ref in zip(out.logits, res.logits, strict=True):
            torch.testing.assert_close(got, ref[0].float(), atol=1e-4, rtol=1e-4)


def run(path, **kw):
    llm = jenga.LLM(path, kv_memory="8MiB", max_num_batched_tokens=32, **kw)
    return llm, llm.generate(prompts([37, 12]), GREEDY)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_checkpoint_equals_hf(checkpoints, family):
    hf, path = checkpoints(family)
    if family in SAVED_FORMAT:  # the checkpoint really is in the format transformers converts
        index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"] \
            if (path / "model.safetensors.index.json").exists() else None
        from safetensors import safe_open

        names = set(index) if index else set(safe_open(str(path / "model.safetensors"), "pt").keys())
        assert any(n.endswith(SAVED_FORMAT[family]) for n in names)
    _, outs = run(path)
    assert_hf_equal(hf, outs)


def test_sharded_checkpoint_splits_experts_across_shards(tmp_path_factory):
    hf, path = saved(tmp_path_factory, "qwen3_next", max_shard_size="40KB")
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    expert_files = {f for n, f in weight_map.items() if ".experts." in n and n.startswith("model.layers.1.")}
    assert len(set(weight_map.values())) > 3 and len(expert_files) > 1, "one layer's experts should span shards"
    _, outs = run(path)
    assert_hf_equal(hf, outs)


@pytest.mark.parametrize("tied", [True, False])
def test_tied_and_untied_embeddings(tmp_path_factory, tied):
    hf, path = saved(tmp_path_factory, "jamba", config=dict(tie_word_embeddings=tied))
    from safetensors import safe_open

    assert ("lm_head.weight" in safe_open(str(path / "model.safetensors"), "pt").keys()) == (not tied)
    llm, outs = run(path)
    assert (llm.model.lm_head.weight is llm.model.model.embed_tokens.weight) == tied
    assert_hf_equal(hf, outs)


@pytest.mark.parametrize("variant", ["jamba", "nemotron_h_moe", "granitemoehybrid"])
def test_load_model_equals_hf_state_dict(checkpoints, variant):
    """Every tensor (parameters and the router's saved score bias) equals HF's in-memory one."""
    hf, path = checkpoints(variant)
    ref, ours = hf.state_dict(), load_model(path).state_dict()
    assert set(ours) <= set(ref)
    for name, p in ours.items():
        torch.testing.assert_close(p, ref[name], atol=0, rtol=0)


def test_missing_and_misshapen_tensors_are_typed_errors(tmp_path, checkpoints):
    from safetensors.torch import load_file, save_file

    _, path = checkpoints("llama")
    tensors = load_file(str(path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    short = {n: t for n, t in tensors.items() if "layers.1.mlp" not in n}
    save_file(short, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks 3 parameters"):
        load_model(tmp_path)
    bad = {**tensors, "model.norm.weight": torch.ones(3)}
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        load_model(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no safetensors"):
        load_model(tmp_path)


def test_conversion_by_model_type_when_the_hf_class_cannot_be_built(checkpoints, monkeypatch):
    """Without transformers' class on the meta device the loader falls back to the model type's own
    conversion list: the per-expert Jamba checkpoint still loads exactly."""
    from jenga.engine.models import hf_conversion

    monkeypatch.setattr(hf_conversion, "reference_model", lambda config: None)
    hf, path = checkpoints("jamba")
    ref = hf.state_dict()
    for name, p in load_model(path).state_dict().items():
        torch.testing.assert_close(p, ref[name], atol=0, rtol=0)


@pytest.mark.parametrize("name,cls", [("tiny-gemma3-vision", "Gemma3ForConditionalGeneration"),
                                      ("tiny-mllama", "MllamaForConditionalGeneration")])
def test_vision_language_checkpoints_load_exactly(tmp_path, name, cls):
    """transformers' own VLM class saved; the engine's class running the vision tower loads every tensor."""
    from jenga.engine.tiny import tiny_hf_config

    hf = getattr(tf, cls)(tiny_hf_config(name)).eval()
    hf.save_pretrained(tmp_path)
    ref, ours = hf.state_dict(), load_model(tmp_path).state_dict()
    assert len(ours) > 50 and set(ours) <= set(ref)
    for n, p in ours.items():
        torch.testing.assert_close(p, ref[n], atol=0, rtol=0)
