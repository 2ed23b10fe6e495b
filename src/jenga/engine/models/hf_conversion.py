"""Checkpoint tensors under transformers' in-memory names, converted as ``from_pretrained`` converts them.

transformers 5 saves some weights in a layout other than the one its modules hold (Jamba's and
Qwen3-Next's experts one by one, ``experts.N.gate_proj.weight``, fused in memory into
``experts.gate_up_proj``; Nemotron-H's ``backbone.`` prefix; pre-v5 multimodal prefixes ...) and
converts them when it loads.  :func:`converted_tensors` applies that same conversion: the list of
weight transforms transformers builds for the checkpoint's own HF class
(``conversion_mapping.get_model_conversion_mapping`` on that class built on the meta device), each
key renamed by ``core_model_loading.rename_source_key`` and the tensors a converter gathers (all
experts of a layer, across shards) merged by that converter's own operations.  The engine's model
classes use HF's in-memory names, so what comes out loads by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from copy import deepcopy
from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open


def reference_model(config):
    """transformers' own class for ``config`` (``architectures[0]``, else the causal-LM auto class),
    built on the meta device (no memory); None when transformers cannot build it."""
    import transformers

    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    try:
        with torch.device("meta"):
            if cls is not None and hasattr(cls, "_from_config"):
                return cls._from_config(config)
            return transformers.AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError, AssertionError, AttributeError, KeyError, ImportError, RuntimeError):
        return None  # e.g. an unknown model type, or a config transformers' class rejects


def weight_transforms(config, ref) -> list:
    """The transforms ``from_pretrained`` applies to ``ref``'s checkpoints (by ``model_type`` when
    ``ref`` is None)."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping,
        get_model_conversion_mapping,
    )

    if ref is not None:
        return get_model_conversion_mapping(ref)
    own = get_checkpoint_conversion_mapping(getattr(config, "model_type", None)) or []
    return own + (get_checkpoint_conversion_mapping("legacy") or [])


def converted_tensors(files: list[Path], config) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF in-memory name, tensor)`` for the checkpoint ``files`` of ``config``'s model.

    Renamed tensors stream one at a time; a converter's sources are read when all of them are
    known (after the last shard) and merged then, one target at a time.
    """
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    ref = reference_model(config)
    transforms = weight_transforms(config, ref)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    meta = ref.state_dict() if ref is not None else None
    prefix = ref.base_model_prefix if ref is not None else None
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in files:
            f = stack.enter_context(safe_open(str(file), framework="pt"))
            handles.update({name: f for name in f.keys()})
        pending: dict = {}
        for key in sorted(handles, key=dot_natural_key):
            renamed, pattern = rename_source_key(key, renamings, converters, prefix, meta)
            if meta is not None and renamed not in meta and key in meta:  # as from_pretrained: keep the name
                renamed, pattern = key, None
            if pattern is None:
                yield renamed, handles[key].get_tensor(key)
                continue
            converter = pending.setdefault(renamed, deepcopy(by_pattern[pattern]))
            converter.add_tensor(renamed, key, pattern, partial(handles[key].get_tensor, key))
        for first, converter in pending.items():
            for name, value in converter.convert(first, model=ref, config=config).items():
                yield name, value[0] if isinstance(value, list) else value
