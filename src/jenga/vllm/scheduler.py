"""``JengaScheduler``: vLLM's scheduler with jenga as its KV-cache manager.

``vllm.LLM(..., scheduler_cls="jenga.vllm.JengaScheduler")`` (or ``--scheduler-cls`` on
the OpenAI server) is all a user adds.  With async scheduling on, the same name builds
:class:`JengaAsyncScheduler` (vLLM's ``AsyncScheduler`` underneath), so async stays on.
vLLM features jenga does not cover are refused here, at engine start, by name.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from jenga.vllm.adapter import JengaKVCacheAdapter
from jenga.vllm.plan import layout_name, uniform_plan
from jenga.vllm.specs import UnsupportedInVllm


def refuse_unsupported(vllm_config) -> None:
    """Raise ``UnsupportedInVllm`` naming the first vLLM feature jenga cannot serve."""
    checks = [
        (vllm_config.kv_transfer_config is not None,
         "KV connectors (offloading, disaggregated prefill, LMCache/NIXL transfers)"),
        (vllm_config.speculative_config is not None, "speculative decoding"),
        (vllm_config.lora_config is not None, "LoRA adapters"),
        (vllm_config.model_config.is_multimodal_model, "multimodal models (images are not part of jenga's "
                                                       "hashes inside vLLM yet)"),
        (vllm_config.model_config.is_encoder_decoder, "encoder-decoder models"),
        (vllm_config.parallel_config.pipeline_parallel_size > 1, "pipeline parallelism"),
        (vllm_config.parallel_config.decode_context_parallel_size > 1, "decode context parallelism"),
        (vllm_config.scheduler_config.watermark > 0, "a KV-cache watermark"),
    ]
    for bad, what in checks:
        if bad:
            raise UnsupportedInVllm(f"jenga.vllm does not support {what}; run without scheduler_cls="
                                    "'jenga.vllm.JengaScheduler' for it")


class JengaScheduler(Scheduler):
    """vLLM's ``Scheduler`` whose ``kv_cache_manager`` is a jenga adapter."""

    def __new__(cls, vllm_config, *args, **kwargs):
        if cls is JengaScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = JengaAsyncScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs):
        refuse_unsupported(vllm_config)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        plan = getattr(kv_cache_config, "jenga_plan", None)
        if plan is None:
            if layout_name() != "uniform":
                raise UnsupportedInVllm(
                    "jenga.vllm: the KV-cache config has no jenga page-layer plan: the jenga vLLM plugin "
                    "(entry point 'vllm.general_plugins' -> jenga.vllm.plugin:register) did not run in the "
                    "engine core; reinstall jenga with the [vllm] extra, or set JENGA_VLLM_LAYOUT=uniform")
            plan = uniform_plan(kv_cache_config, self.max_model_len)
        self.kv_cache_manager = JengaKVCacheAdapter(
            plan, kv_cache_config, max_model_len=self.max_model_len, enable_caching=self.cache_config.enable_prefix_caching,
            log_stats=self.log_stats, enable_kv_cache_events=self.enable_kv_cache_events)
        self.num_preemptions = 0

    def _preempt_request(self, request, *args, **kwargs) -> None:
        self.num_preemptions += 1  # counted for tests and benchmarks; jenga frees the pages in free()
        super()._preempt_request(request, *args, **kwargs)

    @property
    def jenga(self):
        """The jenga ``KVCacheManager`` deciding this scheduler's pages."""
        return self.kv_cache_manager.manager


class JengaAsyncScheduler(JengaScheduler, AsyncScheduler):
    """Async scheduling (tokens scheduled before their ids are sampled) with jenga."""
