"""Baseline managers behind the same API as ``KVCacheManager``, chosen by name."""

from __future__ import annotations

import importlib

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import ModelSpec
from jenga.errors import InvalidArgumentError

#: manager name -> (module, class); the baselines are imported when asked for
MANAGERS = {
    "jenga": ("jenga.core.manager.manager", "KVCacheManager"),
    "paged": ("jenga.baselines.paged", "PagedManager"),
    "static": ("jenga.baselines.static", "StaticManager"),
    "uniform": ("jenga.baselines.uniform", "UniformManager"),
    "uniform-0.32": ("jenga.baselines.uniform", "Uniform032Manager"),
}
MANAGER_NAMES = tuple(MANAGERS)


def make_manager(name: str, model: ModelSpec, memory_bytes: int, **kwargs) -> KVCacheManager:
    """A manager by name: ``jenga`` | ``paged`` (vLLM v0 max page) | ``static`` (fixed
    per-group shares) | ``uniform`` (vLLM v1 hybrid allocator, 0.34's rules; ``settings=``
    a ``UniformSettings``) | ``uniform-0.32`` (the same with 0.32's rules).  Keyword arguments
    are those of ``KVCacheManager``."""
    if name not in MANAGERS:
        raise InvalidArgumentError(f"unknown manager {name!r}; choose one of {', '.join(MANAGER_NAMES)}")
    module, cls = MANAGERS[name]
    return getattr(importlib.import_module(module), cls)(model, memory_bytes, **kwargs)
