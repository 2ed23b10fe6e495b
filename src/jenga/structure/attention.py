"""Attention sizes from the config's own fields (torch-free).

* K/V heads: ``num_key_value_heads`` (absent or null: ``num_attention_heads``, i.e. multi-head attention);
  encoder-decoder configs used as decoders read ``decoder_attention_heads`` first.
* Head dim: ``head_dim`` (absent or null: ``hidden_size // num_attention_heads``, as the modeling code does).
* Heterogeneous configs (Gemma-4: other head dim / KV heads in full layers) are read per layer through
  transformers' ``config.per_layer_config[i]``.
* MLA (DeepSeek-V2/V3, Kimi, GLM-4.7-Flash ...): a config with ``kv_lora_rank`` caches one latent of
  ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer, not K and V per head (the rope part may
  be 0).

A size field that is present must be a positive integer; anything else is an error naming the field.
"""

from __future__ import annotations

from typing import Any

from jenga.structure.facts import Attention, Component, Latent
from jenga.structure.source import UnsupportedModelError

__all__ = ["attention_component", "positive_field"]


def positive_field(tc: Any, name: str, where: str, *, required: bool = True, zero_ok: bool = False) -> int | None:
    v = getattr(tc, name, None)
    if v is None:
        if required:
            raise UnsupportedModelError(f"{where}: the config has no {name!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if zero_ok else 1):
        raise UnsupportedModelError(f"{where}: {name!r} must be a positive integer, got {v!r}")
    return v


def _heads(tc: Any, where: str) -> int:
    for name in ("decoder_attention_heads", "num_attention_heads"):
        if getattr(tc, name, None) is not None:
            return positive_field(tc, name, where)  # type: ignore[return-value]
    raise UnsupportedModelError(f"{where}: the config has no 'num_attention_heads'")


def attention_component(tc: Any, kind: str, span: int, where: str) -> Component:
    """The component of one attention slot (``full`` / ``sliding`` / ``chunked`` / ``cross``)."""
    rank = positive_field(tc, "kv_lora_rank", where, required=False)
    if rank is not None:
        rope = positive_field(tc, "qk_rope_head_dim", where, zero_ok=True)
        return Latent(kind, rank + rope, span)  # type: ignore[operator]
    heads = _heads(tc, where)
    head_dim = positive_field(tc, "head_dim", where, required=False)
    if head_dim is None:
        head_dim = positive_field(tc, "hidden_size", where) // heads  # type: ignore[operator]
        if head_dim == 0:
            raise UnsupportedModelError(f"{where}: no 'head_dim' and hidden_size < {heads} heads")
    kv = positive_field(tc, "num_key_value_heads", where, required=False) or heads
    return Attention(kind, kv, head_dim, span)
