"""``ModelLane``: one model of a multi-model engine, an :class:`~jenga.engine.llm.LLM` over a shared pool.

A lane has what a single-model ``LLM`` has (its weights, tokenizer, model runner, scheduler,
metrics and request limits) except the KV-cache manager: its scheduler and runner use the pool of
a :class:`~jenga.core.manager.multi_model.MultiModelManager` through :class:`LaneManager`, the
manager as seen by one model (every ``add_request`` names the lane's model).  Its
``add_request`` / ``step`` / ``abort`` are ``LLM``'s, so a lane behaves exactly like that model
served alone, except for the memory it finds free.  Built by :class:`jenga.engine.multi_llm.MultiLLM`.
"""

from __future__ import annotations

import itertools

import torch

from jenga.engine.llm import LLM
from jenga.engine.metrics import EngineMetrics
from jenga.engine.model_runner import ModelRunner
from jenga.engine.processor_prompts import ProcessorPrompts
from jenga.engine.request_limits import RequestLimits
from jenga.sched.scheduler import Scheduler


class LaneManager:
    """The shared manager as one model's scheduler sees it: ``add_request`` names the model,
    everything else is the shared manager's."""

    def __init__(self, manager, model: str):
        self._mgr, self.model_name = manager, model

    def add_request(self, request_id, prompt_token_ids, **kwargs) -> None:
        self._mgr.add_request(request_id, prompt_token_ids, model=self.model_name, **kwargs)

    def __getattr__(self, name):
        return getattr(self._mgr, name)


class ModelLane(LLM):
    """One served model (``name``) of a shared pool (``manager``).  ``resolved`` is what
    ``jenga.engine.llm._resolve_model`` returned for it; ``max_model_len`` its longest admitted request
    (prompt + output, what its floor holds), ``model_max_len`` the model's own maximum; ``ids``: the engine's request-id counter, shared by every lane."""

    def __init__(self, name: str, source, resolved: tuple, manager, *, max_model_len: int, model_max_len: int,
                 dtype: str, device: torch.device, seed: int, max_num_seqs: int, max_num_batched_tokens: int,
                 track_kv_stats: bool, ids: itertools.count):
        config, net, _, tok, gen = resolved
        self.name = name
        self.device, self.dtype = device, dtype
        self.config, self.model = config, net.eval()
        self.generation_defaults = gen
        self.tokenizer = tok
        self.processor_prompts = ProcessorPrompts(None, self.model)
        self.shared_manager = manager
        self.manager = LaneManager(manager, name)
        self.spec = manager.model
        self.kv_memory = manager.memory_bytes
        self.host_pool = None
        self.runner = ModelRunner(self.model, manager, device=device, model_name=name)
        eos = tuple(tok.eos_token_ids) if tok else ()
        cfg_eos = getattr(self.model.config, "eos_token_id", None)
        eos += ((cfg_eos,) if isinstance(cfg_eos, int) else tuple(cfg_eos or ())) + gen.eos_token_ids
        self.scheduler = Scheduler(self.manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   max_model_len=model_max_len, eos_token_ids=eos)
        self.speculative = None
        kv_len = max_model_len if max_model_len < model_max_len else None
        self.limits = RequestLimits(model_max_len, kv_len)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.track_kv_stats = track_kv_stats
        self.metrics = EngineMetrics()
        self._encoder_runs0 = 0
        self._ids = ids
        self._live = {}
