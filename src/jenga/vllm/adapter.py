"""What vLLM's scheduler calls on its KV-cache manager, answered by a jenga manager.

A translation layer only: vLLM's ``Request`` objects, block ids and keyword arguments
become jenga's request ids, page ids and calls; every decision (pages, hits, eviction,
what fits) is the jenga ``KVCacheManager``'s.

Token bookkeeping: vLLM counts scheduled tokens as computed at schedule time and learns
sampled ids later.  jenga is told at the next call that concerns the request
(``allocate_slots``, ``cache_blocks``, ``free``): the ids vLLM now knows are appended
and the tokens scheduled before count as computed, minus the draft tokens vLLM rolled
back (``num_rejected``).  Tokens scheduled before their ids are known (async scheduling)
are jenga placeholders.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from vllm.distributed import kv_events as ve
from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window
from vllm.v1.metrics.stats import PrefixCacheStats

from jenga.core.manager.manager import KVCacheManager
from jenga.core.prefix.events import AllBlocksCleared, BlockRemoved, BlockStored
from jenga.core.tables import StateTable, TokenTable
from jenga.vllm import compat
from jenga.vllm.junction_stop import junction_step_end, resumed_prompt_stop
from jenga.vllm.plan import VllmPlan
from jenga.vllm.state_copies import StateCopies

NULL_BLOCK = 0


class Blocks:
    """The part of vLLM's ``KVCacheBlocks`` the scheduler reads: block ids per group."""

    __slots__ = ("ids",)

    def __init__(self, ids: tuple[list[int], ...]):
        self.ids = ids

    def get_block_ids(self, allow_none: bool = False, *, group_ids=None):
        ids = self.ids if group_ids is None else tuple(self.ids[g] for g in group_ids)
        if allow_none and not any(ids):
            return None
        return ids


def _retains_nothing(blocks) -> None:
    assert not blocks, f"jenga.vllm: vLLM frees blocks {blocks} jenga's copies never retained"


class JengaKVCacheAdapter:
    """Stands in for ``vllm.v1.core.kv_cache_manager.KVCacheManager`` in the scheduler."""

    def __init__(self, plan: VllmPlan, kv_cache_config, *, max_model_len: int, enable_caching: bool,
                 log_stats: bool, enable_kv_cache_events: bool, hash_block_size: int | None = None,
                 host_memory_bytes: int | None = None, admission: str | None = None,
                 max_step_tokens: int | None = None, eviction: str | None = None, eviction_options=None,
                 junction_stop=None, junction_readers=None, reserve_prefills: bool = False):
        self.plan = plan
        # vLLM's whole-prompt admission check also counts as taken the pages the admitted requests
        # still need to reach their prompt's end (jenga.vllm.admission, JENGA_VLLM_RESERVE)
        self.reserve_prefills = reserve_prefills
        # where a junction off vLLM's Mamba block grid stops a step (jenga.vllm.junction_stop;
        # None: at the junction); request id -> the junction vLLM was handed, where jenga's
        # checkpoint does not sit on jenga's junction
        self.junction_stop = junction_stop
        self._moved: dict[str, int] = {}
        # (request, junction) -> the other requests known to wait for that prefix (the scheduler's)
        self.junction_readers = junction_readers or (lambda request, junction: 1)
        # the most tokens one step computes for a request (vLLM's max_num_batched_tokens): the
        # full-sequence admission check counts what steps of that size hold at once
        self.max_step_tokens = max_step_tokens or max_model_len
        # vLLM's block hashes key jenga's index when its hash block divides jenga's block
        self.hash_block_size = hash_block_size
        # read-only facts vLLM's engine core reads off the manager's groups (block sizes, specs)
        self.manager = KVCacheManager(plan.model, plan.memory_bytes, tokens_per_page=plan.tokens_per_page,
                                      enable_prefix_caching=enable_caching, fit_pages=plan.fit_pages,
                                      device="meta", host_memory_bytes=host_memory_bytes, admission=admission,
                                      eviction=eviction, eviction_options=eviction_options)
        # state groups: vLLM's Mamba mode per group ("align" / "none"; None for token groups) and
        # its block (a block-table column covers that many tokens); per request, each state
        # group's block-table row as sent (vLLM's worker keeps it append-only)
        specs = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups]
        self.state_mode = [getattr(s, "mamba_cache_mode", None) for s in specs]
        self.state_block = [s.block_size if m is not None else None for s, m in zip(specs, self.state_mode, strict=True)]
        self._rows: dict[str, dict[int, list[int]]] = {}
        # jenga's pages finer than an align-mode Mamba block (``plan.sub_block_page``): vLLM's
        # scheduler then ends prefill steps on hash-block checkpoints (its partial-hit path) and
        # on jenga's junction, and the states inside a column move by block copies
        self.sub_block = enable_caching and any(m == "align" and b > self.manager.block
                                                for m, b in zip(self.state_mode, self.state_block, strict=True))
        self.mamba_shared_prefix_checkpoint = self.sub_block
        self.mamba_block = max((b for b in self.state_block if b is not None), default=0)
        self.copies = StateCopies()
        # vLLM hands the blocks a copy retains (none: ``take_kv_cache_block_copies``) back through this
        self.block_pool = SimpleNamespace(free_blocks=_retains_nothing)
        # read-only facts vLLM's engine core reads off the manager's groups (block sizes, specs)
        self.coordinator = SimpleNamespace(
            single_type_managers=[SimpleNamespace(block_size=s.block_size, kv_cache_spec=s) for s in specs],
            enable_partial_hash_hits=self.sub_block)
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.num_groups = len(self.manager.model.groups)
        self.empty_kv_cache_blocks = Blocks(tuple([] for _ in range(self.num_groups)))
        self._sent: dict[str, list[int]] = {}  # request id -> block ids already sent, per group
        self._views: dict[str, object] = {}  # request id -> the view of its live record (``_view``)
        self._preempted: set[str] = set()  # waiting requests vLLM preempted, looked up again
        self.num_preempted_or_freed = 0
        # what vLLM's own manager stamps on a group's stored events (its ``kv_cache_event_metadata``)
        self.event_kinds = tuple((get_kv_cache_spec_kind(s).value, get_kv_cache_spec_sliding_window(s)) for s in specs)
        if enable_kv_cache_events:
            self.manager.enable_kv_events()
        # per group, fixed for the engine's life: exec-id scale, and whether it is a state group
        self._scale, self._offset = plan.exec_scale, plan.exec_offset
        self._state_groups = [g for g, grp in enumerate(self.manager.model.groups) if not grp.spec.per_token]

    # ------------------------------------------------------------ ids
    def _exec_ids(self, group: int, pages: list[int | None], start: int) -> list[int]:
        """vLLM block ids of token group ``group``'s ``pages`` (by logical page) from logical page
        ``start`` on (one pass over the run; none when nothing was added, a decode step's common case)."""
        if start >= len(pages):
            return []
        run = pages[start:] if start else pages
        scale, off = self._scale[group], self._offset
        if None in run:
            return [NULL_BLOCK if p is None else p * scale + off for p in run]
        if scale == 1:
            return [p + off for p in run] if off else list(run)
        return [p * scale + off for p in run]

    def _state_row(self, req, table: StateTable) -> list[int]:
        """A state group's block-table row, extended to the tokens allocated so far.

        "none": one column, the work page (updated in place).  "align": column ``i`` is
        where the state after a step ending in block ``i`` lives, and vLLM's worker copies
        the previous step's column into the current one when they differ: a checkpoint
        page at its position's column, the prefix-hit page at the hit's column, the work
        page everywhere else (checkpoints and hits inside a column: ``_sub_block_copies``)."""
        g = table.group
        row = self._rows.setdefault(req.request_id, {}).setdefault(g, [])
        scale, off = self.plan.exec_scale[g], self.plan.exec_offset
        if self.state_mode[g] == "none":
            if not row:
                row.append(table.work_page * scale + off)
            return row
        block = self.state_block[g]
        for i in range(len(row), -(-req.start // block)):
            pos = (i + 1) * block
            page = table.checkpoints.get(pos)
            if page is None:
                hit = table.read_page is not None and pos == req.num_computed
                page = table.read_page if hit else table.work_page
            row.append(page * scale + off)
        return row

    def _view(self, request_id: str):
        """The view of ``request_id``'s jenga record (``None``: not live), kept until ``free`` drops
        the record: a view reads the live record, current as long as it lives."""
        view = self._views.get(request_id)
        if view is None:
            view = self.manager.view(request_id)
            if view is not None:
                self._views[request_id] = view
        return view

    def _blocks_of(self, req, *, only_new: bool) -> Blocks:
        """The block ids of live request ``req`` (a view), all of them or (``only_new``, after
        its first allocate) those not sent yet; before its first allocate, after a lookup: the
        hit's pages (``_hit_blocks``)."""
        tables = req.tables
        if tables is None:
            return self._hit_blocks(req)
        return self._table_blocks(req.request_id, req, tables, only_new=only_new)

    def _hit_blocks(self, req) -> Blocks:
        """The block ids of ``req`` (a view) before its first allocate, after a lookup: the hit's
        pages (a token group's held pages, none for other kinds)."""
        out = []
        for g in range(self.num_groups):
            pages = req.page_ids(g)
            out.append(self._exec_ids(g, pages, 0) if pages else [])
        return Blocks(tuple(out)) if any(out) else self.empty_kv_cache_blocks

    def _table_blocks(self, rid: str, req, tables, *, only_new: bool) -> Blocks:
        """The block ids of request ``rid`` (view ``req``) past its first allocate, from its page
        ``tables``: all of them or (``only_new``) those not sent yet."""
        sent = self._sent.get(rid)
        if sent is None:
            sent = self._sent[rid] = [0] * self.num_groups
        out = []
        for g, t in enumerate(tables.groups):
            if type(t) is TokenTable or isinstance(t, TokenTable):
                pages = t.page_ids
                n = len(pages)
                ids = [] if only_new and n == sent[g] else self._exec_ids(t.group, pages, sent[g] if only_new else 0)
            elif isinstance(t, StateTable):
                row = self._state_row(req, t)
                n, ids = len(row), row[sent[g]:] if only_new else list(row)
            else:
                raise AssertionError(f"jenga.vllm: no vLLM block table for {type(t).__name__}")
            out.append(ids)
            if only_new:
                sent[g] = n
        # none at all: the shared empty blocks, as vLLM's own manager answers (read only there too)
        return Blocks(tuple(out)) if any(out) else self.empty_kv_cache_blocks

    def _check_step_ends(self, req, start: int) -> None:
        """vLLM's worker writes a state only at a step's end: every checkpoint jenga placed
        in this allocation must be the step's last position (vLLM's align-mode scheduler
        stops prefill chunks at the prompt's last block boundary and at the junction).
        Called for models with state groups only."""
        end = req.start
        for t in req.tables.groups:
            if isinstance(t, StateTable):
                inside = [p for p in t.checkpoints if start < p < end]
                if inside:
                    raise AssertionError(f"jenga.vllm: {req.request_id}: state checkpoints {inside} fall inside the "
                                         f"step [{start}, {end}); vLLM's worker would never write them")

    # ------------------------------------------------------------ sync
    @staticmethod
    def cache_salt(request) -> str | None:
        """The salt of jenga's own hashes for ``request`` (when vLLM's block hashes are not
        used): its cache salt, its LoRA adapter (name, id and path, as vLLM keys it) and its
        images (each one's content hash and position), so no page is shared across tenants,
        adapters or pictures behind the same placeholder tokens.  vLLM's own block hashes carry
        all three as extra keys, per block: there, the text before an image is shared whatever
        the image; here, only prompts with the same images at the same places share pages.

        The encoding is injective: a request with neither adapter nor images keeps its cache
        salt (``None`` stays ``None``) unless that salt starts with ``"\\x00"``; every other
        request gets ``"\\x00"`` and the JSON of (salt, adapter, images).  So no cache salt a
        client sends can name another request's (salt, adapter, images), e.g. a base-model
        request salted ``"t\\x00lora:a"`` never shares adapter ``a``'s pages of tenant ``t``."""
        salt = request.cache_salt
        lora = getattr(request, "lora_request", None)
        images = getattr(request, "mm_features", None)
        if lora is None and not images and not (salt and salt.startswith("\x00")):
            return salt
        adapter = None if lora is None else [lora.lora_name, getattr(lora, "lora_int_id", None),
                                              getattr(lora, "lora_path", None)]
        pictures = [[f.identifier, f.mm_position.offset] for f in images or ()]
        return "\x00" + json.dumps([salt, adapter, pictures], separators=(",", ":"))

    def _ensure(self, request):
        """The view of ``request``'s jenga record, added at its first sight."""
        view = self._views.get(request.request_id)
        if view is None:  # not seen yet, or not viewed yet (``_view``)
            self._add(request)
            view = self._view(request.request_id)
        return view

    def _add(self, request) -> None:
        mgr = self.manager
        if request.request_id not in mgr.requests:
            # the ids as a list (a slice of vLLM's read-only view is its list's copy, made in C: the view
            # itself is read through Python calls, one per id)
            tokens = request.all_token_ids[:]
            hb = self.hash_block_size
            if self.enable_caching and hb and mgr.block % hb == 0 and (request.block_hashes or request.num_tokens < hb):
                # vLLM's own chained hashes (salt, LoRA and images in them): KV events carry them
                mgr.add_request(request.request_id, tokens, block_hashes=request.block_hashes,
                                hash_block=hb, prompt_checkpoint=self._prompt_checkpoint(request))
            else:
                mgr.add_request(request.request_id, tokens, cache_salt=self.cache_salt(request),
                                prompt_checkpoint=self._prompt_checkpoint(request))

    def _prompt_checkpoint(self, request) -> int | None:
        """Where jenga checkpoints the state at ``request``'s prompt end: where vLLM's scheduler
        stops a preempted request's recompute near it (``resumed_prompt_stop``; none where that is off
        jenga's block grid), the default (``None``) otherwise."""
        if not self.sub_block or request.num_tokens <= request.num_prompt_tokens:
            return None
        stop = resumed_prompt_stop(request.num_prompt_tokens, request.num_tokens,
                                   self.hash_block_size or self.manager.block, self.mamba_block)
        return 0 if stop % self.manager.block else stop

    def _sync(self, request, req=None) -> None:
        """Tell jenga what vLLM learnt since the last call about ``request`` (``req``: its view,
        when the caller has it)."""
        if req is None:
            req = self._view(request.request_id)
        if req is not None and req.tables is not None:
            self._sync_running(request, req)

    def _sync_running(self, request, req) -> None:
        """``_sync`` for a request past its first allocate (``req``: its view)."""
        known, have = request.num_tokens, req.num_tokens
        new_ids = request.all_token_ids[have:known] if known > have else []
        scheduled = req.num_scheduled
        if not scheduled and not new_ids:
            return
        rejected = req.num_computed + scheduled - request.num_computed_tokens
        assert rejected >= 0, (f"jenga.vllm: vLLM computed {request.num_computed_tokens} tokens of "
                               f"{request.request_id}, jenga allocated {req.num_computed + scheduled}")
        self.manager.append_tokens(request.request_id, new_ids, num_rejected=rejected)

    # ------------------------------------------------------------ scheduler API
    def new_step_starts(self) -> None:
        if self.sub_block:  # only then are there block copies (``_sub_block_copies``)
            self.copies.step()

    def get_computed_blocks(self, request, max_cache_hit_length: int | None = None):
        req = self._views.get(request.request_id)  # ``_ensure`` inline: asked every step for a blocked head
        if req is None:
            req = self._ensure(request)
        if req.tables is not None:
            raise AssertionError(f"jenga.vllm: lookup of running request {request.request_id}")
        limit = compat.max_cache_hit_length(request, max_cache_hit_length) if self.enable_caching else 0
        hit = self.manager.lookup(request.request_id, max_tokens=limit)
        if request.num_preemptions:
            self._preempted.add(request.request_id)
        self._sent.pop(request.request_id, None)
        self._rows.pop(request.request_id, None)
        # the junction (where the prompt leaves the cached prefix) is vLLM's shared-prefix
        # boundary: its align-mode scheduler ends a prefill step there, where jenga checkpoints
        # (off vLLM's block grid: where the junction stop puts it, jenga.vllm.junction_stop)
        junction = req.junction
        self._moved.pop(request.request_id, None)
        if self.junction_stop is not None and self.sub_block and junction:
            stop = self.junction_stop.stop(junction, hit, self.junction_readers(request, junction))
            at = junction_step_end(stop, request.num_prompt_tokens, hit, self.mamba_block)
            if at != junction:
                self.manager.move_junction_checkpoint(request.request_id, at)
                self._moved[request.request_id] = stop
            junction = stop
        return self._hit_blocks(req), hit, junction

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       num_encoder_tokens: int = 0, full_sequence_must_fit: bool = False,
                       reserved_blocks: int = 0, has_scheduled_reqs: bool = True,
                       skip_zeroing_group_ids: tuple[int, ...] = ()):
        if num_external_computed_tokens or delay_cache_blocks or num_encoder_tokens:
            raise AssertionError("jenga.vllm: KV connectors and encoder caches are refused at engine start")
        mgr, rid = self.manager, request.request_id
        req = self._views.get(rid)  # ``_ensure`` inline: every running request, every step
        if req is None:
            req = self._ensure(request)
        if req.tables is None:  # first allocation: the scheduler may keep less of the hit
            if num_new_computed_tokens < req.hit:
                mgr.shrink_hit(rid, num_new_computed_tokens)
                moved = self._moved.get(rid)  # the new lookup put the checkpoint back on the junction
                if moved is not None and moved <= req.junction:
                    mgr.move_junction_checkpoint(rid, junction_step_end(moved, request.num_prompt_tokens, req.hit,
                                                                         self.mamba_block))
            if full_sequence_must_fit:
                # vLLM's reservation of the whole prompt: what its steps will really hold at once (a
                # sliding group its window plus a step, a chunked one its chunk plus a step, a state
                # group its state and checkpoints, full attention every token), never every page
                # of one allocate of that length, which may exceed a pool where the request runs
                total = min(request.num_tokens, self.max_model_len)
                step = self.max_step_tokens + num_lookahead_tokens
                rest = max(0, total - req.start)
                reserve = self.reserve_prefills
                if not mgr.can_allocate(rid, rest, step=step, reserve=reserve) and not self._let_go_of_held_hits(
                        req, lambda: mgr.can_allocate(rid, rest, step=step, reserve=reserve)):
                    return None
        else:
            self._sync_running(request, req)
        start = req.start
        assert start == request.num_computed_tokens + num_new_computed_tokens, (
            f"jenga.vllm: {rid} starts at {start} in jenga, "
            f"{request.num_computed_tokens + num_new_computed_tokens} in vLLM")
        lookahead = max(0, min(num_lookahead_tokens, self.max_model_len - start - num_new_tokens))
        unknown = max(0, start + num_new_tokens - req.num_tokens)
        tables = mgr.allocate(rid, num_new_tokens, num_lookahead=lookahead, num_placeholders=unknown)
        if tables is None:
            tables = self._let_go_of_held_hits(req, lambda: mgr.allocate(rid, num_new_tokens, num_lookahead=lookahead,
                                                                         num_placeholders=unknown))
            if tables is None:
                return None
        if self._state_groups:
            self._check_step_ends(req, start)
        blocks = self._table_blocks(rid, req, tables, only_new=True)
        if self.sub_block:
            self._sub_block_copies(req, start)
        return blocks

    def _let_go_of_held_hits(self, req, retry):
        """An allocation of ``req`` failed: let go of hits the other waiting requests hold (vLLM
        looked them up and could not admit them) where that is worth it, one at a time, the
        newest first, until ``retry()`` succeeds; its answer, or ``None``.

        * No other request allocated: all of them (``release_waiting_hits``): nothing else will
          free a page, and the holds could fill the pool with nothing running (a stall).
        * ``req`` running: vLLM preempts a running request next, dropping its work.  First the
          holds whose next token reads the whole prefix in every kind (``waiting_hits(whole_prefix=
          True)``: evicting their last pages costs those pages' tokens only; measured: Llama-3.1-8B
          round-robin chats at 4 % of the H100 budget 28 preemptions -> 1, 5.90 -> 6.54 req/s),
          then the holds of requests vLLM preempted: held, a preempted request's hit keeps the
          pages the running ones grow into, and the next growth preempts another (Llama-4-Scout
          round-robin chats at 4 %, vLLM 0.34 at its best 7.10 req/s with 1 preemption: without
          this rule 6.91 req/s and 3 preemptions, with it 7.05 and 2).  Any other hold
          that resumes from a window or a state checkpoint stays: losing its last pages loses
          the whole hit (releasing those too: Falcon-H1-7B agent sessions at 4 % 7.95 -> 6.71 req/s).
        * Otherwise (a first allocation): the whole-prefix holds shallower than ``req``'s hit.
          The admission order puts the deepest hit first (``jenga.vllm.admission``, or vLLM's
          cache-aware admission), so such a hold is a request's behind it, keeping pages for a later
          admission at the cost of this one (Llama-4-Scout round-robin chats at 4 %: a chat's
          second turn held its first turn's pages, and another chat's third turn, deeper, waited
          8 steps for pages with 2 requests running; without this rule 6.64 req/s, with it 7.05;
          Ministral-8B's chats 6.01 -> 6.16, vLLM-best 6.13).  Deeper holds stay: they keep the
          prefixes the queue reads next (letting go of every hold here: Gemma-3-27B agent
          sessions at the real budget 4.39 -> 4.05 req/s)."""
        mgr, rid = self.manager, req.request_id
        running = req.tables is not None
        if mgr.num_allocated <= running:
            return retry() if mgr.release_waiting_hits(keep=rid) else None
        if not running:
            if not req.hit:  # a miss: no hold is shallower
                return None
            return self._let_go_one_by_one(mgr.waiting_hits(whole_prefix=True, below=req.hit), rid, retry)
        got = self._let_go_one_by_one(mgr.waiting_hits(whole_prefix=True), rid, retry)
        if got is None and self._preempted:
            got = self._let_go_one_by_one([o for o in mgr.waiting_hits() if o in self._preempted], rid, retry)
        return got

    def _let_go_one_by_one(self, others, rid, retry):
        """Let go of the holds of ``others`` but ``rid``, in turn, until ``retry()`` succeeds; its
        answer, or ``None``."""
        for other in others:
            if other != rid:
                self.manager.shrink_hit(other, 0)
                got = retry()
                if got is not None:
                    return got
        return None

    def _sub_block_copies(self, req, start: int) -> None:
        """The block copies of this allocation's states inside a column (:mod:`jenga.vllm.state_copies`):
        the checkpoint the step ends on (fill, next step) and, on a first allocation, the hit it
        resumes (read, this step).  ``req.start`` is the step's end."""
        rows = self._rows.get(req.request_id, {})
        scale, off = self.plan.exec_scale, self.plan.exec_offset
        for t in req.tables.groups:
            g = t.group
            if not isinstance(t, StateTable) or self.state_mode[g] != "align":
                continue
            block, row = self.state_block[g], rows[g]
            end = req.start
            page = t.checkpoints.get(end)
            if page is not None and end % block:
                self.copies.fill(req.request_id, end, row[-(-end // block) - 1], page * scale[g] + off)
            if t.read_page is not None and start == req.hit and start % block:
                self.copies.read(t.read_page * scale[g] + off, row[start // block])

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        self._sync(request)

    def free(self, request) -> None:
        rid = request.request_id
        req = self._view(rid)
        if req is not None:
            self._sync(request, req)
            if self.sub_block:  # only then are there block copies
                self.copies.cancel(rid, req.num_computed)
            self.manager.free(rid)
            self.num_preempted_or_freed += 1
        self._views.pop(rid, None)
        self._preempted.discard(rid)
        self._sent.pop(rid, None)
        self._rows.pop(rid, None)
        self._moved.pop(rid, None)

    def remove_skipped_blocks(self, request_id, processed_computed_tokens, num_prompt_tokens=None) -> None:
        pass  # jenga releases out-of-window pages when their tokens are committed

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """A finished request's block ids (vLLM hands them to the KV connector's ``request_finished``;
        jenga's host-tier connector saves nothing at a finish: demotion follows eviction)."""
        return self.get_block_ids(request_id)

    def finalize_partial_tail_offloads(self, request) -> list:
        return []  # a KV producer's partial tails: jenga's host tier demotes whole pages on eviction

    def get_blocks(self, request_id: str) -> Blocks:
        req = self._view(request_id)
        return self.empty_kv_cache_blocks if req is None else self._blocks_of(req, only_new=False)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_num_cached_tokens(self, request, in_flight: bool = False) -> int:
        """Tokens of ``request``'s prompt jenga has cached now (vLLM >= 0.34's cache-aware
        admission; jenga's own ``HitsFirst``).  Read only: no page held, no hit or miss counted,
        no KV event (``KVCacheManager.cached_tokens``, memoized per request: a waiting queue is
        probed every step); a request jenga has not seen yet gets its record (tokens and vLLM's
        block hashes, no pages), as its first scheduling would give it, and vLLM frees every
        request it finishes or aborts, waiting or not.
        ``in_flight``: once the steps allocated so far commit (``jenga.vllm.prefix_wait``)."""
        if not self.enable_caching or not compat.reads_prefix_cache(request):
            return 0
        self._add(request)
        limit = compat.max_cache_hit_length(request)
        return self.manager.cached_tokens(request.request_id, max_tokens=limit, in_flight=in_flight)

    def cache_version(self) -> int:
        """Changes whenever ``get_num_cached_tokens(request)`` of a request that waits (its tokens
        unchanged) may answer otherwise: the prefix index's version (read without holding a
        deferred hit)."""
        return self.manager.prefix_version()

    def writes_in_flight(self) -> bool:
        """Whether a step in flight writes pages that join the cache at its commit (state checkpoints)."""
        for pol in self.manager.policies:
            if pol.writing_keys():
                return True
        return False

    def estimate_cached_tokens(self, request) -> int:
        req = self._view(request.request_id)
        return req.hit if req is not None else 0

    def take_new_block_ids(self) -> list[int]:
        return []

    def take_kv_cache_block_copies(self):
        # nothing to retain: the worker runs a step's copies before its forward, one gather then
        # one scatter, so a page let go of since still holds the bytes copied (``StateCopies``)
        return (self.copies.take() if self.sub_block else []), []

    def take_boundary_state_offloads(self) -> dict:
        return {}

    @property
    def usage(self) -> float:
        return self.manager.usage

    def prefix_cache_lookup_enabled(self, request) -> bool:
        return self.enable_caching and compat.reads_prefix_cache(request)

    def record_prefix_cache_stats(self, request, num_hits: int) -> None:
        if self.log_stats and self.prefix_cache_lookup_enabled(request):
            self.prefix_cache_stats.record(num_tokens=request.num_tokens, num_hits=num_hits,
                                           preempted=request.num_preemptions > 0)

    def make_prefix_cache_stats(self):
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache(self) -> bool:
        if not self.manager.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list:
        """jenga's KV events as vLLM's: ``group_idx`` the group, ``medium`` the tier (``"GPU"`` the
        device, ``"CPU"`` jenga's host tier: a demotion stores there, a host eviction removes), and
        on stored events the group's page kind as vLLM's own manager names it
        (``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``)."""
        if self.manager.prefix_lookup.index.events is None:  # events off: nothing recorded (read without
            return []                                        # holding a lookup's deferred hit: held at need)
        out = []
        kinds = self.event_kinds
        for e in self.manager.take_events():
            if isinstance(e, BlockStored):
                kind, window = kinds[e.group]
                out.append(ve.BlockStored(block_hashes=e.block_hashes, parent_block_hash=e.parent_block_hash,
                                          token_ids=e.token_ids, block_size=e.block_size, lora_id=None,
                                          medium=e.medium, lora_name=None, group_idx=e.group,
                                          kv_cache_spec_kind=kind, kv_cache_spec_sliding_window=window))
            elif isinstance(e, BlockRemoved):
                out.append(ve.BlockRemoved(block_hashes=e.block_hashes, medium=e.medium, group_idx=e.group))
            elif isinstance(e, AllBlocksCleared):
                out.append(ve.AllBlocksCleared())
        return out

    def __getattr__(self, name: str):
        # anything else of vLLM's manager (other connectors, P/D) is refused at engine start;
        # reaching it here means a path jenga does not cover
        raise AttributeError(f"jenga.vllm: vLLM called KVCacheManager.{name}, which jenga's adapter does not "
                             "provide (KV connectors other than jenga's host tier, disaggregated prefill)")
