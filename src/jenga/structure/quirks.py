"""Family facts transformers' cache layers do not record, one function per ``model_type``, each documented.

``QUIRKS[text model_type](text_config, slots) -> slots`` rewrites the per-layer slots of
:func:`jenga.structure.layer_kinds.cache_slots`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jenga.structure.layer_kinds import Slot

__all__ = ["QUIRKS", "VISION_EMBEDDING_TYPES"]


def _mllama(tc: Any, slots: list[list[Slot]]) -> list[list[Slot]]:
    """Mllama (Llama-3.2-Vision): ``DynamicCache`` gives every layer a ``DynamicLayer``, but the layers in
    ``cross_attention_layers`` keep K/V of the image tokens only (computed once per image), never of text."""
    cross = set(tc.cross_attention_layers or ())
    return [[("cross", 0)] if i in cross else s for i, s in enumerate(slots)]


def _recurrent_gemma(tc: Any, slots: list[list[Slot]]) -> list[list[Slot]]:
    """RecurrentGemma: ``DynamicCache`` makes every layer a sliding-window layer, but ``block_types``
    (repeated over the layers) marks the ``recurrent`` ones, which keep an RG-LRU state, not K/V."""
    types = (list(tc.block_types) * len(slots))[:len(slots)]
    return [[("state", 0)] if t == "recurrent" else s for t, s in zip(types, slots, strict=True)]


def _no_cache_description(tc: Any, slots: list[list[Slot]]) -> list[list[Slot]]:
    """RWKV and xLSTM keep their recurrent states outside transformers' cache classes, whose default
    (a full-attention layer per layer) would be wrong: refuse rather than plan K/V they never store."""
    from jenga.structure.source import UnsupportedModelError

    raise UnsupportedModelError(f"{tc.model_type}: recurrent layers whose state transformers' cache does not "
                                "describe (no attention K/V, no linear-attention cache layer)")


QUIRKS: dict[str, Callable[[Any, list[list[Slot]]], list[list[Slot]]]] = {
    "mllama_text_model": _mllama,
    "recurrent_gemma": _recurrent_gemma,
    "rwkv": _no_cache_description,
    "xlstm": _no_cache_description,
}

#: Top-level model types whose projected image embeddings jenga caches as a ``vision`` group (a serving
#: choice, not a model fact: Gemma-3 prefills image tokens from cached embeddings, as the paper does).
VISION_EMBEDDING_TYPES = frozenset({"gemma3"})
