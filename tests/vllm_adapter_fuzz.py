"""A seeded fuzz of jenga's vLLM adapter (``jenga.vllm.adapter.JengaKVCacheAdapter``, the object
``JengaScheduler`` puts in place of vLLM's ``KVCacheManager``), driven by random sequences of the
calls vLLM's scheduler makes, in its order, on real vLLM ``Request`` objects.

One operation is one scheduler step (``Scheduler.schedule`` then ``update_from_output``) or one
event between steps:

* a step: ``new_step_starts``; running requests first (``allocate_slots(request, n,
  num_lookahead_tokens=k)`` for their next tokens and drafts; ``None`` preempts the newest running
  request, ``free`` then back to the waiting queue with ``num_computed_tokens = 0``, and tries
  again); then, unless something was preempted, waiting ones (``get_num_cached_tokens`` as the
  cache-aware admission asks, ``get_computed_blocks``, ``allocate_slots`` with
  ``num_new_computed_tokens`` / ``new_computed_blocks``, the lookahead and
  ``full_sequence_must_fit`` (checked with the prefill reserve on in about half the runs); a chunk clipped by the token budget and, for Mamba's align mode, by
  vLLM's own ``_mamba_block_aligned_split``), ``get_blocks`` for a new request's block table,
  ``record_prefix_cache_stats``, ``take_kv_cache_block_copies``; then vLLM's bookkeeping
  (``num_computed_tokens += n``), the model's output (sampled ids, accepted and rejected drafts:
  ``num_computed_tokens -= num_rejected``, new drafts) and finished requests (``free``);
* between steps: a new request, an abort (``free`` of a waiting or running request),
  ``cache_blocks``, ``reset_prefix_cache`` (vLLM's with ``reset_running_requests``: every running
  request preempted first), ``take_events``, ``make_prefix_cache_stats``.

Checked after every operation: the manager's ``check_integrity()``; each running request's block
table as the worker holds it (the ids of its first ``get_blocks`` plus every ``allocate_slots``
answer, append-only) has a slot for every token scheduled and its lookahead, and still matches ``get_block_ids`` (a column may only turn into the null block:
a page out of the window let go); every block id a running request holds is a live page (its
group's reference count > 0); no block id sits in two columns, nor in two requests unless both
hold the same tokens (and salt) through that block (a shared prefix); no two live pages share a
byte of the workers' buffer (``vllm_kv_bytes.LivePages``); without a host tier,
``get_num_cached_tokens`` answers what ``get_computed_blocks`` then finds; KV events only remove
blocks they stored; ``usage`` in [0, 1]; and at the end, every request freed, no page is held.

``python tests/vllm_adapter_fuzz.py --ops N`` runs it alone; ``benchmarks/op_fuzz_long.py`` runs
it with the manager fuzz (``op_fuzz.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from op_fuzz import count_host, run_one  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.distributed import kv_events as ve  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm_async_driver import async_config, kv_config, make_scheduler  # noqa: E402
from vllm_kv_bytes import BufferLayout, LivePages  # noqa: E402
from vllm_support import model_dir  # noqa: E402

from jenga.errors import InsufficientMemoryError  # noqa: E402
from jenga.vllm import JengaScheduler  # noqa: E402
from jenga.vllm.adapter import NULL_BLOCK, JengaKVCacheAdapter  # noqa: E402
from jenga.vllm.plan import rewrite_config  # noqa: E402

BLOCK = 16
MAX_LEN = 128
LAYOUTS = {
    "full": ["full", "full"],
    "full+swa": ["full", ("sliding", 32)],
    "full+chunked": ["full", ("chunked", 32)],
    "full+mamba": ["full", "mamba"],
}
#: KV budgets, in vLLM blocks of every layer (the smallest that hold one MAX_LEN request are kept)
BUDGETS = (10, 14, 20, 32)
BASES = [list(range(1, 121)), list(range(1, 41)) + list(range(200, 280)), list(range(300, 420))]


class Layouts:
    """vLLM configs, KV-cache configs (jenga's page-layer rewrite) and one real ``JengaScheduler``
    per layout and budget, built once per process (the scheduler's own start checks refuse a
    budget where one ``MAX_LEN`` request cannot run; its ``_mamba_block_aligned_split`` clips
    prefill chunks as vLLM does)."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="jenga-adapter-fuzz-"))
        self.path = model_dir("llama", self.root)

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one per process)
    def get(self, layout: str, budget: int):
        cfg = async_config(self.path, block_size=BLOCK, max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN)
        cfg.scheduler_config.async_scheduling = False
        kv = rewrite_config(kv_config(cfg, LAYOUTS[layout], budget), MAX_LEN)
        try:
            sched, hash_block = make_scheduler(JengaScheduler, cfg, kv)
        except InsufficientMemoryError:
            return None
        return cfg, kv, sched, hash_block

    def usable(self, layout: str) -> list[int]:
        return [b for b in BUDGETS if self.get(layout, b) is not None]


@functools.lru_cache(maxsize=1)
def layouts() -> Layouts:
    return Layouts()


def configurations() -> list[tuple[str, bool, int]]:
    """(layout, host tier, lookahead k): every layout, jenga's host tier (attention layouts),
    speculative lookahead (k = 2)."""
    out = []
    for layout in LAYOUTS:
        for k in (0, 2):
            out.append((layout, False, k))
            if layout != "full+mamba":
                out.append((layout, True, k))
    return out


class AdapterFuzz:
    """One adapter under random scheduler call sequences (module doc); ``seen`` counts what happened."""

    def __init__(self, layout: str, seed: int, *, host: bool, k: int):
        self.rng = rng = random.Random(seed)
        self.layout, self.k = layout, k
        budget = rng.choice(layouts().usable(layout))
        cfg, kv, sched, hash_block = layouts().get(layout, budget)
        self.sched = sched  # vLLM's own chunk rules (never scheduled)
        self.caching = rng.random() < 0.85
        plan = kv.jenga_plan
        lp = sched.kv_cache_manager.manager.large_page_bytes
        self.a = JengaKVCacheAdapter(
            plan, kv, max_model_len=MAX_LEN, enable_caching=self.caching, log_stats=True,
            enable_kv_cache_events=True, hash_block_size=hash_block,
            host_memory_bytes=rng.randrange(2, 8) * lp if host else None, max_step_tokens=MAX_LEN,
            # both admission checks, drawn from a stream of their own (the run's draws stay as they were)
            reserve_prefills=random.Random(2 * seed + 1).random() < 0.5)
        self.mgr = self.a.manager
        self.host = host
        self.mamba_split = sched.need_mamba_block_aligned_split
        hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(hash_block, hash_fn)
        self.state = [not g.spec.per_token for g in self.mgr.model.groups]  # block-table rows, not pages
        self.layout_bytes = BufferLayout(kv)
        self.live_bytes = LivePages(self.layout_bytes)
        self.plan = plan
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.tables: dict[str, list[list[int]]] = {}  # the worker's block tables (append-only)
        self.lens: dict[str, int] = {}  # request -> the length it finishes at
        self.stored: set = set()  # KV events: (group, medium, block hash) stored and not removed
        self.next_id = 0
        self.seen: Counter = Counter()
        self.done = 0
        self._host_seen: dict[str, int] = {}

    # ------------------------------------------------------------------ requests
    def add(self):
        rng = self.rng
        base = rng.choice(BASES)
        prompt = base[:rng.randrange(1, 100)] + [rng.randrange(500, 505) for _ in range(rng.randrange(0, 6))]
        rid = f"r{self.next_id}"
        self.next_id += 1
        out = rng.randrange(1, 12)
        self.lens[rid] = min(MAX_LEN, len(prompt) + out)
        req = Request(rid, prompt, SamplingParams(temperature=0, max_tokens=out, ignore_eos=True), None,
                      cache_salt=rng.choice([None, None, None, "tenant"]), block_hasher=self.hasher)
        self.waiting.append(req)
        self.seen["requests"] += 1

    def _free(self, req: Request):
        self.a.free(req)
        self.tables.pop(req.request_id, None)

    def finish(self, req: Request):
        """vLLM's ``_free_request``: the finished request's blocks go to the connector, then ``free``."""
        self.a.get_block_ids_for_computed_tokens(request_id=req.request_id, num_computed_tokens=req.num_computed_tokens)
        self.a.remove_skipped_blocks(request_id=req.request_id, processed_computed_tokens=req.num_computed_tokens,
                                     num_prompt_tokens=req.num_prompt_tokens)
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.running.remove(req)
        self._free(req)
        self.seen["finished"] += 1

    def preempt(self, req: Request):
        """vLLM's ``_preempt_request``: free, forget the computed tokens and drafts, wait at the front."""
        self.running.remove(req)
        self._free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.seen["preempted"] += 1

    def abort(self):
        rng = self.rng
        pool = self.running + list(self.waiting)
        if not pool:
            return
        req = rng.choice(pool)
        if req in self.running:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._free(req)
        self.seen["aborted"] += 1

    # ------------------------------------------------------------------ a step
    def _chunk(self, req: Request, n: int, hit: int) -> int:
        if self.mamba_split and n:
            n = self.sched._mamba_block_aligned_split(req, n, hit)
        return n

    def step(self):
        rng, a = self.rng, self.a
        a.new_step_starts()
        budget = rng.choice([MAX_LEN, MAX_LEN, 48, 24, 8])
        scheduled: dict[str, int] = {}
        drafts: dict[str, list[int]] = {}  # request -> its drafts scheduled this step
        preempted = False
        for req in list(self.running):
            if req not in self.running or budget <= 0:
                continue
            n = min(req.num_tokens_with_spec - req.num_computed_tokens, budget, MAX_LEN - req.num_computed_tokens)
            n = self._chunk(req, n, 0)
            if n <= 0:
                continue
            while True:
                blocks = a.allocate_slots(req, n, num_lookahead_tokens=self.k)
                if blocks is not None:
                    break
                victim = self.running[-1]
                scheduled.pop(victim.request_id, None)
                drafts.pop(victim.request_id, None)
                self.preempt(victim)
                preempted = True
                if victim is req:
                    break
            if blocks is None:
                continue
            self._extend(req, blocks)
            scheduled[req.request_id] = n
            budget -= n
            # the drafts scheduled with it (a budget may cut them); the rest are dropped
            drafts[req.request_id] = req.spec_token_ids[:max(0, n + req.num_computed_tokens - req.num_tokens)]
            req.spec_token_ids = []
        while self.waiting and budget > 0 and not preempted and len(self.running) < 8:
            req = self.waiting[0]
            peek = a.get_num_cached_tokens(req) if rng.random() < 0.5 else None
            blocks, hit, junction = a.get_computed_blocks(req)
            req.shared_prefix_boundary = junction  # vLLM's _get_local_prefix_cache_hit
            if peek is not None and not self.host:
                assert peek == hit, f"get_num_cached_tokens {peek} but get_computed_blocks {hit}"
            self.seen["hit tokens"] += hit
            n = self._chunk(req, min(req.num_tokens - hit, budget), hit)
            if n <= 0:
                break
            new = a.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                   num_lookahead_tokens=self.k, full_sequence_must_fit=rng.random() < 0.5,
                                   has_scheduled_reqs=bool(self.running))
            if new is None:
                self.seen["admission refused"] += 1
                if not self.running:
                    assert not scheduled, "a stall"
                    self.seen["admission refused alone"] += 1
                break
            a.record_prefix_cache_stats(req, hit)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = hit
            self.running.append(req)
            self.tables[req.request_id] = [list(ids) for ids in a.get_blocks(req.request_id).get_block_ids()]
            scheduled[req.request_id] = n
            budget -= n
        a.take_kv_cache_block_copies()
        if self.host:
            self.seen["copies"] += not self.mgr.take_copy_plan().empty
            count_host(self.mgr.host, self._host_seen, self.seen)
        for rid, n in scheduled.items():  # _update_after_schedule
            self.req(rid).num_computed_tokens += n
        self.seen["scheduled tokens"] += sum(scheduled.values())
        self.check_running(scheduled)
        for rid in scheduled:  # update_from_output
            req = self.req(rid)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk: nothing sampled
            sent = drafts.get(rid, [])
            accepted = rng.randrange(0, len(sent) + 1) if sent else 0
            req.num_computed_tokens -= len(sent) - accepted
            self.seen["drafts rejected"] += len(sent) - accepted
            self.seen["drafts accepted"] += accepted
            room = self.lens[rid] - req.num_tokens
            req.append_output_token_ids((sent[:accepted] + [rng.randrange(500, 505)])[:max(1, room)])
            if req.num_tokens >= self.lens[rid]:
                self.finish(req)
            elif self.k:
                req.spec_token_ids = [rng.randrange(500, 505) for _ in range(min(self.k, self.lens[rid] - req.num_tokens - 1))]

    def req(self, rid: str) -> Request:
        return next(r for r in self.running if r.request_id == rid)

    def _extend(self, req: Request, blocks):
        for row, ids in zip(self.tables[req.request_id], blocks.get_block_ids(), strict=True):
            row.extend(ids)

    # ------------------------------------------------------------------ checks
    def check_running(self, scheduled=()):
        """The worker's tables against the adapter, liveness, sharing, bytes (module doc)."""
        a, mgr = self.a, self.mgr
        ref = mgr.ref
        scale, off = self.plan.exec_scale, self.plan.exec_offset
        owner: dict[tuple[int, int], tuple[str, int]] = {}
        live: set[tuple[int, int]] = set()
        for req in self.running:
            rid = req.request_id
            now = a.get_block_ids(rid)
            worker = self.tables[rid]
            for g, (w, cur) in enumerate(zip(worker, now, strict=True)):
                if self.state[g]:
                    assert w == cur[:len(w)], f"{rid} group {g}: state row {cur} changed under the worker's {w}"
                    if cur:
                        live.add((g, cur[-1]))
                    continue
                assert len(w) == len(cur), f"{rid} group {g}: the worker has {len(w)} blocks, the adapter {len(cur)}"
                tpp = mgr.model.groups[g].tokens_per_page
                # this step's tokens and, when it ran, its lookahead (the next drafts' slots)
                want = min(MAX_LEN, req.num_computed_tokens + (self.k if rid in scheduled else 0))
                assert len(w) * tpp >= want, (
                    f"{rid} group {g}: {want} tokens scheduled with the lookahead, slots for {len(w) * tpp}")
                for i, (wb, cb) in enumerate(zip(w, cur, strict=True)):
                    if cb == NULL_BLOCK:
                        continue
                    assert wb == cb, f"{rid} group {g} column {i}: block {cb}, the worker has {wb}"
                    page, rem = divmod(cb - off, scale[g])
                    assert rem == 0 and ref[g][page] > 0, f"{rid} group {g}: block {cb} (page {page}) is not live"
                    live.add((g, cb))
                    other = owner.setdefault((g, cb), (rid, i))
                    if other != (rid, i):
                        self._shared(g, cb, (rid, i), other)
        self.live_bytes.update(live)
        self.seen["blocks checked"] += len(live)

    def _shared(self, g: int, block: int, one: tuple[str, int], two: tuple[str, int]):
        assert one[0] != two[0], f"{one[0]}: block {block} of group {g} in columns {one[1]} and {two[1]}"
        assert one[1] == two[1], f"block {block} of group {g}: column {one[1]} of {one[0]}, {two[1]} of {two[0]}"
        ra, rb = self.req(one[0]), self.req(two[0])
        end = (one[1] + 1) * self.mgr.model.groups[g].tokens_per_page
        same = (ra.num_tokens >= end and rb.num_tokens >= end and ra.all_token_ids[:end] == rb.all_token_ids[:end]
                and ra.cache_salt == rb.cache_salt)
        assert same, f"block {block} of group {g} held by {one[0]} and {two[0]}, whose tokens through {end} differ"
        self.seen["shared blocks"] += 1

    def events(self):
        for e in self.a.take_events():
            if isinstance(e, ve.BlockStored):
                for h in e.block_hashes:
                    self.stored.add((e.group_idx, e.medium, h))
                self.seen["events stored"] += len(e.block_hashes)
            elif isinstance(e, ve.BlockRemoved):
                for h in e.block_hashes:
                    key = (e.group_idx, e.medium, h)
                    assert key in self.stored, f"KV event removes {key}, never stored"
                    self.stored.discard(key)
                self.seen["events removed"] += len(e.block_hashes)
            elif isinstance(e, ve.AllBlocksCleared):
                self.stored.clear()

    def reset(self):
        for req in list(self.running):  # vLLM's reset_prefix_cache(reset_running_requests=True)
            self.preempt(req)
        self.seen["reset" if self.a.reset_prefix_cache() else "reset refused"] += 1

    # ------------------------------------------------------------------ the loop
    def run(self, ops: int) -> int:
        rng, a = self.rng, self.a
        for _ in range(ops):
            self.done += 1  # counted once started: a run failing its first operation still moves the fuzz on
            r = rng.random()
            if (r < 0.2 or not (self.waiting or self.running)) and len(self.waiting) + len(self.running) < 10:
                self.add()
            elif r < 0.85:
                self.step()
            elif r < 0.9:
                self.abort()
            elif r < 0.95 and self.running:
                req = rng.choice(self.running)
                a.cache_blocks(req, req.num_computed_tokens)
            elif r < 0.96:
                self.reset()
            else:
                a.make_prefix_cache_stats()
            if rng.random() < 0.3:
                self.events()
            assert 0.0 <= a.usage <= 1.0, f"usage {a.usage}"
            self.mgr.check_integrity()
        for req in list(self.running):
            self.finish(req)
        while self.waiting:
            self._free(self.waiting.popleft())
        if self.host:
            self.mgr.take_copy_plan()
            count_host(self.mgr.host, self._host_seen, self.seen)
        self.events()
        self.mgr.check_integrity()
        assert not self.mgr.requests, f"requests left in jenga: {list(self.mgr.requests)}"
        assert not a._sent and not a._rows and not a._views, "the adapter kept rows or views of freed requests"
        assert self.mgr.used_bytes == 0, f"{self.mgr.used_bytes} bytes held after every request was freed"
        self.seen["ops"] += ops
        return ops


def fuzz(total_ops: int, seed: int = 0, runs_of: int = 500, deadline: float | None = None,
         report=None, start: int = 0) -> tuple[int, list[str], Counter]:
    """``total_ops`` operations over every configuration in runs of ``runs_of`` (a fresh adapter
    each); returns (operations run, violations, what happened).  Stops early at ``deadline``.
    ``start``: the first run's number (its configuration and seed): a slice of a longer fuzz."""
    confs = configurations()
    done, violations, seen = 0, [], Counter()
    i = start
    while done < total_ops and (deadline is None or time.time() < deadline):
        layout, host, k = confs[i % len(confs)]
        run_seed = seed * 1_000_003 + i
        n = min(runs_of, total_ops - done)
        f = AdapterFuzz(layout, run_seed, host=host, k=k)
        done += run_one(f, n, f"vllm {layout} host={host} k={k} seed={run_seed}", f"vllm {layout}", "vllm ",
                        host, k, violations, seen)
        i += 1
        if report is not None and (i - start) % 20 == 0:
            report(done, violations, seen)
    return done, violations, seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=float, default=1e5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="the first run's number (a slice of a longer fuzz)")
    ap.add_argument("--json", action="store_true", help="print one JSON object: ops, violations, what happened")
    args = ap.parse_args(argv)
    t0 = time.time()
    done, violations, seen = fuzz(int(args.ops), args.seed, start=args.start)
    if args.json:
        print(json.dumps({"ops": done, "violations": violations, "seen": dict(seen), "cpu_s": time.process_time()}))
        return 1 if violations else 0
    print(f"{time.time() - t0:.0f}s {done:,} ops, {len(violations)} violations; {dict(seen)}")
    for v in violations[:20]:
        print(v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
