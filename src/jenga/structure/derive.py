"""A transformers config -> :class:`~jenga.structure.facts.ModelFacts`: transformers first, family code last.

1. per-layer cache kinds from ``DynamicCache(config=text_config)`` (:mod:`~jenga.structure.layer_kinds`),
   plus the documented quirks of :mod:`~jenga.structure.quirks`;
2. attention sizes from the config's own fields (:mod:`~jenga.structure.attention`);
3. state sizes, only when some layer keeps a state, from the modules built on the meta device
   (:mod:`~jenga.structure.probe`, the one torch-importing step, imported lazily); the attention sizes of
   such a model are then read from its built modules too.
"""

from __future__ import annotations

from typing import Any

from jenga.structure.attention import attention_component, positive_field
from jenga.structure.facts import Attention, Component, ModelFacts
from jenga.structure.layer_kinds import cache_slots
from jenga.structure.quirks import VISION_EMBEDDING_TYPES
from jenga.structure.source import UnsupportedModelError

__all__ = ["NO_POSITION_LIMIT", "facts_from_config"]

#: ``max_model_len`` of a config without ``max_position_embeddings`` (or -1): nothing in the config bounds
#: its length (Mamba, RecurrentGemma, ALiBi models); requests are limited by memory and 32-bit positions only.
NO_POSITION_LIMIT = 2**31 - 1


def _check_decoder(cfg: Any, tc: Any, where: str) -> None:
    from transformers.models.auto import modeling_auto as ma

    decoders = set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    if cfg.model_type not in decoders and tc.model_type not in decoders:
        raise UnsupportedModelError(f"{where}: model_type {cfg.model_type!r} has no causal-LM or image-text-to-text "
                                    "model in transformers (not a decoder)")


def facts_from_config(cfg: Any, where: str) -> ModelFacts:
    tc = cfg.get_text_config(decoder=True)
    _check_decoder(cfg, tc, where)
    slots = cache_slots(tc, where)
    state_layers = [i for i, s in enumerate(slots) if any(kind == "state" for kind, _ in s)]
    states: dict = {}
    dims: dict[int, tuple[int, int]] = {}
    if state_layers:
        from jenga.structure.probe import probe_attention, probe_states

        states = probe_states(tc, state_layers, where)
        dims = probe_attention(tc, [i for i, s in enumerate(slots) if any(k != "state" for k, _ in s)])
    per_layer = tc.per_layer_config  # transformers' per-layer view (heterogeneous configs: Gemma-4)
    layers: list[tuple[Component, ...]] = []
    for i, layer_slots in enumerate(slots):
        comps: list[Component] = []
        for kind, span in layer_slots:
            if kind == "state":
                comps.append(states[i])
                continue
            c = attention_component(per_layer[i], kind, span, f"{where}: layer {i}")
            if isinstance(c, Attention) and i in dims:  # the built module's own sizes win
                c = Attention(c.kind, *dims[i], c.span)
            comps.append(c)
        layers.append(tuple(comps))
    if not any(layers):
        raise UnsupportedModelError(f"{where}: no layer keeps a cache")
    max_len = getattr(tc, "max_position_embeddings", None)
    if max_len in (None, -1):  # no learned / fixed positions (Mamba, RecurrentGemma, ALiBi, XLNet's -1)
        max_len = NO_POSITION_LIMIT
    else:
        max_len = positive_field(tc, "max_position_embeddings", where)
    vision = int(tc.hidden_size) if cfg.model_type in VISION_EMBEDDING_TYPES else 0
    return ModelFacts(len(slots), max_len, tuple(layers), vision)
