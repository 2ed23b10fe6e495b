"""Per-layer cache kinds, as transformers itself builds them.

``DynamicCache(config=text_config)`` makes one cache layer per decoder layer, chosen by transformers from the
config (``layer_types``, or ``sliding_window`` / ``attention_chunk_size`` per layer).  Its layer class says
what the layer keeps; the layer-type string from ``get_layer_types_and_kwargs`` (the function DynamicCache
uses) tells chunked from sliding (both are ``DynamicSlidingWindowLayer``) and layers that keep nothing
(``mlp`` / ``moe`` layers get an empty ``LinearAttentionLayer``).  Layers past the cache's length
(Gemma-3n's KV-shared layers) keep nothing.  What transformers does not record is added by
:mod:`jenga.structure.quirks`.

A slot is ``(kind, span)``: ``full`` / ``sliding`` (span = window) / ``chunked`` (span = chunk) / ``cross`` /
``state`` (a recurrent mixer whose shape :mod:`jenga.structure.probe` reads from the model's modules).
"""

from __future__ import annotations

from typing import Any

from jenga.structure.source import UnsupportedModelError

__all__ = ["Slot", "cache_slots"]

Slot = tuple[str, int]
_NO_CACHE = ("mlp", "moe")


def _window(kind: str, span: Any) -> list[Slot]:
    # a sliding / chunked layer without a window attends to everything: a full layer
    return [(kind, int(span))] if span else [("full", 0)]


def _slots_of(layer: Any, layer_type: str) -> list[Slot]:
    from transformers import cache_utils as cu

    attn: dict[type, Any] = {
        cu.DynamicLayer: lambda: [("full", 0)],
        cu.DynamicIndexedLayer: lambda: [("full", 0)],  # sparse reads over a full cache (DSA)
        cu.DynamicSlidingWindowLayer: lambda: _window(
            "chunked" if layer_type == "chunked_attention" else "sliding", layer.sliding_window),
        cu.LinearAttentionLayer: lambda: [] if layer_type in _NO_CACHE else [("state", 0)],
        cu.LinearAttentionAndFullAttentionLayer: lambda: [("full", 0), ("state", 0)],
        cu.LinearAttentionAndSlidingWindowAttentionLayer: lambda: _window("sliding", layer.sliding_window)
        + [("state", 0)],
    }
    make = attn.get(type(layer))
    if make is None:
        raise UnsupportedModelError(f"cache layer {type(layer).__name__} (layer type {layer_type!r}) "
                                    "has no jenga cache kind")
    return make()


def cache_slots(tc: Any, where: str) -> list[list[Slot]]:
    """One list of slots per decoder layer of the text config ``tc``."""
    from transformers import DynamicCache
    from transformers.cache_utils import get_layer_types_and_kwargs

    from jenga.structure.quirks import QUIRKS

    n = getattr(tc, "num_hidden_layers", None)
    if not isinstance(n, int) or n <= 0:
        raise UnsupportedModelError(f"{where}: the text config has no positive 'num_hidden_layers' ({n!r})")
    try:
        types, _ = get_layer_types_and_kwargs(tc)
        cache = DynamicCache(config=tc)
    except KeyError as e:
        raise UnsupportedModelError(f"{where}: transformers has no cache layer for layer type {e}") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise UnsupportedModelError(f"{where}: transformers cannot build this config's cache: {e}") from e
    types = list(types)
    shared = getattr(tc, "num_kv_shared_layers", None) or 0
    if len(types) + shared != n:
        raise UnsupportedModelError(f"{where}: layer_types has {len(types)} entries but num_hidden_layers = {n}")
    slots = [_slots_of(layer, lt) for layer, lt in zip(cache.layers, types, strict=False)]
    slots += [[] for _ in range(n - len(slots))]
    quirk = QUIRKS.get(tc.model_type)
    return quirk(tc, slots) if quirk else slots
