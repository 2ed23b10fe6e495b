"""Hugging Face ``config.json`` -> :class:`~jenga.core.specs.ModelSpec` (layer groups).

Contract of :func:`model_spec_from_hf_config`:

* The source is a catalog name (``jenga/catalog/<name>.json``, see :data:`CATALOG_NAMES`), a local
  directory holding ``config.json``, a path to a json file, a dict, or a transformers config object;
  nothing touches the hub.
* Any decoder or VLM config transformers can load works: per-layer cache kinds come from transformers'
  own ``DynamicCache(config=...)``, attention sizes from the config's fields, recurrent-state sizes from the
  model's modules built on the ``meta`` device (see :mod:`~jenga.structure.derive`).  Family code only where
  transformers cannot tell (:mod:`~jenga.structure.quirks`).  What cannot be understood raises
  :class:`UnsupportedModelError` (a ``JengaError``) naming the missing fact.
* Catalog names are planned from the stored structure of :mod:`~jenga.structure.catalog` (no transformers
  import), checked against transformers by the tests.
* Every decoder layer maps to zero, one or two cache specs (Falcon-H1 layers keep attention KV *and* a
  Mamba-2 state; Nemotron-H MLP/MoE layers keep nothing); grouping and names: :mod:`~jenga.structure.groups`.
* Gemma-3 (multimodal ``gemma3`` configs) gets one extra ``vision`` group caching the projected image
  embeddings (``hidden_size`` of the text model per image token), at layer index ``num_layers``.  Pass
  ``vision=False`` to leave it out.
* Tensor parallelism ``tp`` gives the per-rank shapes; an indivisible size raises ``InvalidArgumentError``.
* Conv states use ``dtype``; SSM states use ``mamba_ssm_dtype`` when given, else ``dtype``.  Dtype fields in
  the config itself (e.g. Nemotron-H's ``mamba_ssm_cache_dtype``) are ignored: the cache dtype is the
  caller's choice.
* ``max_model_len`` = text ``max_position_embeddings``; ``num_layers`` = decoder layers; ``hf_config`` = the
  raw dict as read (before transformers' defaults).

Catalog values come from ``shared/reference/models.md``; fields marked "unverified" there (e.g. the
Falcon-H1-7B sizes, Llama-3.2-90B-Vision) are best-known values, not checked against a real config.json.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jenga.core.specs import ModelSpec, dtype_bytes
from jenga.errors import InvalidArgumentError
from jenga.structure.facts import ModelFacts
from jenga.structure.groups import Options, entries, group_entries
from jenga.structure.source import (
    CATALOG_NAMES,
    UnsupportedModelError,
    list_catalog,
    parse_config,
    read_source,
)

__all__ = ["CATALOG_NAMES", "UnsupportedModelError", "list_catalog", "model_facts", "model_spec_from_hf_config"]

_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                  "float": "fp32", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def _norm_dtype(dtype: Any) -> str:
    s = str(dtype).removeprefix("torch.")
    s = _DTYPE_ALIASES.get(s, s)
    dtype_bytes(s)  # raises ValueError naming the choices
    return s


def model_facts(source: str | os.PathLike | Mapping[str, Any]) -> tuple[ModelFacts, dict, str]:
    """``(facts, raw config dict, default model name)`` of ``source``."""
    src = read_source(source)
    if src.catalog is not None:
        from jenga.structure.catalog import catalog_facts

        return catalog_facts(src.catalog), src.raw, src.name
    from jenga.structure.derive import facts_from_config

    return facts_from_config(parse_config(src), src.where), src.raw, src.name


def model_spec_from_hf_config(source: str | os.PathLike | Mapping[str, Any], *, dtype: str = "bf16",
                              tokens_per_page: int = 16, mamba_checkpoint_interval: int = 512, tp: int = 1,
                              name: str | None = None, mamba_ssm_dtype: str | None = None,
                              split_mamba_state: bool = False, vision: bool = True) -> ModelSpec:
    """Build the layer-group :class:`ModelSpec` of a Hugging Face model config (see module docstring).

    ``source``: catalog name, directory with ``config.json``, json file path, config dict or transformers config.
    ``dtype``: KV / embedding / conv-state dtype (``bf16``, ``fp16``, ``fp32``, ``fp8``, or torch names).
    ``mamba_ssm_dtype``: SSM-state dtype (default ``dtype``).  ``split_mamba_state``: conv and SSM states
    as separate groups (the paper's Jamba 84x example).  ``vision``: add Gemma-3's vision-embedding group.
    Raises ``UnsupportedModelError`` for unknown names and configs it cannot understand, and
    ``InvalidArgumentError`` / ``ValueError`` for bad arguments (non-positive sizes, sizes not divisible by ``tp``).
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InvalidArgumentError(f"tp must be a positive int, got {tp!r}")
    if isinstance(tokens_per_page, bool) or not isinstance(tokens_per_page, int) or tokens_per_page < 1:
        raise InvalidArgumentError(f"tokens_per_page must be a positive int, got {tokens_per_page!r}")
    opts_dtype = _norm_dtype(dtype)
    ssm_dtype = _norm_dtype(mamba_ssm_dtype) if mamba_ssm_dtype is not None else opts_dtype
    facts, raw, default_name = model_facts(source)
    model_name = name or default_name
    opts = Options(model_name, opts_dtype, ssm_dtype, tp, mamba_checkpoint_interval, split_mamba_state, vision)
    return ModelSpec(model_name, group_entries(entries(facts, opts), tokens_per_page),
                     max_model_len=facts.max_model_len, num_layers=facts.num_layers, hf_config=raw)
