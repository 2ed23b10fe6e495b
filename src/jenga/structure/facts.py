"""What a model caches, layer by layer, before any dtype, page size or tensor-parallel choice.

:class:`ModelFacts` is the torch-free middle of the HF config -> :class:`~jenga.core.specs.ModelSpec` path:
``layer_kinds`` / ``attention`` / ``probe`` produce it from transformers, the catalog stores it
(``catalog/structure.json``) so catalog names need no transformers import, and ``groups`` turns it
into layer groups for a dtype, ``tp`` and page size.  Sizes here are whole-model (not per rank).

A layer keeps zero, one or two components:

* :class:`Attention` -- K and V of ``num_kv_heads`` x ``head_dim`` per token; ``kind`` is ``full``,
  ``sliding`` (``span`` = window), ``chunked`` (``span`` = chunk) or ``cross`` (image tokens only);
* :class:`Latent` -- one compressed vector of ``dim`` elements per token (MLA: DeepSeek-V2/V3, Kimi);
* :class:`State` -- a recurrent state of a ``mixer`` (see :data:`jenga.structure.mixers.MIXERS`)
  with its integer ``params``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Attention", "Component", "Latent", "ModelFacts", "State"]


@dataclass(frozen=True)
class Attention:
    kind: str
    num_kv_heads: int
    head_dim: int
    span: int = 0  # window (sliding) or chunk (chunked); 0 otherwise

    def to_json(self) -> dict[str, Any]:
        return {"attention": self.kind, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "span": self.span}


@dataclass(frozen=True)
class Latent:
    kind: str  # full or sliding
    dim: int
    span: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"latent": self.kind, "dim": self.dim, "span": self.span}


@dataclass(frozen=True)
class State:
    mixer: str
    params: tuple[tuple[str, int], ...]

    @property
    def p(self) -> dict[str, int]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.mixer, **self.p}


Component = Attention | Latent | State


def component_from_json(d: dict[str, Any]) -> Component:
    d = dict(d)
    if "attention" in d:
        return Attention(d.pop("attention"), **d)
    if "latent" in d:
        return Latent(d.pop("latent"), **d)
    mixer = d.pop("state")
    return State(mixer, tuple(sorted(d.items())))


@dataclass(frozen=True)
class ModelFacts:
    """Per-layer components of one text decoder (+ an optional vision-embedding width)."""

    num_layers: int
    max_model_len: int
    layers: tuple[tuple[Component, ...], ...]
    vision_hidden_size: int = 0  # > 0: cache projected image embeddings of this width
    notes: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        table: list[Component] = []
        for comps in self.layers:
            for c in comps:
                if c not in table:
                    table.append(c)
        return {"num_layers": self.num_layers, "max_model_len": self.max_model_len,
                "vision_hidden_size": self.vision_hidden_size,
                "components": [c.to_json() for c in table],
                "layers": [[table.index(c) for c in comps] for comps in self.layers]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelFacts:
        table = [component_from_json(c) for c in d["components"]]
        return cls(int(d["num_layers"]), int(d["max_model_len"]),
                   tuple(tuple(table[i] for i in ids) for ids in d["layers"]), int(d["vision_hidden_size"]))
