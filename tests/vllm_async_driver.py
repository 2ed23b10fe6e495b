"""Drive a vLLM ``AsyncScheduler`` (stock or jenga's) with a deterministic stand-in model runner,
the way vLLM's own scheduler tests do (tests/v1/core/test_async_scheduler.py), so async
scheduling runs with real in-flight placeholder tokens on a machine whose vLLM platform turns
it off (vLLM's CPU platform sets ``async_scheduling = False``).

The engine loop is ``EngineCore.step_with_batch_queue``'s: schedule step ``k + 1`` before the
output of step ``k`` reaches the scheduler (a queue of two batches).  The runner executes a
batch as soon as it is scheduled, like the worker: it knows the tokens it sampled, the
scheduler does not until ``update_from_output``.  It keeps a KV store keyed by byte address in
the workers' real KV buffer (:mod:`vllm_kv_bytes`: block id times the group's block stride plus
its layer offset, as vLLM's ``KVCacheTensor`` places it; jenga's page-layer rewrite included):
every computed token writes ``(position, token id)`` at its slot through the block table the
scheduler sent, and every step first reads back all earlier positions of the request through
that table and checks them (a prefix hit must point at pages holding exactly those tokens; no
other request may have overwritten a live page).  The sampled token is a hash of the tokens
read back, so a wrong page would also change the output.  Every step it also checks that no two
live pages (the pages each request still reads, and those the step writes) share a byte, over
all their layers (``Overlap``): two groups' pages overlapping in the page-layer buffer would
else go unseen whenever their slots' first bytes differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections import deque
from unittest import mock

import vllm.triton_utils  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, resolve_kv_cache_block_sizes
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm_kv_bytes import BufferLayout, LivePages  # noqa: E402

from jenga.vllm.compat import MINOR, kv_cache_configs  # noqa: E402

VOCAB = 500
RUNNER_OUTPUT_FIELDS = {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def async_config(path: str, **kw):
    """vLLM's config for ``path`` with async scheduling switched on after the platform's check."""
    args = dict(model=path, dtype="float32", block_size=32, max_model_len=512, max_num_seqs=8, seed=0,
                enable_prefix_caching=True, enforce_eager=True)
    args.update(kw)
    with contextlib.ExitStack() as stack:
        if MINOR >= (0, 34):
            # 0.34's CPU platform refuses x86 without triton-cpu (its kernels need it); a CUDA
            # wheel here has none, and the stand-in runner runs no kernel
            stack.enter_context(mock.patch.object(vllm.triton_utils, "HAS_TRITON", True))
        cfg = EngineArgs(**args).create_engine_config()
    cfg.scheduler_config.async_scheduling = True
    return cfg


def kv_config(vllm_config, layers, num_blocks: int | None = None, *, shape=None, budget_bytes: int | None = None):
    """vLLM's own KV-cache config for ``layers`` (a number of full-attention layers, or one kind
    per layer: ``"full"``, ``("sliding", window)``, ``("chunked", chunk)``, ``"mamba"``) and a
    budget of ``num_blocks`` blocks of every layer (or ``budget_bytes``).  A ``"mamba"`` layer is an
    align-mode state (``cache_config.mamba_cache_mode = "align"`` is set here) whose page is padded
    to the attention page, as vLLM's hybrid config does.  ``shape``: see :func:`layer_specs`."""
    specs = layer_specs(vllm_config, layers, shape=shape)
    page = next(iter(specs.values())).page_size_bytes
    if any(isinstance(s, MambaSpec) for s in specs.values()):
        vllm_config.cache_config.mamba_cache_mode = "align"
        vllm_config.cache_config.mamba_block_size = vllm_config.cache_config.block_size
    resolve_kv_cache_layout(vllm_config, [["LBNHC"]], specs.values())  # the engine core does this first
    budget = budget_bytes if budget_bytes is not None else num_blocks * page * len(specs)
    cfg = kv_cache_configs(vllm_config, [specs], [budget])[0]
    vllm_config.cache_config.num_gpu_blocks = cfg.num_blocks  # as the engine core records it
    return cfg


def layer_specs(vllm_config, layers, *, shape=None) -> dict:
    """vLLM's per-layer KV specs for ``layers`` (see :func:`kv_config`); ``shape``: a real model's
    attention layer, (KV heads, head size, dtype), instead of the model folder's."""
    mc = vllm_config.model_config
    kinds = ["full"] * layers if isinstance(layers, int) else list(layers)
    heads, head_size, dtype = shape or (mc.get_total_num_kv_heads(), mc.get_head_size(), mc.dtype)
    kw = dict(block_size=vllm_config.cache_config.block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    specs = {}
    for i, kind in enumerate(kinds):
        name = f"model.layers.{i}.self_attn.attn"
        if kind == "mamba":  # a small state (conv + SSM) padded to the attention page
            specs[f"model.layers.{i}.mixer"] = MambaSpec(
                block_size=kw["block_size"], shapes=((4, 8), (2, 8, 8)), dtypes=(mc.dtype, mc.dtype),
                page_size_padded=FullAttentionSpec(**kw).page_size_bytes, mamba_cache_mode="align")
        elif kind == "full":
            specs[name] = FullAttentionSpec(**kw)
        elif kind[0] == "sliding":
            specs[name] = SlidingWindowSpec(**kw, sliding_window=kind[1])
        else:
            specs[name] = ChunkedLocalAttentionSpec(**kw, attention_chunk_size=kind[1])
    return specs


def make_scheduler(cls, vllm_config, kv_cache_config):
    block, hash_block = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=block,
               hash_block_size=hash_block), hash_block


def _first_needed(spec):
    """The first position the token at ``p`` reads in a layer of ``spec``."""
    window = getattr(spec, "sliding_window", None)
    chunk = getattr(spec, "attention_chunk_size", None)
    if window:
        return lambda p: max(0, p - window + 1)
    if chunk:
        return lambda p: p // chunk * chunk
    return lambda p: 0


class FakeRunner:
    """Executes scheduler outputs against a KV store (see the module docstring)."""

    def __init__(self, kv_cache_config):
        self.block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        self.state = [isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups]
        # per group, the first position token ``p`` attends to (the rest may be freed)
        self.first_needed = [_first_needed(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups]
        self.layout = BufferLayout(kv_cache_config)
        self.live = LivePages(self.layout)
        self.kv: dict[int, tuple] = {}  # byte address of a token slot (a state's page) -> what was written
        self.tokens: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}
        self.tables: dict[str, list[list[int]]] = {}
        self.written: dict[str, int] = {}  # running request -> tokens computed through its tables
        self.checked = 0
        self.states_checked = 0  # align-mode states read back (a step resuming at ``start > 0``)

    def _slot(self, g: int, table: list[int], pos: int) -> int:
        bs = self.block_sizes[g]
        return self.layout.token_addr(g, table[pos // bs], pos % bs)

    def page_keys(self, g: int, block: int) -> list:
        """The store's keys of every slot of ``block`` in group ``g`` (a state's is the first)."""
        return [self.layout.token_addr(g, block, i) for i in range(self.block_sizes[g])]

    def _state_block(self, g: int, table: list[int], seq_len: int) -> int:
        """The block of an align-mode state of ``seq_len`` tokens: block-table column
        ``(seq_len - 1) // block`` (vLLM's aligned state index; the runner copies the previous
        column's state forward when a step crosses into a new column)."""
        block = table[(seq_len - 1) // self.block_sizes[g]]
        assert block != 0, f"group {g}: the state column of {seq_len} tokens is the null block"
        return block

    def _state_slot(self, g: int, table: list[int], seq_len: int) -> int:
        return self.layout.page_addr(g, self._state_block(g, table, seq_len))

    def _pages(self, tables: list[list[int]], lo: int, hi: int) -> set[tuple[int, int]]:
        """The pages a request reads or writes while its tokens ``[lo, hi)`` are computed
        (``lo == hi``: after they were): each token group's window or chunk back from ``lo``,
        each state group's state at ``lo`` and at ``hi``."""
        out = set()
        for g, table in enumerate(tables):
            if self.state[g]:
                out.update((g, self._state_block(g, table, n)) for n in {lo, hi} if n)
            elif hi:
                bs = self.block_sizes[g]
                out.update((g, table[i]) for i in range(self.first_needed[g](lo) // bs, (hi - 1) // bs + 1))
        return out

    def _check_live(self, starts: dict[str, int], scheduled: dict[str, int]) -> None:
        """No two pages live in this step share a byte (``LivePages``)."""
        live = set()
        for rid, n in self.written.items():
            start = starts.get(rid, n)
            live |= self._pages(self.tables[rid], start, start + scheduled.get(rid, 0))
        self.live.update(live)

    def forget(self, out) -> None:
        """The requests ``out`` (any scheduler output, one scheduling nothing too) reports finished or
        preempted let go of their pages: vLLM may hand them on in that very step."""
        for rid in set(out.finished_req_ids) | set(getattr(out, "preempted_req_ids", None) or ()):
            self.written.pop(rid, None)

    def execute(self, out) -> ModelRunnerOutput:
        starts = {}
        for r in out.scheduled_new_reqs:
            # 0.34 re-sends a preempted request as a new one with all its tokens (prefill_token_ids)
            self.tokens[r.req_id] = list(getattr(r, "prefill_token_ids", None) or r.prompt_token_ids)
            self.prompt_len.setdefault(r.req_id, len(r.prompt_token_ids))
            self.tables[r.req_id] = [list(b) for b in r.block_ids]
            starts[r.req_id] = r.num_computed_tokens
        c = out.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            if rid in getattr(c, "resumed_req_ids", ()):  # preempted and back: the scheduler's tokens, new tables
                self.tokens[rid] = self.tokens[rid][:self.prompt_len[rid] + c.num_output_tokens[i]]
                self.tables[rid] = [list(b) for b in c.new_block_ids[i]]
            elif c.new_block_ids[i] is not None:
                for table, new in zip(self.tables[rid], c.new_block_ids[i], strict=True):
                    table.extend(new)
            starts[rid] = c.num_computed_tokens[i]
        for rid, start in starts.items():
            self.written[rid] = start
        self._check_live(starts, out.num_scheduled_tokens)
        req_ids, sampled = [], []
        for rid, n in out.num_scheduled_tokens.items():
            start, toks, tables = starts[rid], self.tokens[rid], self.tables[rid]
            seen: set[tuple[int, int]] = set()  # (position, token) read back, whatever the grouping
            for g, table in enumerate(tables):  # every earlier position attended, read back through the table
                if self.state[g]:
                    if start:
                        got = self.kv.get(self._state_slot(g, table, start))
                        assert got == ("state", start, _digest(toks[:start])), f"{rid}: group {g} state page holds another state"
                        self.states_checked += 1
                    continue
                lo = self.first_needed[g](start)
                got = [self.kv.get(self._slot(g, table, q)) for q in range(lo, start)]
                assert got == [(q, toks[q]) for q in range(lo, start)], f"{rid}: group {g} pages hold other tokens"
                seen.update(got)
                self.checked += start - lo
            for p in range(start, start + n):
                for g, table in enumerate(tables):
                    if not self.state[g]:
                        self.kv[self._slot(g, table, p)] = (p, toks[p])
            for g, table in enumerate(tables):
                if self.state[g]:  # the state after the step, in the column of its last token
                    self.kv[self._state_slot(g, table, start + n)] = ("state", start + n, _digest(toks[:start + n]))
            self.written[rid] = start + n
            req_ids.append(rid)
            if start + n == len(toks):  # the last known token computed: sample the next one
                digest = hashlib.blake2b(repr([t for _, t in sorted(seen)] + toks[start:start + n]).encode(), digest_size=8).digest()
                tok = 3 + int.from_bytes(digest, "little") % (VOCAB - 3)
                toks.append(tok)
                sampled.append([tok])
            else:
                sampled.append([])
        kw = dict(req_ids=req_ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                  pooler_output=[])
        if "req_id_to_index" in RUNNER_OUTPUT_FIELDS:  # gone in 0.34 (the scheduler indexes req_ids itself)
            kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return ModelRunnerOutput(**kw)


def _digest(tokens: list[int]) -> bytes:
    return hashlib.blake2b(repr(tokens).encode(), digest_size=8).digest()


class Stall(AssertionError):
    """The scheduler stopped: requests wait, nothing runs and nothing is in flight."""


def requests(scheduler, hash_block: int, prompts, *, max_tokens: int = 24, name: str = "r", extra=None) -> list:
    """vLLM ``Request`` objects for ``prompts`` with vLLM's block hashes (``extra``: keyword arguments
    of ``Request``, e.g. ``cache_salt`` / ``lora_request``, for every request)."""
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block, hash_fn)
    return [Request(f"{name}{i}", list(p), SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
                    None, block_hasher=hasher, **(extra or {})) for i, p in enumerate(prompts)]


def run(scheduler, hash_block: int, kv_cache_config, prompts, *, max_tokens: int = 24, arrivals=None,
        runner: FakeRunner | None = None, name: str = "r", extra=None):
    """Serve ``prompts`` (request ``i`` added before step ``arrivals[i]``) with two batches in flight
    (``runner``: a ``FakeRunner`` of the caller's, e.g. one that also runs a connector's copies;
    ``name`` / ``extra``: see :func:`requests`).
    Returns (generated tokens per request, the runner, steps taken, placeholder tokens scheduled)."""
    reqs = requests(scheduler, hash_block, prompts, max_tokens=max_tokens, name=name, extra=extra)
    arrivals = arrivals or [0] * len(reqs)
    runner, queue, step, placeholders = runner or FakeRunner(kv_cache_config), deque(), 0, 0
    pending = sorted(range(len(reqs)), key=lambda i: arrivals[i])
    while pending or scheduler.has_requests() or queue:
        while pending and arrivals[pending[0]] <= step:
            scheduler.add_request(reqs[pending.pop(0)])
        out = scheduler.schedule()
        runner.forget(out)
        step += 1
        if not out.total_num_scheduled_tokens and not queue and scheduler.has_requests():
            # nothing runs and nothing is in flight: no later step can schedule more (a stall)
            raise Stall(f"step {step}: nothing scheduled, {len(scheduler.waiting)} waiting, "
                        f"{len(scheduler.running)} running, {sum(r.is_finished() for r in reqs)} of {len(reqs)} done")
        if out.total_num_scheduled_tokens:
            # a request scheduled again while its previous step is in flight computes a token whose id
            # the scheduler does not know yet (its second output placeholder)
            placeholders += sum(r.num_output_placeholders >= 2 for r in reqs if r.request_id in out.num_scheduled_tokens)
            queue.append((out, runner.execute(out)))
        if queue and (len(queue) == 2 or not out.total_num_scheduled_tokens):
            done, result = queue.popleft()
            scheduler.update_from_output(done, result)
        assert step < 10_000, "no progress"
    return [list(r.output_token_ids) for r in reqs], runner, step, placeholders
