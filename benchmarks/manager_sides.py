"""The two managers behind one small interface for ``vs_vllm_manager.py``: jenga's
``KVCacheManager`` and vLLM v1's own ``KVCacheManager`` (imported only when asked for).

vLLM's side uses vLLM's own helpers: ``unify_kv_cache_spec_page_size`` and
``_get_kv_cache_groups_uniform_page_size`` (equal-page groups), ``resolve_kv_cache_block_sizes``,
``get_request_block_hasher`` (sha256, vLLM's default) and, for Mamba, the scheduler's
``_mamba_block_aligned_split``.  The Mamba/attention block-size unification lives in
``Platform._align_hybrid_block_size``-style code that needs a model class, so it is mirrored
here: attention block = 16 * ceil(mamba page / (16 * attention page per token)), Mamba page padded
to it, ``mamba_cache_mode="align"`` (vLLM's default with prefix caching).
"""

from __future__ import annotations

import math
import zlib
from types import SimpleNamespace


def tables_bytes(rid, n, t) -> bytes:
    """One allocate's call and result as bytes, for ``--checksum``: the page ids of every group's table
    (token pages with their ``None`` holes, image pages and fills, state work / read / checkpoint pages)."""
    if t is None:
        return repr((rid, n, None)).encode()
    parts = [rid, n, t.num_computed, t.num_new, t.num_lookahead]
    for g in t.groups:
        if hasattr(g, "page_ids"):
            parts.append((g.group, g.tokens_per_page, g.write_from, g.page_ids))
        elif hasattr(g, "pages"):
            parts.append((g.group, sorted(g.pages.items()), sorted(g.to_fill)))
        else:
            parts.append((g.group, g.work_page, g.read_page, sorted(g.checkpoints.items())))
    return repr(parts).encode()


class JengaSide:
    name = "jenga"

    def __init__(self, model, memory: int, caching: bool = True, checksum: bool = False):
        from jenga import KVCacheManager
        self.mgr = KVCacheManager(model, memory, tokens_per_page=16, enable_prefix_caching=caching)
        self.crc = 0 if checksum else None  # CRC-32 over every allocate's returned page tables
        self.allocs = 0

    def add(self, rid, tokens) -> int:
        self.mgr.add_request(rid, tokens)
        return self.mgr.lookup(rid)

    def clip(self, rid, n, hit=0) -> int:  # jenga's scheduler rule (jenga.core.manager.cache_control), as vLLM's side
        return self.mgr.chunk_tokens(rid, n)

    def step(self) -> None:
        pass

    def allocate(self, rid, n, first=False) -> bool:
        t = self.mgr.allocate(rid, n)
        if self.crc is not None:
            self.crc = zlib.crc32(tables_bytes(rid, n, t), self.crc)
            self.allocs += 1
        return t is not None

    def commit(self, rid, n, tok) -> None:
        self.mgr.append_tokens(rid, [] if tok is None else [tok])

    def cancel(self, rid) -> None:
        self.mgr.free(rid)

    free = preempt = cancel

    def held_bytes(self) -> tuple[int, int]:
        """(pages held by live requests, the same plus free slots stranded in carved large pages): the
        two figures of ``stats()`` it needs, without the rest (the needed bytes cost O(held pages))."""
        used = self.mgr.used_bytes
        return used, used + self.mgr.stranded_bytes

    def pool_bytes(self) -> int:
        return self.mgr.total_bytes

    def describe(self) -> str:
        m = self.mgr
        return (f"{len(m.model.groups)} groups, pages {[g.page_bytes for g in m.model.groups]} B, "
                f"large page {m.large_page_bytes} B x {m.total_bytes // m.large_page_bytes}")


class VllmSide:
    name = "vllm"

    def __init__(self, model, memory: int, budget: int, retention: int | None = 0, block: int = 16,
                 caching: bool = True):
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
            mamba_kw = dict(shapes=tuple(s.shapes), dtypes=tuple(dt[d] for d in s.dtypes),
                            mamba_cache_mode="align" if caching else "none")
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
            cache_config=SimpleNamespace(block_size=block, prefix_match_unit=None, enable_prefix_caching=caching),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1), kv_transfer_config=None)
        sched_block, hash_block = ku.resolve_kv_cache_block_sizes(self.config, shim)
        self.mgr = KVCacheManager(self.config, max_model_len=model.max_model_len,
                                  scheduler_block_size=sched_block, hash_block_size=hash_block,
                                  max_in_flight_tokens=budget, enable_caching=caching)
        hash_fn = get_hash_fn_by_name("sha256")
        ku.init_none_hash(hash_fn)
        # vLLM's engine core makes no block hasher without prefix caching (and no KV connector)
        self.hasher = ku.get_request_block_hasher(hash_block, hash_fn) if caching else None
        self.block, self.sched_block, self.hash_block = block, sched_block, hash_block
        self.split = None
        if self.config.has_mamba_layers and caching:
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

    def held_bytes(self) -> tuple[int, int]:  # distinct blocks in live requests' block tables
        ids = {b.block_id for rid in self.reqs for grp in self.mgr.coordinator.get_blocks(rid)
               for b in grp if not b.is_null}
        pool = self.mgr.block_pool
        assert len(ids) == pool.num_gpu_blocks - 1 - pool.get_num_free_blocks(), "block tables vs pool"
        return len(ids) * self.page, len(ids) * self.page

    def pool_bytes(self) -> int:
        return self.config.num_blocks * self.page

    def describe(self) -> str:
        g = self.config.kv_cache_groups
        return (f"retention {self.config.prefix_cache_retention_interval}, {len(g)} groups of {len(g[0].layer_names)} layers, block {self.block} tokens "
                f"(scheduler {self.sched_block}, hash {self.hash_block}), page {self.page} B x {self.config.num_blocks}")
