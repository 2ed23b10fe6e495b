"""Load local HF checkpoints (safetensors, single or sharded) and make tiny random configs.

* :func:`load_model` ``(path)``: config from ``path/config.json`` (offline), model class from
  the registry, weights from ``model.safetensors`` or ``model.safetensors.index.json`` shards.
* :func:`load_weights`: the checkpoint's tensors under transformers' in-memory names, converted as
  ``from_pretrained`` converts them (:mod:`jenga.engine.models.hf_conversion`: per-expert weights
  fused, renamed prefixes ...), copied into the model by name.  The text decoder of a multimodal
  checkpoint loads into the text-only classes (:data:`TEXT_DECODER_PREFIXES`); vision weights are
  skipped, except by the classes that run the vision tower.  A missing ``lm_head.weight`` is fine
  when embeddings are tied.
* :func:`tiny_config` / :func:`randomize_`: small random models for tests (no hub needed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from jenga.engine.models.common import PagedCausalLM
from jenga.engine.models.hf_conversion import converted_tensors
from jenga.engine.models.registry import build_model
from jenga.errors import CheckpointError

#: where transformers' multimodal classes keep their text decoder (in-memory names, v5 and the
#: Llama-4 layout) -> the text-only classes' names.
TEXT_DECODER_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)


def load_config(path: str | Path):
    """HF config of a local model directory (never touches the network)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), local_files_only=True)


def safetensors_files(path: str | Path) -> list[Path]:
    """Checkpoint files: the shards named by ``model.safetensors.index.json``, else ``*.safetensors``."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no safetensors checkpoint in {path}")
    return files


def _target_name(name: str, params: dict) -> str | None:
    if name in params:
        return name
    for src, dst in TEXT_DECODER_PREFIXES:
        if name.startswith(src) and dst + name[len(src):] in params:
            return dst + name[len(src):]
    return None


@torch.no_grad()
def load_weights(model: nn.Module, path: str | Path, *, strict: bool = True, config=None) -> dict[str, list[str]]:
    """Copy the checkpoint at ``path`` into ``model`` (cast to each parameter's dtype / device).

    ``config`` is the checkpoint's HF config (read from ``path`` when None): it names the HF class
    whose conversion applies.  Returns ``{"missing": [...], "skipped": [...]}``. With ``strict`` a
    missing parameter (other than a tied ``lm_head.weight``) raises :class:`CheckpointError`, as does
    a tensor whose shape differs from the parameter's; tensors with no matching parameter are
    skipped (vision towers of multimodal checkpoints).
    """
    config = load_config(path) if config is None else config
    persistent = model.state_dict(keep_vars=True).keys()  # parameters and persistent buffers (a router's bias)
    params = {**{n: b for n, b in model.named_buffers() if n in persistent},
              **dict(model.named_parameters(remove_duplicate=False))}
    loaded, skipped = set(), []
    for name, tensor in converted_tensors(safetensors_files(path), config):
        target = _target_name(name, params)
        if target is None:
            skipped.append(name)
            continue
        param = params[target]
        if tuple(param.shape) != tuple(tensor.shape):
            raise CheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, the model's {target} "
                                  f"{tuple(param.shape)}")
        param.copy_(tensor)
        loaded.add(target)
    missing = [n for n in params if n not in loaded]
    head = getattr(model, "lm_head", None) if isinstance(model, PagedCausalLM) else None
    tied = [n for n, p in params.items() if head is not None and p is head.weight and n != "lm_head.weight"]
    if tied and tied[0] in loaded:  # tied embeddings (``model.embed_tokens`` or a VLM's decoder's)
        missing = [n for n in missing if n != "lm_head.weight"]
    if strict and missing:
        raise CheckpointError(f"checkpoint {path} lacks {len(missing)} parameters, e.g. {missing[:5]}")
    return {"missing": missing, "skipped": skipped}


def load_model(path: str | Path, *, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> PagedCausalLM:
    """Paged model for the HF directory ``path`` with its safetensors weights loaded."""
    config = load_config(path)
    model = build_model(config, device=device, dtype=dtype)
    load_weights(model, path, config=config)
    return model


@torch.no_grad()
def randomize_(model: nn.Module, *, seed: int = 0, std: float = 0.05) -> nn.Module:
    """Fill every parameter with ``N(0, std)`` (norm weights too, so offsets are exercised)."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model


_TINY_COMMON = dict(vocab_size=512, hidden_size=256, intermediate_size=256, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)


def tiny_config(family: str, **overrides):
    """A small HF config of ``family`` (a key of ``families`` below, ``gemma3_vision`` or ``mllama``).

    Windows / chunks are 32 tokens (two 16-token pages) so short prompts cross them.
    """
    import transformers as tf

    llama3_rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    families = {
        "llama": (tf.LlamaConfig, dict(num_hidden_layers=2, rope_parameters=llama3_rope)),
        "mistral": (tf.MistralConfig, dict(num_hidden_layers=2, sliding_window=32)),
        "ministral": (tf.MinistralConfig, dict(
            num_hidden_layers=3, sliding_window=32,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
        "gemma2": (tf.Gemma2Config, dict(
            num_hidden_layers=4, sliding_window=32, query_pre_attn_scalar=48,
            attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
        "gemma3": (tf.Gemma3TextConfig, dict(
            num_hidden_layers=4, sliding_window=32, query_pre_attn_scalar=48,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
        "llama4": (tf.Llama4TextConfig, dict(
            num_hidden_layers=4, intermediate_size=128, intermediate_size_mlp=256, num_local_experts=4,
            num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0],
            attention_chunk_size=32, use_qk_norm=True, attn_temperature_tuning=True, floor_scale=8,
            attn_scale=0.5, rope_parameters=llama3_rope)),
        "jamba": (tf.JambaConfig, dict(
            num_hidden_layers=4, hidden_size=64, intermediate_size=128, attn_layer_period=2, attn_layer_offset=1,
            num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
            mamba_d_state=13, mamba_d_conv=4, mamba_expand=2)),  # state page 16 KiB: LCM = the full page
        "nemotron_h": (tf.NemotronHConfig, dict(
            hidden_size=64, intermediate_size=128, mamba_num_heads=4, mamba_head_dim=32, n_groups=2,
            ssm_state_size=32, conv_kernel=4, chunk_size=16,
            layers_block_type=["linear_attention", "full_attention", "mlp", "linear_attention"])),
        "nemotron_h_moe": (tf.NemotronHConfig, dict(  # Nemotron-3 Nano's blocks: 8 experts in 2 groups, top 2
            hidden_size=64, intermediate_size=128, mamba_num_heads=4, mamba_head_dim=32, n_groups=2,
            ssm_state_size=32, conv_kernel=4, chunk_size=16,
            layers_block_type=["linear_attention", "moe", "full_attention", "moe", "linear_attention"],
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=64, n_group=2, topk_group=1, norm_topk_prob=True,
            routed_scaling_factor=2.5)),
        "falcon_h1": (tf.FalconH1Config, dict(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, head_dim=32, mamba_n_heads=4, mamba_d_head=32,
            mamba_d_ssm=128, mamba_n_groups=2, mamba_d_state=32, mamba_d_conv=4, mamba_chunk_size=16,
            mamba_rms_norm=True, ssm_multipliers=[1.0, 0.5, 1.5, 0.8, 1.2], mlp_multipliers=[1.2, 0.8],
            key_multiplier=0.9, attention_in_multiplier=1.1, attention_out_multiplier=0.9, ssm_in_multiplier=1.2,
            ssm_out_multiplier=0.8, embedding_multiplier=1.5, lm_head_multiplier=0.7)),
        "qwen3_next": (tf.Qwen3NextConfig, dict(  # conv kernel 5: a 12 KiB state page, LCM 3x
            num_hidden_layers=4, hidden_size=64, intermediate_size=128, head_dim=32,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=5, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, decoder_sparse_step=2, partial_rotary_factor=0.5)),
        # sliding from layer 1 on (use_sliding_window, max_window_layers): one full, two sliding layers
        "qwen2": (tf.Qwen2Config, dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=32,
                                       max_window_layers=1)),
        "qwen3": (tf.Qwen3Config, dict(num_hidden_layers=2)),
        "qwen3_moe": (tf.Qwen3MoeConfig, dict(
            num_hidden_layers=4, hidden_size=64, intermediate_size=128, head_dim=32, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=2, norm_topk_prob=True)),
        "bamba": (tf.BambaConfig, dict(
            num_hidden_layers=4, hidden_size=64, intermediate_size=128, head_dim=32, attn_layer_indices=[1, 3],
            mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=32, mamba_d_conv=4,
            mamba_chunk_size=16)),
        "granitemoehybrid": (tf.GraniteMoeHybridConfig, dict(  # Granite-4.0-H: MoE + shared MLP, no RoPE
            num_hidden_layers=4, hidden_size=64, intermediate_size=32, shared_intermediate_size=64, head_dim=32,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2,
            mamba_d_state=32, mamba_d_conv=4, mamba_chunk_size=16, embedding_multiplier=1.5, logits_scaling=2.0,
            residual_multiplier=0.8, attention_multiplier=0.2, position_embedding_type="nope")),
    }
    if family == "gemma3_vision":
        return tiny_gemma3_vision_config(**overrides)
    if family == "mllama":
        return tiny_mllama_config(**overrides)
    if family not in families:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(families)}")
    cls, extra = families[family]
    kwargs = {**_TINY_COMMON, **extra, **overrides}
    return cls(**kwargs)


#: ids of the tiny Gemma-3 VLM's image placeholder tokens (inside the 512-token vocab)
TINY_BOI, TINY_EOI, TINY_IMAGE = 509, 510, 511


def tiny_gemma3_vision_config(*, image_size: int = 32, patch_size: int = 4, mm_tokens_per_image: int = 16,
                              **text_overrides):
    """A small ``Gemma3Config``: the tiny Gemma-3 text model + a 2-layer SigLIP (32x32 images,
    8x8 patches pooled to ``mm_tokens_per_image`` tokens)."""
    import transformers as tf

    text = tiny_config("gemma3", **text_overrides)
    vision = tf.SiglipVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                                   image_size=image_size, patch_size=patch_size)
    return tf.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                           mm_tokens_per_image=mm_tokens_per_image, boi_token_index=TINY_BOI,
                           eoi_token_index=TINY_EOI, image_token_index=TINY_IMAGE,
                           architectures=["Gemma3ForConditionalGeneration"])


#: id of the tiny Llama-3.2-Vision's ``<|image|>`` token: the text vocabulary's size, as in the real model
#: (its embeddings have ``vocab + 8`` rows; the LM head only ``vocab``)
TINY_MLLAMA_IMAGE = 512


def tiny_mllama_config(*, image_size: int = 32, patch_size: int = 8, max_num_tiles: int = 2, **text_overrides):
    """A small ``MllamaConfig``: a 4-layer Llama decoder (cross-attention layers 1 and 3) + a tiled
    vision model (2 local + 1 global layers, 32x32 tiles of 16 patches + CLS, up to 2 tiles; aspect
    ratios 1x1, 1x2, 2x1), so one image is ``2 x 17 = 34`` cross-attention tokens."""
    import transformers as tf

    text = {**_TINY_COMMON, "num_hidden_layers": 4, "cross_attention_layers": [1, 3],
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, **text_overrides}
    text.pop("head_dim")  # Mllama's head_dim is hidden / heads (64 here)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_global_layers=1, attention_heads=2,
                  image_size=image_size, patch_size=patch_size, max_num_tiles=max_num_tiles,
                  intermediate_layers_indices=[0], vision_output_dim=128,
                  supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]])
    return tf.MllamaConfig(text_config=text, vision_config=vision, image_token_index=TINY_MLLAMA_IMAGE,
                           architectures=["MllamaForConditionalGeneration"])


def random_model(family: str, *, seed: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, **overrides) -> PagedCausalLM:
    """Tiny random-weight paged model of ``family`` (its HF config is ``model.config``)."""
    return randomize_(build_model(tiny_config(family, **overrides), device=device, dtype=dtype), seed=seed)
