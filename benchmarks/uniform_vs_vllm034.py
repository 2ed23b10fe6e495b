"""``uniform`` (jenga's re-implementation of vLLM v1's manager rules) against vLLM 0.34's real
``KVCacheManager`` on the same traces: hit tokens, peak blocks used and preemptions.

Both managers are driven by one scheduling loop (``vs_vllm_manager.simulate``: a token budget per
step, running requests first, FCFS admission until an allocation fails, the latest admitted
request preempted when a running one cannot grow).  vLLM's side is built by vLLM's own planner at
the catalog model's real layout (``vllm_layouts``: its block size, its groups, its block count for
the byte budget) and takes its prefill chunks from the real scheduler's
``_mamba_block_aligned_split`` (block-aligned Mamba chunks, junction and tail stops).  ``uniform``
gets the same bytes (vLLM's block count times its page), the same settings
(``UniformSettings.from_vllm``: retention interval, ``prefix_match_unit``) and its own chunking
rule (``KVCacheManager.chunk_tokens``).  ``prefix_match_unit`` finer than a hybrid's block is
not modelled by ``uniform`` (refused), so no row sets it.

Run with the 0.34 python::

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=$PWD/src .vllm-envs/0.34.0/bin/python benchmarks/uniform_vs_vllm034.py

Columns: hit tokens (first admissions and re-admissions after a preemption), peak blocks held by
live requests (vLLM: distinct blocks in block tables; uniform: used bytes / page), preemptions,
each vLLM / uniform, and the largest relative difference of the three (the 1 % check).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from manager_sides import JengaSide, VllmSide  # noqa: E402
from manager_traces import TRACES, BlockTrie  # noqa: E402
from vllm_layouts import VllmSettings, scheduler  # noqa: E402
from vs_vllm_manager import simulate  # noqa: E402

#: rows: model, trace (with its keyword arguments), vLLM settings; small enough for a test
ROWS = {
    "gemma-short-r0": ("gemma-3-12b", "short", dict(n=120), VllmSettings(retention=0)),
    "gemma-articles-r0": ("gemma-3-12b", "articles16", dict(questions=4), VllmSettings(retention=0)),
    "gemma-articles-dense": ("gemma-3-12b", "articles16", dict(questions=4), VllmSettings(retention=None)),
    "gemma-chats-r64": ("gemma-3-12b", "round-robin", dict(sessions=4), VllmSettings(retention=64)),
    "llama-agent-r0": ("llama-3.1-8b", "agent", dict(sessions=4), VllmSettings(retention=0)),
    "jamba-prefix-r0": ("jamba-1.5-mini", "mamba-prefix", dict(n=24), VllmSettings(retention=0)),
    "jamba-prefix-dense": ("jamba-1.5-mini", "mamba-prefix", dict(n=24), VllmSettings(retention=None)),
    "jamba-short-r0": ("jamba-1.5-mini", "hybrid-short", dict(n=60), VllmSettings(retention=0)),
}
#: KV budget per row model (bytes): small enough that the pool fills and preempts
MEMORY = {"gemma-3-12b": 3 << 30, "llama-3.1-8b": 2 << 30, "jamba-1.5-mini": 6 << 30}
BUDGET, MAX_RUNNING = 2048, 64


class PeakSide:
    """A side whose peak of held blocks the loop records (``held_bytes`` runs once a step)."""

    def __init__(self, side, page: int):
        self.side, self.page, self.peak = side, page, 0

    def __getattr__(self, name):
        return getattr(self.side, name)

    def held_bytes(self):
        held, stranded = self.side.held_bytes()
        self.peak = max(self.peak, held // self.page)
        return held, stranded


class Vllm034Side(VllmSide):
    """vLLM's real ``KVCacheManager`` as its ``Scheduler`` builds it, planned by vLLM's planner."""

    def __init__(self, model, memory: int, settings: VllmSettings, max_model_len: int):
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils as ku
        sched, hash_block = scheduler("vllm", model, settings, memory, max_model_len=max_model_len,
                                      batched_tokens=BUDGET, max_seqs=MAX_RUNNING)
        self.sched, self.mgr, self.config = sched, sched.kv_cache_manager, sched.kv_cache_config
        self.page = self.config.kv_cache_groups[0].kv_cache_spec.page_size_bytes * max(
            len(g.layer_names) for g in self.config.kv_cache_groups)
        self.page = self.config.kv_cache_tensors[0].size // self.config.num_blocks if self.config.kv_cache_tensors \
            else self.page
        self.block, self.sched_block, self.hash_block = sched.block_size, sched.block_size, hash_block
        hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
        ku.init_none_hash(hash_fn)
        self.hasher = ku.get_request_block_hasher(hash_block, hash_fn)
        self.split = None
        if sched.need_mamba_block_aligned_split:
            self.split_shim = sched
            self.split = type(sched)._mamba_block_aligned_split
        self.reqs, self.pending = {}, {}

    def pool_bytes(self) -> int:
        return self.config.num_blocks * self.page

    def held_bytes(self) -> tuple[int, int]:
        """Blocks out of the free queue (held by a request: its block table, or a copy-on-write
        partial block), as vLLM's KV-cache usage counts them."""
        pool = self.mgr.block_pool
        used = (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * self.page
        return used, used


def run_row(key: str, mutant: dict | None = None) -> dict:
    """Both sides on row ``key``; returns {side: (hit tokens, peak blocks, preemptions)} and the blocks."""
    from jenga.baselines import make_manager
    from jenga.baselines.uniform_settings import UniformSettings
    from jenga.core.specs import ModelSpec
    name, trace, kw, settings = ROWS[key]
    model = ModelSpec.from_hf_config(name, vision=False)
    reqs = TRACES[trace](**kw)
    BlockTrie(reqs)  # the block ids the loop's needed-bytes count reads
    longest = max(len(r.tokens) + r.output_len for r in reqs)
    max_len = -(-longest // 4096) * 4096
    vside = Vllm034Side(model, MEMORY[name], settings, max_len)
    uset = UniformSettings.from_vllm(vside.sched.vllm_config, vside.config)
    if mutant:
        uset = uset.replace(**mutant)
    jside = JengaSide.__new__(JengaSide)
    jside.mgr = make_manager("uniform", model, vside.pool_bytes(), enable_prefix_caching=True, settings=uset)
    jside.crc, jside.allocs = None, 0
    upage = jside.mgr.large_page_bytes
    out = dict(blocks=(vside.config.num_blocks - 1, jside.mgr.total_bytes // upage),
               block_size=(vside.block, jside.mgr.model.groups[0].tokens_per_page), n=len(reqs))
    for label, side, page in (("vllm", vside, vside.page), ("uniform", jside, upage)):
        peak = PeakSide(side, page)
        m = simulate(peak, model, reqs, BUDGET, MAX_RUNNING)
        out[label] = dict(hit=m["hit"] + m["rehit"], first_hit=m["hit"], peak=peak.peak, preempt=m["preempt"],
                          steps=m["steps"])
    return out


def worst_gap(res: dict) -> float:
    """The largest relative difference over hit tokens, peak blocks and preemptions."""
    gaps = []
    for k in ("hit", "peak", "preempt"):
        v, u = res["vllm"][k], res["uniform"][k]
        gaps.append(abs(u - v) / max(v, 1) if (u or v) else 0.0)
    return max(gaps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated: " + ", ".join(ROWS))
    a = p.parse_args(argv)
    head = ["row", "blocks vLLM / uniform", "block tokens", "hit tokens vLLM / uniform", "peak blocks vLLM / uniform",
            "preemptions vLLM / uniform", "worst gap"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head), flush=True)
    worst = 0.0
    for key in a.rows.split(","):
        res = run_row(key)
        v, u = res["vllm"], res["uniform"]
        gap = worst_gap(res)
        worst = max(worst, gap)
        print(f"| {key} | {res['blocks'][0]} / {res['blocks'][1]} | {res['block_size'][0]} / {res['block_size'][1]} | "
              f"{v['hit']} / {u['hit']} | {v['peak']} / {u['peak']} | {v['preempt']} / {u['preempt']} | "
              f"{100 * gap:.2f} % |", flush=True)
    print(f"worst gap over the rows: {100 * worst:.2f} % ({'within' if worst <= 0.01 else 'beyond'} 1 %)")
    return 0 if worst <= 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
