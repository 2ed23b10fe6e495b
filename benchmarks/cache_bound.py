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

``belady_serial_hit`` is defined where every block costs the same bytes: models whose layers all
keep every prompt token (full attention, or a sliding window at least as long as the longest
prompt).  Elsewhere (Gemma's 1k window, Mamba state) ``bridged_hit_bound`` bounds the same
one-at-a-time ceiling from above.
"""

from __future__ import annotations

import heapq

from manager_traces import BLOCK, BlockTrie, TraceRequest

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


def block_costs(model) -> list[tuple[str, int, int]] | None:
    """Per group: (what a hit of n blocks needs of it, bytes per block or state, window blocks):
    ``full`` every block, ``window`` the blocks of the window before the hit, ``state`` one
    state; None for a kind this bound does not model (chunked local, vision)."""
    out = []
    for g in model.groups:
        s = g.spec
        if s.kind == "mamba":
            out.append(("state", s.state_bytes() * g.num_layers, 1))
        elif s.kind == "full":
            out.append(("full", s.bytes_per_token() * g.num_layers * BLOCK, 0))
        elif s.kind == "sliding":
            out.append(("window", s.bytes_per_token() * g.num_layers * BLOCK, -(-(s.window - 1) // BLOCK)))
        else:
            return None
    return out


def _hit_bytes(costs, n: int) -> int:
    """Bytes a hit of ``n`` blocks needs cached: every full-attention block, the sliding pages of
    the window before it, one state."""
    return sum(b * (n if kind == "full" else 1 if kind == "state" else min(n, w)) for kind, b, w in costs)


def _own_bytes(costs, tokens: int) -> int:
    """Bytes a running request of ``tokens`` (prompt + output) holds at least: every full-attention
    block, its last window (whole blocks), its state."""
    return sum(b * (-(-tokens // BLOCK) if kind == "full" else 1 if kind == "state" else min(tokens // BLOCK, w))
               for kind, b, w in costs)


def bridged_hit_bound(reqs: list[TraceRequest], model, memory: int, after_uses: int = 1) -> float | None:
    """An upper bound on the hit rate of serving ``reqs`` one request at a time in arrival order
    with ``memory`` bytes, where blocks differ in cost (a sliding window's pages are needed only
    before the hit point, a Mamba state once): defined where ``belady_serial_hit`` is not.

    A hit of request j on n blocks whose first block was last used by request i (before j),
    where i used all n blocks and no request between i and j uses any of them (a *bridge*),
    needs those blocks' pages cached at every moment between i and j: nobody in between can
    recompute them.  At a moment k strictly inside some bridges, those bridges' pages are
    disjoint (two bridges sharing a block would each be used inside the other) and disjoint from
    request k's own pages, which it holds while it runs; so the bridges' bytes fit in ``memory``
    minus request k's own.  A hit of m < n blocks needs at least m/n of the bridge's bytes (the
    window and the state are a fixed part), so each such moment gives a fractional knapsack over
    the bridges spanning it (value: hit tokens).  Bridges are stabbed greedily (earliest end
    first, at the moment just before it) so each is counted at one moment; a hit that is no
    bridge, or spans no moment, counts in full.  Any choice of moments is sound; this one is
    tight for a cyclic trace (articles64: equal to ``belady_serial_hit`` where both exist).

    ``after_uses`` > 1 counts only bridges whose first block had been used by at least that many
    requests up to i: with 2, the bound of a policy that keeps no prefix used once over a later
    request's pages (a scan-resistant one: one-off pages go before pages reused).  Where the two
    bounds differ, the hits between them need pages kept on no evidence of reuse."""
    costs = block_costs(model)
    if costs is None:
        return None
    order = sorted(reqs, key=lambda r: r.arrival_step)
    first_user: dict[int, int] = {}  # first block's node -> latest request using it
    first_uses: dict[int, int] = {}  # first block's node -> requests that used it
    users: dict[int, int] = {}  # any node -> latest request using it
    bridges, whole, total = [], 0, 0
    for j, r in enumerate(order):
        ids = r.block_ids.tolist()
        total += len(r.tokens)
        n, limit = 0, (len(r.tokens) - 1) // BLOCK
        while n < min(len(ids), limit) and ids[n] in users:
            n += 1
        if n:
            i = first_user[ids[0]]
            if users[ids[n - 1]] == i:  # i used the whole hit, and nobody since used its first block
                if j - i < 2 or first_uses[ids[0]] >= after_uses:  # (no moment inside: no page kept)
                    bridges.append((j, i, n * BLOCK, _hit_bytes(costs, n)))
            else:
                whole += n * BLOCK
        if ids:
            first_user[ids[0]] = j
            first_uses[ids[0]] = first_uses.get(ids[0], 0) + 1
        for node in ids:
            users[node] = j
    bridges.sort()
    bound = float(whole)
    while bridges:
        j, i = bridges[0][:2]
        if j - i < 2:  # no moment strictly inside
            bound += bridges.pop(0)[2]
            continue
        k = j - 1
        mine = [b for b in bridges if b[1] < k < b[0]]
        bridges = [b for b in bridges if not b[1] < k < b[0]]
        room = max(0, memory - _own_bytes(costs, len(order[k].tokens) + order[k].output_len))
        for _, _, value, cost in sorted(mine, key=lambda b: -b[2] / b[3]):
            take = min(1.0, room / cost)
            bound += take * value
            room -= take * cost
            if room <= 0:
                break
    return bound / max(total, 1)


def main(argv=None) -> int:
    """Print both bounds of ``bridged_hit_bound`` (every bridge; prefixes reused before) per row."""
    import argparse

    from vs_vllm_manager import budget_of, scaled

    from jenga.core.specs import ModelSpec
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("rows", help="comma-separated model:trace, e.g. gemma-3-12b:articles64")
    for row in p.parse_args(argv).rows.split(","):
        name, trace = row.split(":")
        model = ModelSpec.from_hf_config(name, vision=False)
        memory, _ = budget_of(name, None)
        reqs = scaled(trace, 1.0)
        BlockTrie(reqs)
        bounds = [bridged_hit_bound(reqs, model, memory, u) for u in (1, 2)]
        print(f"{row}: one-at-a-time bound {_pct(bounds[0])}, without first-use bridges {_pct(bounds[1])}")
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


if __name__ == "__main__":
    raise SystemExit(main())
