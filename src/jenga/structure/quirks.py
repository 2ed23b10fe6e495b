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


QUIRKS: dict[str, Callable[[Any, list[list[Slot]]], list[list[Slot]]]] = {
    "mllama_text_model": _mllama,
}

#: Top-level model types whose projected image embeddings jenga caches as a ``vision`` group (a serving
#: choice, not a model fact: Gemma-3 prefills image tokens from cached embeddings, as the paper does).
VISION_EMBEDDING_TYPES = frozenset({"gemma3"})
