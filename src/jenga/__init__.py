"""jenga: KV-cache memory management for LLMs with heterogeneous layers (SOSP 2025).

``jenga.LLM`` and ``jenga.SamplingParams`` (the offline engine) are loaded lazily, so
``import jenga`` does not import torch.
"""

from __future__ import annotations

__all__ = ["LLM", "KVCacheManager", "ModelSpec", "MultiLLM", "RequestOutput", "SamplingParams", "make_manager"]

_LAZY = {
    "KVCacheManager": ("jenga.core.manager.manager", "KVCacheManager"),
    "ModelSpec": ("jenga.core.specs", "ModelSpec"),
    "make_manager": ("jenga.baselines", "make_manager"),
    "LLM": ("jenga.engine.llm", "LLM"),
    "MultiLLM": ("jenga.engine.multi_llm", "MultiLLM"),
    "SamplingParams": ("jenga.sched.sampling_params", "SamplingParams"),
    "RequestOutput": ("jenga.engine.outputs", "RequestOutput"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jenga' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
