"""The ``vllm.general_plugins`` entry point: installs jenga's KV-cache layout.

vLLM runs ``register()`` in every process (engine core and workers).  It wraps
``vllm.v1.engine.core.get_kv_cache_configs`` so that, when the engine's scheduler is
jenga's, the configs sent to the workers (and the scheduler's own) carry jenga's
page-layer layout and plan (see :mod:`jenga.vllm.plan`; one plan over every worker's layers,
so pipeline stages holding different layers get the same block ids).  On vLLM 0.34 it also turns the
extensible KV cache off for such engines (:func:`jenga.vllm.compat.turn_off_extensible_kv_cache`),
registers jenga's ``/metrics`` collector (:mod:`jenga.vllm.metrics`), and registers jenga's KV
connector, which vLLM's ``kv_offloading_size`` selects for jenga's scheduler (its host tier,
:mod:`jenga.vllm.offloading`; the host buffer's layout travels on each config as ``jenga_host``).
Engines with vLLM's own scheduler are left untouched.
"""

from __future__ import annotations

import functools

_MARK = "_jenga_wrapped"


def uses_jenga(vllm_config) -> bool:
    cls = vllm_config.scheduler_config.scheduler_cls
    if isinstance(cls, str):
        return cls.startswith("jenga.vllm")
    from jenga.vllm.scheduler import JengaScheduler

    return isinstance(cls, type) and issubclass(cls, JengaScheduler)


def register() -> None:
    import vllm.v1.engine.core as core

    from jenga.vllm.compat import turn_off_extensible_kv_cache
    from jenga.vllm.metrics import register_collector
    from jenga.vllm.offloading import install

    turn_off_extensible_kv_cache(uses_jenga)
    install()  # kv_offloading_size -> jenga's host tier (connector registered with vLLM's factory)
    register_collector()  # jenga's gauges on /metrics, read from the engine cores' snapshots
    original = core.get_kv_cache_configs
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def get_kv_cache_configs(vllm_config, *args, **kwargs):
        # (vllm_config, specs, memory) on 0.32; 0.33 added the global KV-cache groups
        configs = original(vllm_config, *args, **kwargs)
        if not uses_jenga(vllm_config):
            return configs
        from jenga.vllm.offloading import attach_host_layout
        from jenga.vllm.plan import rewrite_configs
        from jenga.vllm.scheduler import refuse_unsupported

        refuse_unsupported(vllm_config)
        max_len = vllm_config.model_config.max_model_len
        cache = vllm_config.cache_config
        hash_block = getattr(cache, "prefix_match_unit", None) if cache.enable_prefix_caching else None
        # one plan for all workers: with pipeline parallelism each stage's config holds its own layers
        return attach_host_layout(vllm_config, rewrite_configs(configs, max_len, hash_block))

    setattr(get_kv_cache_configs, _MARK, True)
    core.get_kv_cache_configs = get_kv_cache_configs
