"""jenga inside vLLM: ``vllm.LLM(..., scheduler_cls="jenga.vllm.JengaScheduler")``.

A leaf package (nothing in jenga imports it); it needs the ``jenga[vllm]`` extra.
"""

from jenga.vllm.scheduler import JengaAsyncScheduler, JengaScheduler

__all__ = ["JengaAsyncScheduler", "JengaScheduler"]
