"""Baseline managers behind the same API as ``KVCacheManager``, chosen by name."""

from __future__ import annotations

from jenga.core.manager.manager import KVCacheManager
from jenga.core.specs import ModelSpec
from jenga.errors import InvalidArgumentError

MANAGER_NAMES = ("jenga", "paged", "static", "uniform")


def make_manager(name: str, model: ModelSpec, memory_bytes: int, **kwargs) -> KVCacheManager:
    """A manager by name: ``jenga`` | ``paged`` (vLLM v0 max page) | ``static`` (fixed
    per-group shares) | ``uniform`` (vLLM v1 hybrid allocator).  Keyword arguments are
    those of ``KVCacheManager``."""
    if name == "jenga":
        return KVCacheManager(model, memory_bytes, **kwargs)
    if name == "paged":
        from jenga.baselines.paged import PagedManager
        return PagedManager(model, memory_bytes, **kwargs)
    if name == "static":
        from jenga.baselines.static import StaticManager
        return StaticManager(model, memory_bytes, **kwargs)
    if name == "uniform":
        from jenga.baselines.uniform import UniformManager
        return UniformManager(model, memory_bytes, **kwargs)
    raise InvalidArgumentError(f"unknown manager {name!r}; choose one of {', '.join(MANAGER_NAMES)}")
