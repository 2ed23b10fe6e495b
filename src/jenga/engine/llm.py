"""Offline inference API: ``LLM(model, **engine_args).generate(prompts, SamplingParams(...))``.

``model`` is a local Hugging Face directory (``config.json`` + safetensors + tokenizer files)
or a built-in tiny name (``tiny-gemma3``, ``tiny-llama`` ... see :mod:`jenga.engine.tiny`),
which always has random weights and an offline-trained byte-level tokenizer.  A directory
with ``random_weights=True`` keeps its architecture and tokenizer but skips the checkpoint.

The engine loop per step: :class:`~jenga.sched.scheduler.Scheduler` plans (continuous
batching, chunked prefill, prefix reuse, preemption by recompute) -> :class:`ModelRunner`
writes K/V into the manager's buffer and returns logits -> :func:`sample` -> the scheduler
commits tokens to the manager and finishes requests.  The KV-cache manager is chosen by name
(``manager="jenga" | "paged" | ...``, see :func:`jenga.baselines.make_manager`).

Online use (the server's loop thread; an ``LLM`` is not thread-safe, one thread drives it):
``add_request(prompt, params, request_id=..., cache_salt=...)`` returns the request's live
:class:`~jenga.sched.sequence.Sequence` (its ``output_token_ids`` grow step by step),
``step()`` runs one step, ``abort(request_id)`` ends a request now and frees its pages.

Failures: a step that raises (a failing forward, a ``KeyboardInterrupt``, a request that can
never fit) aborts the requests it had scheduled -- their uncommitted allocation cannot be
undone, so they are freed (finish reason ``"abort"``), the last scheduled first -- and re-raises; every other request
is untouched and the engine stays usable.  ``generate`` aborts all of its own requests still
live when it is interrupted.  A directory's ``generation_config.json`` adds its EOS ids and
default sampling values (:mod:`jenga.engine.generation_config`); a directory without
tokenizer files takes token-id prompts only (text raises :class:`InvalidArgumentError`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from jenga.core.validation import checked_token_ids
from jenga.engine.cross_attention import CrossAttentionKV
from jenga.engine.devices import checked_device
from jenga.engine.generation_config import GenerationDefaults, load_generation_defaults
from jenga.engine.host_pool import HostKVPool
from jenga.engine.metrics import EngineMetrics
from jenga.engine.model_runner import ModelRunner
from jenga.engine.multimodal import attach_images
from jenga.engine.outputs import RequestOutput
from jenga.engine.processor_prompts import ProcessorPrompts
from jenga.engine.request_limits import RequestLimits
from jenga.engine.sampler import make_generator, sample
from jenga.engine.tiny import engine_name_hint, init_random_weights, is_tiny, tiny_hf_config
from jenga.engine.tokenizer import TextTokenizer, load_tokenizer, tiny_tokenizer
from jenga.engine.vision_cache import VisionEmbeddings
from jenga.errors import DuplicateRequestError, InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.scheduler import Scheduler
from jenga.sched.sequence import Sequence as Seq
from jenga.units import parse_bytes

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _resolve_model(model: str | Path, random_weights: bool, seed: int, dtype: torch.dtype, device):
    """``(hf config, paged model, spec source, tokenizer, generation defaults)`` for a directory or tiny name."""
    from jenga.engine.models.registry import build_model, text_config
    from jenga.engine.models.weights import load_config, load_weights
    from jenga.structure.source import read_source

    if is_tiny(model):
        config = tiny_hf_config(str(model))
        net = init_random_weights(build_model(config, device=device, dtype=torch.float32), seed=seed)
        return (config, net.to(dtype), config.to_dict(), tiny_tokenizer(text_config(config).vocab_size),
                GenerationDefaults())
    path = Path(model)
    if not (path / "config.json").is_file():
        from jenga.engine.tiny import TINY_MODELS

        raise InvalidArgumentError(f"model {str(model)!r} is neither a directory with config.json nor a built-in "
                                   f"tiny model ({', '.join(TINY_MODELS)}){engine_name_hint(str(model))}")
    read_source(path)  # a typed error for a config.json that is no JSON object, before the model code reads it
    config = load_config(path)
    net = build_model(config, device=device, dtype=dtype)
    if random_weights:
        init_random_weights(net, seed=seed)
    else:
        load_weights(net, path)
    eos = getattr(text_config(config), "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    gen = load_generation_defaults(path)
    return config, net, str(path), load_tokenizer(path, eos_ids + list(gen.eos_token_ids)), gen


def _resolve_draft(model, llm, random_weights: bool, seed: int, tokens_per_page: int, k: int, ckpt: dict):
    """The draft model and its cache spec (named ``draft``; ``ckpt``: the target's state checkpoint
    interval, so a prefix hit finds both models' states at the same positions) for speculative decoding."""
    from jenga.core.specs import ModelSpec
    from jenga.engine.speculative import DRAFT_NAME

    if not isinstance(k, int) or k < 1:
        raise InvalidArgumentError(f"num_speculative_tokens must be a positive int, got {k!r}")
    if getattr(llm.model, "multimodal", False):
        raise InvalidArgumentError("speculative decoding of a vision-language target is not supported")
    _, net, source, _, _ = _resolve_model(model, random_weights, seed, TORCH_DTYPES[llm.dtype], llm.device)
    if int(net.config.vocab_size) != llm.config_vocab:
        raise InvalidArgumentError(f"draft vocabulary ({net.config.vocab_size}) differs from the target's "
                                   f"({llm.config_vocab})")
    spec = ModelSpec.from_hf_config(source, dtype=llm.dtype, tokens_per_page=tokens_per_page, vision=False,
                                    name=DRAFT_NAME, **ckpt)
    return net.eval(), spec


class LLM:
    """An offline engine over one model and one KV-cache manager.

    Engine arguments: ``manager`` (name for ``make_manager``), ``kv_memory`` (bytes or a
    string such as ``"64MiB"``), ``tokens_per_page``, ``max_num_seqs``,
    ``max_num_batched_tokens`` (per-step token budget; prefills are chunked to fit),
    ``enable_prefix_caching``, ``random_weights``, ``seed`` (weights and the shared sampling
    RNG), ``dtype`` (model and KV dtype: ``fp32`` | ``bf16`` | ``fp16``), ``device``,
    ``track_kv_stats`` (sample ``manager.stats()`` every step into :attr:`metrics`),
    ``manager_kwargs`` (extra keyword arguments for the manager), ``state_checkpoint_interval``
    (tokens between the recurrent-state checkpoints of Mamba / Gated DeltaNet layers, a multiple of
    ``tokens_per_page``; default the spec's 512).  ``mm_embedding_cache``
    (VLMs: keep image embeddings in jenga's vision pages; False re-runs the encoder for every
    chunk that touches an image).  ``speculative_model`` (a draft: directory or tiny name, random
    weights seeded ``speculative_seed``, default ``seed + 1``, when ``random_weights`` or tiny) with
    ``num_speculative_tokens`` drafts per step, both caches in one jenga pool
    (:mod:`jenga.engine.speculative`).  ``host_kv_memory`` (bytes or a string; default none): a
    host-memory tier the manager demotes evicted pages to and promotes hits from; the engine runs
    each step's copies before its forward (:mod:`jenga.engine.host_pool`).
    """

    def __init__(self, model: str | Path, *, manager: str = "jenga", kv_memory: str | int = "64MiB",
                 tokens_per_page: int = 16, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 enable_prefix_caching: bool = True, random_weights: bool = False, seed: int = 0,
                 dtype: str = "fp32", device: str | torch.device = "cpu", track_kv_stats: bool = False,
                 manager_kwargs: dict | None = None, tokenizer: TextTokenizer | None = None,
                 state_checkpoint_interval: int | None = None, mm_embedding_cache: bool = True,
                 speculative_model: str | Path | None = None, num_speculative_tokens: int = 3,
                 speculative_seed: int | None = None, host_kv_memory: str | int | None = None):
        from jenga.baselines import make_manager
        from jenga.core.specs import ModelSpec

        if dtype not in TORCH_DTYPES:
            raise InvalidArgumentError(f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {dtype!r}")
        self.device = checked_device(device)
        self.dtype = dtype
        config, net, spec_source, tok, gen = _resolve_model(model, random_weights, seed, TORCH_DTYPES[dtype],
                                                            self.device)
        self.config, self.model = config, net.eval()
        self.generation_defaults = gen
        self.tokenizer = tokenizer or tok
        self.processor_prompts = ProcessorPrompts(None if is_tiny(model) else model, self.model)  # text + images
        ckpt = {} if state_checkpoint_interval is None else {"mamba_checkpoint_interval": state_checkpoint_interval}
        vlm = getattr(self.model, "multimodal", False)
        spec = ModelSpec.from_hf_config(spec_source, dtype=dtype, tokens_per_page=tokens_per_page,
                                        vision=vlm and mm_embedding_cache, **ckpt)
        draft = None
        if speculative_model is not None:
            draft, draft_spec = _resolve_draft(speculative_model, self, random_weights,
                                               seed + 1 if speculative_seed is None else speculative_seed,
                                               tokens_per_page, num_speculative_tokens, ckpt)
            spec = spec.combine(draft_spec)
        self.spec = spec
        self.kv_memory = parse_bytes(kv_memory)
        tier = {} if host_kv_memory is None else {"host_memory_bytes": parse_bytes(host_kv_memory)}
        self.manager = make_manager(manager, spec, self.kv_memory, tokens_per_page=tokens_per_page,
                                    enable_prefix_caching=enable_prefix_caching, device=str(self.device),
                                    **tier, **(manager_kwargs or {}))
        if draft is not None:
            from jenga.engine.speculative import check_draft_groups

            check_draft_groups(spec, self.manager, manager)
        self.host_pool = None if not tier else HostKVPool(self.manager.model, self.manager.layout,
                                                          self.manager.host_num_large)
        vision = cross = None
        if vlm and getattr(self.model, "cross_attention_layers", None):  # Llama-3.2-Vision: image K/V pages
            cross = CrossAttentionKV(self.model, self.manager, device=self.device)
        elif vlm:
            vision = VisionEmbeddings(self.model, self.manager, cache=mm_embedding_cache, device=self.device)
        self.runner = ModelRunner(self.model, self.manager, device=self.device, vision=vision, cross=cross)
        eos = self.tokenizer.eos_token_ids if self.tokenizer else ()
        cfg_eos = getattr(self.model.config, "eos_token_id", None)
        eos = tuple(eos) + ((cfg_eos,) if isinstance(cfg_eos, int) else tuple(cfg_eos or ())) + gen.eos_token_ids
        sched = dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, eos_token_ids=eos)
        self.speculative = None
        if draft is None:
            self.scheduler = Scheduler(self.manager, **sched)
        else:
            from jenga.engine.speculative import SpecScheduler, SpeculativeDecoder

            self.scheduler = SpecScheduler(self.manager, num_speculative_tokens=num_speculative_tokens, **sched)
            self.speculative = SpeculativeDecoder(self.runner, draft, self.manager, self.scheduler, device=self.device,
                                                  host_pool=self.host_pool)
        self.limits = RequestLimits.of(self.manager, self.scheduler.max_model_len,
                                       0 if draft is None else num_speculative_tokens)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.track_kv_stats = track_kv_stats
        self.metrics = EngineMetrics()
        self._encoder_runs0 = 0
        self._ids = itertools.count()
        self._live: dict[object, Seq] = {}  # request id -> its sequence, until it finishes

    # ------------------------------------------------------------------ inputs
    def _prompt_ids(self, prompt) -> tuple[str | None, list[int]]:
        text = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                text = prompt.get("prompt")
                prompt = checked_token_ids(prompt["prompt_token_ids"], "prompt_token_ids")
            else:
                prompt = prompt.get("prompt")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidArgumentError("this model has no tokenizer files (tokenizer.json, tokenizer.model, "
                                           "...); pass prompts as token id lists")
            ids = self.tokenizer.encode(prompt)
            if not ids:
                raise InvalidArgumentError(f"prompt {prompt!r} encodes to no tokens")
            return prompt, ids
        if prompt is None:
            raise InvalidArgumentError("prompt is None; pass text, token ids or {'prompt_token_ids': [...]}")
        ids = list(checked_token_ids(prompt, "prompt"))
        if not ids:
            raise InvalidArgumentError("empty prompt")
        vocab = getattr(self.model, "input_vocab_size", self.config_vocab)  # Mllama: <|image|> is past the LM head
        if max(ids) >= vocab or min(ids) < 0:
            raise InvalidArgumentError(f"token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}")
        return text, ids

    @property
    def config_vocab(self) -> int:
        return int(self.model.config.vocab_size)

    @staticmethod
    def _is_single(prompts) -> bool:
        return isinstance(prompts, (str, dict)) or (
            isinstance(prompts, Sequence) and len(prompts) > 0 and all(isinstance(t, int) for t in prompts))

    @property
    def default_sampling_params(self) -> SamplingParams:
        """What a request without ``SamplingParams`` gets (the directory's generation config)."""
        return self.generation_defaults.params()

    def add_request(self, prompt, params: SamplingParams | None = None, *, request_id: object = None,
                    cache_salt: str | None = None) -> Seq:
        """Queue one prompt (text, token ids or ``{"prompt_token_ids": ...}``; text + raw images through the
        directory's HF processor, :mod:`jenga.engine.processor_prompts`); returns its live sequence.

        ``request_id`` defaults to a fresh integer; ``cache_salt`` keeps this request's prefix
        cache apart from requests with another salt.  Raises before queueing anything."""
        params = params or self.default_sampling_params
        prompt = self.processor_prompts.apply(prompt)  # text / raw images -> ids + the model's image tensors
        text, ids = self._prompt_ids(prompt)
        self.limits.check(len(ids), params.max_tokens)
        rid = next(self._ids) if request_id is None else request_id
        if rid in self._live:
            raise DuplicateRequestError(f"request id {rid!r} is already live")
        seq = Seq(rid, ids, params, prompt=text)
        seq.cache_salt = cache_salt
        if isinstance(prompt, dict):
            if prompt.get("cache_salt") is not None:
                seq.cache_salt = prompt["cache_salt"]
            if prompt.get("multi_modal_data"):
                attach_images(seq, prompt["multi_modal_data"], self.model)
        seq.generator = make_generator(params, self.device)
        self.scheduler.add(seq)
        self._live[rid] = seq
        self.metrics.prompt_tokens += len(ids)
        return seq

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def abort(self, request_id: object) -> bool:
        """End live request ``request_id`` now (finish reason ``"abort"``): its pages are freed
        (full pages stay in the prefix cache) and the other requests go on unchanged.  Call it
        between steps.  Returns False when the request is not live (unknown or finished)."""
        seq = self._live.pop(request_id, None)
        if seq is None or seq.finished:
            return False
        self.scheduler.finish(seq, "abort")
        self._finalize(seq)
        self.metrics.aborted += 1
        return True

    # -------------------------------------------------------------------- loop
    def step(self) -> list[Seq]:
        """Run one engine step; returns the requests that finished in it.

        If it raises, the requests it had scheduled are aborted first (see the module doc)."""
        self._plan = None
        try:
            return self._step()
        except BaseException:
            plan = self._plan
            hit = [it.seq for it in plan.scheduled] if plan is not None else list(self.scheduler.touched)
            for seq in reversed(hit):  # newest first: a request looked up after another's allocate may
                self.abort(seq.request_id)  # share the pages it registered; it lets go of them first
            raise
        finally:
            self._plan = None

    def _step(self) -> list[Seq]:
        t0 = time.perf_counter()
        plan = self._plan = self.scheduler.schedule()
        if self.host_pool is not None:  # the tiers' copies of this step's allocations, before its forward
            self.host_pool.execute(self.manager.take_copy_plan())
        m = self.metrics
        if self.track_kv_stats:
            st = self.manager.stats()
            m.peak_used_bytes = max(m.peak_used_bytes, st.used_bytes)
            m.peak_needed_bytes = max(m.peak_needed_bytes, st.needed_bytes)
            m.waste_frac_sum += st.waste_frac
            m.kv_samples += 1
        if plan.empty:  # everything was preempted this step; admission resumes next step
            m.steps += 1
            m.step_s += time.perf_counter() - t0
            return []
        items = [it for it in plan.scheduled if it.sample]
        if self.speculative is not None:  # drafts + one verifying target forward: lists of tokens
            sampled = self.speculative.execute(plan, self.generator, m)
        else:
            logits = self.runner.execute(plan)
            sampled = [None] * len(plan.scheduled)
        if items and self.speculative is None:
            toks = sample(logits, [it.seq.params for it in items], [it.seq.generator for it in items],
                          self.generator).tolist()
            it_toks = iter(toks)
            sampled = [next(it_toks) if it.sample else None for it in plan.scheduled]
            for row, it in enumerate(items):
                if it.seq.params.return_logits:
                    it.seq.logits.append(logits[row].clone())
        finished = self.scheduler.update(plan, sampled)
        for it in items:
            seq = it.seq
            if not seq.finished and seq.params.stop and self._hit_stop_string(seq):
                finished.append(seq)
        for seq in finished:
            self._live.pop(seq.request_id, None)
            self._finalize(seq)
        m.steps += 1
        m.output_tokens += sum(len(t) for t in sampled if t is not None) if self.speculative else len(items)
        m.finished += len(finished)
        m.model_s += self.runner.last_forward_s
        if self.runner.encoder is not None:
            m.encoder_runs = self.runner.encoder.runs - self._encoder_runs0
        m.step_s += time.perf_counter() - t0
        return finished

    def _hit_stop_string(self, seq: Seq) -> bool:
        if self.tokenizer is None:
            return False
        text = self.tokenizer.decode(seq.output_token_ids)
        for s in seq.params.stop:
            idx = text.find(s)
            if idx >= 0:
                seq.text = text[: idx + len(s)] if seq.params.include_stop_str_in_output else text[:idx]
                self.scheduler.finish(seq, "stop", s)
                return True
        return False

    def _finalize(self, seq: Seq) -> None:
        if seq.finish_reason == "stop" and isinstance(seq.stop_reason, str):
            return  # text already cut at the stop string
        if self.tokenizer is not None:
            seq.text = self.tokenizer.decode(seq.output_token_ids)

    def generate(self, prompts, sampling_params: SamplingParams | Iterable[SamplingParams] | None = None, *,
                 use_tqdm: bool = False, desc: str | None = None) -> list[RequestOutput]:
        """Run ``prompts`` (one or a list of: text, token ids, ``{"prompt_token_ids": ...}``) to completion.

        ``sampling_params``: one for all, or one per prompt.  Returns one
        :class:`RequestOutput` per prompt, in input order.
        """
        if prompts is None or isinstance(prompts, (bytes, int)):
            raise InvalidArgumentError(f"generate needs a prompt or a list of prompts, got {prompts!r}")
        if self._is_single(prompts):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise InvalidArgumentError(f"{len(params)} sampling params for {len(prompts)} prompts")
        seqs: list[Seq] = []
        bar = None
        try:
            for p, sp in zip(prompts, params, strict=True):
                seqs.append(self.add_request(p, sp))
            if use_tqdm:
                from tqdm import tqdm

                bar = tqdm(total=len(seqs), desc=desc or f"generate [{self.manager.name}]", unit="req", leave=False)
            while self.scheduler.has_unfinished:
                done = self.step()
                if bar is not None and done:
                    bar.update(len(done))
        except BaseException:
            for s in seqs:  # interrupted or failed: none of this call's requests stays live
                self.abort(s.request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [RequestOutput(s.request_id, s.prompt, s.prompt_token_ids, list(s.output_token_ids), s.text,
                              s.finish_reason, s.stop_reason, s.num_preemptions, s.prefix_hit_tokens, s.logits)
                for s in seqs]

    def reset_metrics(self) -> None:
        """Zero :attr:`metrics` and the scheduler's counters (e.g. after a warm-up)."""
        from jenga.sched.scheduler import SchedulerStats

        self.metrics = EngineMetrics()
        self.scheduler.stats = SchedulerStats()
        self._encoder_runs0 = self.runner.encoder.runs if self.runner.encoder is not None else 0
