"""Everything jenga knows about the differences between the vLLM versions it supports.

The rest of :mod:`jenga.vllm` asks this module instead of testing versions itself.

* 0.32 -> 0.33: ``get_kv_cache_configs`` moved to ``kv_cache_planning`` and takes the
  global KV-cache groups as a fourth argument (jenga's plugin wraps it with ``*args``);
  the scheduler calls ``get_computed_blocks(request, max_cache_hit_length)``.
* 0.33 -> 0.34: ``Request.skip_reading_prefix_cache`` became ``prefix_cache_hit_limit``
  with ``Request.get_max_cache_hit_length(bound)`` (a prompt-logprob request gets a bounded
  hit); opt-in cache-aware admission calls ``get_num_cached_tokens`` (read only; jenga's own
  cached-prefix-first order steps aside for it, ``cache_aware_admission``); the "extensible KV
  cache" (on by default on CUDA) resizes the KV tensors after warm-up, i.e. after jenga's
  layout, so the plugin turns it off when jenga's scheduler is selected.
"""

from __future__ import annotations

import logging

import vllm
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from jenga.vllm.specs import UnsupportedInVllm

#: the vLLM versions jenga runs inside (pyproject's ``vllm-cuda`` extra declares the same range)
SUPPORTED = SpecifierSet(">=0.32.0,<0.35")
INSTALLED = Version(vllm.__version__)
#: (major, minor) of the installed vLLM
MINOR = INSTALLED.release[:2]

logger = logging.getLogger("jenga.vllm")

#: what vLLM's scheduler / engine core use of its manager that jenga's adapter does not
#: provide, with why those paths never run with jenga's scheduler (all refused at engine start, or
#: never taken with jenga's host-tier connector: it reports no external tokens, loads nothing
#: asynchronously and is a KV producer only)
NOT_PROVIDED = {
    "get_computed_blocks_for_connector": "KV connectors",
    "truncate_computed_blocks": "KV connectors",
    "pop_blocks_for_free": "KV connectors (deferred frees of a KV consumer)",
    "evict_blocks": "KV connectors (failed KV loads)",
    "record_blocks_for_zeroing": "KV connectors (failed KV loads)",
    "coordinator.get_num_blocks_to_allocate": "KV connectors (parked async KV loads)",
    "empty_kv_cache_blocks.blocks": "KV connectors (parked async KV loads)",
}


def check_version() -> None:
    """Raise ``UnsupportedInVllm`` at engine start when the installed vLLM is outside :data:`SUPPORTED`."""
    if INSTALLED not in SUPPORTED:
        raise UnsupportedInVllm(f"jenga.vllm supports vLLM {SUPPORTED} (0.32, 0.33, 0.34); vLLM {INSTALLED} is "
                                "installed: install a supported vLLM or run without scheduler_cls="
                                "'jenga.vllm.JengaScheduler'")


def reads_prefix_cache(request) -> bool:
    """Whether ``request`` may read from the prefix cache at all."""
    if MINOR >= (0, 34):
        return request.prefix_cache_hit_limit != 0
    return not request.skip_reading_prefix_cache


def max_cache_hit_length(request, bound: int | None = None) -> int:
    """The longest prefix hit ``request`` may take (never its last token), tightened by ``bound``."""
    if MINOR >= (0, 34):
        return request.get_max_cache_hit_length(bound)
    if request.skip_reading_prefix_cache:
        return 0
    top = request.num_tokens - 1
    return top if bound is None else min(top, bound)


def refusals(vllm_config) -> list[tuple[bool, str]]:
    """Features of some versions jenga's scheduler refuses at engine start: (present, what)."""
    return [
        (getattr(vllm_config.cache_config, "enable_extensible_kv_cache", False) is True,
         "the extensible KV cache (it resizes the KV tensors after jenga's layout); the jenga plugin turns it "
         "off in the engine core"),
    ]


def cache_aware_admission(vllm_config) -> bool:
    """Whether vLLM orders its waiting queue by cached prefix itself (0.34's opt-in
    ``cache_aware_admission_window``, through the adapter's ``get_num_cached_tokens``)."""
    return getattr(vllm_config.scheduler_config, "cache_aware_admission_window", 0) > 0


EXTENSIBLE_OFF = ("jenga.vllm.JengaScheduler lays out the KV cache before warm-up (page-layer rewrite); the "
                  "extensible KV cache would resize it afterwards")


def turn_off_extensible_kv_cache(uses_jenga) -> None:
    """vLLM >= 0.34: when ``uses_jenga(vllm_config)``, the engine core's question "why can the
    extensible KV cache not be used?" gets jenga's reason, so vLLM turns it off in the engine
    core and on every worker (vLLM logs "Disabling the extensible KV cache: <reason>")."""
    if MINOR < (0, 34):
        return
    from vllm.v1.executor.abstract import Executor

    original = Executor.extensible_kv_cache_unsupported_reason
    if getattr(original, "_jenga_wrapped", False):
        return

    def extensible_kv_cache_unsupported_reason(self, kv_cache_specs):
        if uses_jenga(self.vllm_config):
            logger.info("jenga.vllm: turning vLLM's extensible KV cache off: %s", EXTENSIBLE_OFF)
            return EXTENSIBLE_OFF
        return original(self, kv_cache_specs)

    extensible_kv_cache_unsupported_reason._jenga_wrapped = True
    Executor.extensible_kv_cache_unsupported_reason = extensible_kv_cache_unsupported_reason


def kv_cache_configs(vllm_config, kv_cache_specs: list[dict], available_memory: list[int]) -> list:
    """vLLM's ``get_kv_cache_configs`` for these specs and budgets, as the engine core calls it
    (benchmarks and tests that plan a KV cache without an engine)."""
    if MINOR < (0, 33):
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

        return get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory)
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    groups = get_global_kv_cache_groups(vllm_config, kv_cache_specs)
    return get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, groups)
