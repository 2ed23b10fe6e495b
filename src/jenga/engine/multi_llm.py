"""Several models, one KV pool: ``MultiLLM([model, ...], kv_memory=...).generate(prompts)``.

Each model has its own weights, tokenizer, model runner and scheduler (a
:class:`~jenga.engine.model_lane.ModelLane`); their caches live in ONE
:class:`~jenga.core.manager.multi_model.MultiModelManager` pool, one LCM large page over every
model's groups, so the memory one model frees is the memory another takes (no static split).
Per-model floors keep a flood at one model from starving another; prefix caches and eviction
stay per model.  A step runs one step of every lane with work (lanes take turns going first, so
neither always finds the pool before the other).

Prompts name their model: ``{"model": name, "prompt": ...}`` (or ``"prompt_token_ids"``), or
pass ``models=[name, ...]`` beside plain prompts.  Names are the model arguments as given (a tiny
name or a directory) unless ``names`` says otherwise.  Errors at start (typed, before any model
is built): the same model twice, a budget that cannot hold every floor, an LCM page past the bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path

from jenga.engine.devices import checked_device
from jenga.engine.llm import TORCH_DTYPES, _resolve_model
from jenga.engine.model_lane import ModelLane
from jenga.engine.outputs import RequestOutput
from jenga.errors import DuplicateRequestError, InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.sequence import Sequence as Seq
from jenga.units import parse_bytes


def _per_model(value, names: list[str], label: str) -> dict:
    """A per-model setting: one value for every model, or a mapping by name (models left out: absent)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise InvalidArgumentError(f"{label} names {unknown[0]!r}, not a served model ({', '.join(names)})")
        return dict(value)
    return dict.fromkeys(names, value)


class MultiLLM:
    """An offline engine over several models sharing one jenga KV pool (module doc).

    ``kv_memory``: the one budget; ``floors``: bytes reserved per model (one value or a mapping by
    name; default what a request of ``max_model_len`` tokens needs at its peak); ``max_model_len``:
    the longest request (prompt + output) per model (one value or a mapping; default the model's
    own).  ``seed`` seeds every model's random weights (tiny names, ``random_weights``) and the
    sampling RNGs, as ``LLM(model, seed=seed)`` would.  The other arguments are ``LLM``'s.
    """

    def __init__(self, models: Iterable[str | Path], *, kv_memory: str | int = "64MiB",
                 floors: Mapping[str, int | str] | int | str | None = None,
                 max_model_len: Mapping[str, int] | int | None = None, names: Iterable[str] | None = None,
                 tokens_per_page: int = 16, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 enable_prefix_caching: bool = True, random_weights: bool = False, seed: int = 0,
                 dtype: str = "fp32", device: str = "cpu", track_kv_stats: bool = False,
                 manager_kwargs: dict | None = None):
        from jenga.core.manager.multi_model import MultiModelManager, check_models
        from jenga.core.specs import ModelSpec

        if isinstance(models, (str, Path)):
            models = [models]
        models = list(models)
        names = [str(n) for n in (models if names is None else names)]
        if len(names) != len(models):
            raise InvalidArgumentError(f"{len(names)} names for {len(models)} models")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidArgumentError(f"model {dup[0]!r} is named twice; serve each model once (models: {names})")
        if not models:
            raise InvalidArgumentError("MultiLLM needs at least one model")
        if dtype not in TORCH_DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
        self.device = checked_device(device)
        self.dtype = dtype
        resolved, specs = [], []
        for name, model in zip(names, models, strict=True):
            r = _resolve_model(model, random_weights, seed, TORCH_DTYPES[dtype], self.device)
            if getattr(r[1], "multimodal", False):
                raise InvalidArgumentError(f"model {name!r} is a vision-language model; several models in one "
                                           "pool serve text models only")
            resolved.append(r)
            specs.append(ModelSpec.from_hf_config(r[2], dtype=dtype, tokens_per_page=tokens_per_page, vision=False,
                                                  name=name))
        check_models(specs)
        self.manager = MultiModelManager(specs, parse_bytes(kv_memory), floors=_per_model(floors, names, "floors"),
                                         max_model_lens=_per_model(max_model_len, names, "max_model_len"),
                                         tokens_per_page=tokens_per_page, enable_prefix_caching=enable_prefix_caching,
                                         device=str(self.device), **(manager_kwargs or {}))
        ids = itertools.count()
        self.lanes: dict[str, ModelLane] = {}
        for name, model, r, spec in zip(names, models, resolved, specs, strict=True):
            self.lanes[name] = ModelLane(name, model, r, self.manager, max_model_len=self.manager.model_lens[name],
                                         model_max_len=spec.max_model_len, dtype=dtype, device=self.device, seed=seed,
                                         max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                         track_kv_stats=track_kv_stats, ids=ids)
        self._turn = 0

    @property
    def model_names(self) -> list[str]:
        return list(self.lanes)

    def lane(self, model: str) -> ModelLane:
        """The lane of a served model; ``InvalidArgumentError`` naming the served models otherwise."""
        lane = self.lanes.get(model)
        if lane is None:
            raise InvalidArgumentError(f"unknown model {model!r}; served models: {', '.join(self.lanes)}")
        return lane

    # ------------------------------------------------------------------ online
    def add_request(self, model: str, prompt, params: SamplingParams | None = None, *, request_id: object = None,
                    cache_salt: str | None = None) -> Seq:
        """Queue one prompt for ``model`` (``LLM.add_request``); request ids are unique across models."""
        lane = self.lane(model)
        if request_id is not None and any(request_id in other._live for other in self.lanes.values()):
            raise DuplicateRequestError(f"request id {request_id!r} is already live")
        return lane.add_request(prompt, params, request_id=request_id, cache_salt=cache_salt)

    def abort(self, request_id: object) -> bool:
        """End a live request of any model now (``LLM.abort``); False when it is not live."""
        return any(lane.abort(request_id) for lane in self.lanes.values())

    @property
    def has_unfinished(self) -> bool:
        return any(lane.has_unfinished for lane in self.lanes.values())

    def step(self) -> list[Seq]:
        """One step of every lane with work (a turn order that rotates); the requests that finished."""
        lanes = list(self.lanes.values())
        self._turn = (self._turn + 1) % len(lanes)
        finished: list[Seq] = []
        for lane in lanes[self._turn:] + lanes[:self._turn]:
            if lane.has_unfinished:
                for other in lanes:  # each admission knows who else waits (the pool's fair share)
                    self.manager.note_waiting(other.name, len(other.scheduler.waiting))
                finished.extend(lane.step())
        return finished

    # ----------------------------------------------------------------- offline
    def generate(self, prompts, sampling_params: SamplingParams | Iterable[SamplingParams] | None = None, *,
                 models: Iterable[str] | None = None) -> list[RequestOutput]:
        """Run ``prompts`` to completion; each names its model (``{"model": ..., "prompt": ...}``) or
        ``models`` gives one name per prompt.  One :class:`RequestOutput` per prompt, in order."""
        if prompts is None or isinstance(prompts, (str, bytes, int)) or (isinstance(prompts, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        names = [None] * len(prompts) if models is None else list(models)
        if len(names) != len(prompts):
            raise InvalidArgumentError(f"{len(names)} models for {len(prompts)} prompts")
        items = []
        for p, name in zip(prompts, names, strict=True):
            if isinstance(p, dict) and "model" in p:
                name = name or p["model"]
                p = {k: v for k, v in p.items() if k != "model"}
            if name is None:
                raise InvalidArgumentError(f"prompt {p!r} names no model; served models: {', '.join(self.lanes)}")
            self.lane(name)
            items.append((name, p))
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise InvalidArgumentError(f"{len(params)} sampling params for {len(items)} prompts")
        seqs: list[Seq] = []
        try:
            for (name, p), sp in zip(items, params, strict=True):
                seqs.append(self.add_request(name, p, sp or SamplingParams()))
            while self.has_unfinished:
                self.step()
        except BaseException:
            for s in seqs:
                self.abort(s.request_id)
            raise
        return [RequestOutput(s.request_id, s.prompt, s.prompt_token_ids, list(s.output_token_ids), s.text,
                              s.finish_reason, s.stop_reason, s.num_preemptions, s.prefix_hit_tokens, s.logits)
                for s in seqs]
