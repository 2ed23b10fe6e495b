"""A clairvoyant ceiling on the prefix hit rate of a trace for a given pool (``vs_vllm_manager.py``).

Belady's rule (evict the block whose next use lies farthest ahead) serving the trace one
request at a time, in arrival order: the request's hit is the longest run of its prompt blocks
still cached (as the table's hit metric counts it: whole blocks, the last prompt token always
computed); while it runs, all its prompt and output blocks are held; after it its prompt blocks
stay cached and compete for the pool, outputs are dropped.  One request at a time leaves the
cache all of the pool that running requests would otherwise hold, and knowing every future
request beats any online policy, so this is the ceiling for a manager in the table's loop (a run
with many requests at once holds more private pages; the one thing it could gain, sharing pages a
request is still prefilling, needs a reuse closer than one prefill: articles64 reuses an article
64 admissions later).  Ties in next use go to
the deepest block first, so a cached prefix stays a prefix.

Defined where every block costs the same bytes: models whose layers all keep every prompt
token (full attention, or a sliding window at least as long as the longest prompt).  Elsewhere
(Gemma's 1k window, Mamba state) ``None``.
"""

from __future__ import annotations

import heapq

from manager_traces import BLOCK, TraceRequest

NEVER = 1 << 62


def bytes_per_block(model, longest_prompt: int) -> int | None:
    """Bytes of one 16-token block over all layers, or None where blocks differ in cost."""
    total = 0
    for g in model.groups:
        s = g.spec
        if s.kind == "mamba" or (s.kind == "sliding" and s.window < longest_prompt):
            return None
        if s.kind not in ("full", "sliding"):
            return None
        total += s.bytes_per_token() * g.num_layers * BLOCK
    return total


def belady_serial_hit(reqs: list[TraceRequest], pool_blocks: int) -> float:
    """Hit tokens / prompt tokens of the clairvoyant one-at-a-time cache (module doc).
    ``reqs`` carry ``block_ids`` (``BlockTrie``)."""
    order = sorted(reqs, key=lambda r: r.arrival_step)
    uses: dict[int, list[int]] = {}
    for i, r in enumerate(order):
        for node in r.block_ids.tolist():
            uses.setdefault(node, []).append(i)
    cursor = dict.fromkeys(uses, 0)
    depth = {node: d for r in order for d, node in enumerate(r.block_ids.tolist())}
    cached: dict[int, int] = {}  # node -> next use it is keyed by in the heap
    heap: list[tuple[int, int, int]] = []  # (-next use, -depth, node): farthest, deepest first
    hit = total = 0
    for r in order:
        ids = r.block_ids.tolist()
        n = 0
        limit = (len(r.tokens) - 1) // BLOCK
        while n < min(len(ids), limit) and ids[n] in cached:
            n += 1
        hit += n * BLOCK
        total += len(r.tokens)
        own = -(-(len(r.tokens) + r.output_len) // BLOCK)
        if own > pool_blocks:
            raise ValueError(f"request {r.request_id} needs {own} blocks, the pool has {pool_blocks}")
        for node in ids:  # this request's uses are now past: key every block by its next use
            cursor[node] += 1
            nxt = uses[node][cursor[node]] if cursor[node] < len(uses[node]) else NEVER
            cached[node] = nxt
            heapq.heappush(heap, (-nxt, -depth[node], node))
        # while running it holds `own` blocks; its prompt blocks are among them
        room = pool_blocks - (own - len(set(ids)))
        mine = set(ids)
        kept = []
        while len(cached) > room and heap:
            neg_next, neg_depth, node = heapq.heappop(heap)
            if cached.get(node) != -neg_next:
                continue  # a stale key
            if node in mine:
                kept.append((neg_next, neg_depth, node))
                continue
            del cached[node]
        for e in kept:
            heapq.heappush(heap, e)
        if len(heap) > 4 * max(len(cached), 1024):
            heap = [(-nxt, -depth[nd], nd) for nd, nxt in cached.items()]
            heapq.heapify(heap)
    return hit / max(total, 1)
