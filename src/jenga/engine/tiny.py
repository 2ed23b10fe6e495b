"""Built-in tiny random-weight models (``tiny-gemma3``, ``tiny-llama`` ...): no downloads.

Each name maps to a small Hugging Face config (head_dim 64, 512-token vocab, windows and
chunks multiples of the 16-token page).  ``tiny-gemma3`` is the heterogeneous default of
``jenga bench``: 6 layers, 5 sliding (window 64) : 1 full, like Gemma-3's 5:1 pattern.
Token ids 0 / 1 / 2 are ``<pad>`` / ``<bos>`` / ``<eos>`` (matching :mod:`jenga.engine.tokenizer`).
"""

from __future__ import annotations

import torch

from jenga.errors import InvalidArgumentError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
_SPECIAL = dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, max_position_embeddings=4096)

#: name -> (family, overrides of ``weights.tiny_config(family)``)
TINY_MODELS: dict[str, tuple[str, dict]] = {
    "tiny-gemma3": ("gemma3", dict(
        num_hidden_layers=6, sliding_window=64,
        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
    "tiny-gemma3-vision": ("gemma3_vision", dict(
        num_hidden_layers=6, sliding_window=64,
        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
    "tiny-mllama": ("mllama", {}),
    "tiny-gemma2": ("gemma2", {}),
    "tiny-llama": ("llama", {}),
    "tiny-mistral": ("mistral", {}),
    "tiny-ministral": ("ministral", {}),
    "tiny-llama4": ("llama4", {}),
    "tiny-jamba": ("jamba", {}),
    # Jamba's own 1 attention : 7 Mamba layout (period 8, offset 4), the jenga bench hybrid default
    "tiny-jamba-1to7": ("jamba", dict(num_hidden_layers=8, attn_layer_period=8, attn_layer_offset=4)),
    "tiny-nemotron-h": ("nemotron_h", {}),
    "tiny-nemotron-h-moe": ("nemotron_h_moe", {}),
    "tiny-falcon-h1": ("falcon_h1", {}),
    "tiny-qwen3-next": ("qwen3_next", {}),
    "tiny-qwen2": ("qwen2", {}),
    "tiny-qwen3": ("qwen3", {}),
    "tiny-qwen3-moe": ("qwen3_moe", {}),
    "tiny-bamba": ("bamba", {}),
    "tiny-granite-4h": ("granitemoehybrid", {}),
    # Granite-4.0-H Micro's shape: dense (no experts, the shared MLP alone), RoPE attention
    "tiny-granite-4h-dense": ("granitemoehybrid", dict(num_local_experts=0, position_embedding_type="rope")),
}


def is_tiny(name: object) -> bool:
    return isinstance(name, str) and name in TINY_MODELS


def tiny_hf_config(name: str, **overrides):
    """The HF config of a built-in tiny model (eager attention, so HF can serve as an oracle)."""
    from jenga.engine.models.weights import tiny_config

    if name not in TINY_MODELS:
        raise InvalidArgumentError(f"unknown tiny model {name!r}; choose one of {', '.join(TINY_MODELS)}")
    family, extra = TINY_MODELS[name]
    config = tiny_config(family, **{**_SPECIAL, **extra, **overrides})
    config._attn_implementation = "eager"
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub)._attn_implementation = "eager"
    return config


@torch.no_grad()
def init_random_weights(model: torch.nn.Module, *, seed: int = 0, std: float = 0.05) -> torch.nn.Module:
    """``N(0, std)`` weights; RMSNorm weights around 1 (Gemma's ``1 + w`` norms: around 0)."""
    from jenga.engine.models.gemma import Gemma2ForCausalLM
    from jenga.engine.models.gemma3_vision import Gemma3ForConditionalGeneration, init_vision_weights
    from jenga.engine.models.mllama import MllamaForConditionalGeneration, init_mllama_weights
    from jenga.engine.models.weights import randomize_

    randomize_(model, seed=seed, std=std)
    if isinstance(model, Gemma3ForConditionalGeneration):
        init_vision_weights(model)
    elif not isinstance(model, Gemma2ForCausalLM):
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(1.0)
        if isinstance(model, MllamaForConditionalGeneration):
            init_mllama_weights(model, seed=seed)
    return model


def engine_name_hint(name: str) -> str:
    """A clause for a model name the engine does not know: a catalog name (a config for
    ``jenga plan`` / ``simulate``, no weights) with the tiny model of its family, or a hub id."""
    import difflib

    from jenga.structure.source import CATALOG_NAMES, name_hint

    if name in CATALOG_NAMES:
        family = name.split("-")[0] + "".join(c for c in name.split("-")[1][:1] if c.isdigit()) if "-" in name else name
        close = difflib.get_close_matches(f"tiny-{family}", list(TINY_MODELS), n=1, cutoff=0.5)
        also = f"; its family's tiny model is {close[0]!r}" if close else ""
        return (f"; {name!r} is a catalog name: a config for `jenga plan` / `jenga simulate`, without weights. "
                f"The engine runs a local HF model directory (with --random-weights for a random one) or a tiny "
                f"model{also}")
    return name_hint(name)
