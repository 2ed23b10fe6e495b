"""Seeded synthetic traces for the manager-vs-manager benchmark, and the byte accounting
both managers are judged by (``vs_vllm_manager.py``).

A trace is a list of :class:`TraceRequest` (token ids, output length, the scheduler step it
arrives at).  Every prompt is a list of *segments*: a shared segment (a few-shot prefix, an
article, an earlier turn) has the same token ids wherever it appears, so the block trie built
here knows exactly which 16-token blocks two prompts share.

*Needed* bytes of a step (measured after the step's allocations): per live request, full
layers every token up to the end of the step, sliding layers the window before the step's first
new token plus every token the step computes, one state per state layer; a block shared by
live requests counts once (so a duplicate copy of a prefix is waste).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 16
VOCAB = 32000


@dataclass(slots=True)
class TraceRequest:
    request_id: str
    tokens: np.ndarray  # int64 prompt ids
    output_len: int
    arrival_step: int = 0
    block_ids: np.ndarray | None = None  # trie node of each full prompt block (set by BlockTrie)


def _ids(rng_key: tuple, n: int) -> np.ndarray:
    return np.random.default_rng(list(rng_key)).integers(1, VOCAB, size=n, dtype=np.int64)


class Segments:
    """Token ids of named segments: the same (kind, index) always gives the same ids."""

    def __init__(self, seed: int):
        self.seed, self.cache = seed, {}

    def get(self, kind: int, index: int, n: int) -> np.ndarray:
        key = (kind, index)
        ids = self.cache.get(key)
        if ids is None or len(ids) != n:
            ids = self.cache[key] = _ids((self.seed, kind, index), n)
        return ids


def short_prompts(n: int = 1000, prefixes: int = 57, seed: int = 0) -> list[TraceRequest]:
    """*Many short prompts*: ``n`` requests at t = 0, each one of ``prefixes`` shared few-shot
    prefixes of U(200, 2000) tokens plus a question of U(30, 600) tokens, 20 output tokens."""
    rng = np.random.default_rng([seed, 1])
    seg = Segments(seed)
    plen = rng.integers(200, 2001, size=prefixes)
    out = []
    for i in range(n):
        p = int(rng.integers(prefixes))
        q = seg.get(2, i, int(rng.integers(30, 601)))
        out.append(TraceRequest(f"s{i}", np.concatenate([seg.get(1, p, int(plen[p])), q]), 20))
    return out


def articles(num_articles: int = 16, questions: int = 4, seed: int = 0) -> list[TraceRequest]:
    """*Multi-question articles N*: N articles of U(18k, 22k) tokens, 4 questions of
    U(80, 120) tokens each, 50 output tokens, rounds interleaved (article 0 question 0,
    article 1 question 0, ...), one arrival per scheduler step."""
    rng = np.random.default_rng([seed, 2])
    seg = Segments(seed)
    alen = rng.integers(18_000, 22_001, size=num_articles)
    out = []
    for q in range(questions):
        for a in range(num_articles):
            qs = seg.get(4, q * num_articles + a, int(rng.integers(80, 121)))
            out.append(TraceRequest(f"a{a}q{q}", np.concatenate([seg.get(3, a, int(alen[a])), qs]), 50,
                                    arrival_step=len(out)))
    return out


def long_prompts(n: int = 20, seed: int = 0) -> list[TraceRequest]:
    """*Long prompts at once*: ``n`` requests at t = 0, prompts of U(55k, 110k) tokens,
    U(50, 100) output tokens."""
    rng = np.random.default_rng([seed, 3])
    return [TraceRequest(f"l{i}", _ids((seed, 5, i), int(rng.integers(55_000, 110_001))), int(rng.integers(50, 101)))
            for i in range(n)]


def short_hybrid_prompts(n: int = 200, seed: int = 0) -> list[TraceRequest]:
    """Prompts shorter than one state-aligned block on a hybrid (vLLM issue 40696: no hits
    below 528 tokens): 8 shared system prompts of U(100, 400) tokens + U(20, 100)-token turns."""
    rng = np.random.default_rng([seed, 6])
    seg = Segments(seed)
    plen = rng.integers(100, 401, size=8)
    return [TraceRequest(f"h{i}", np.concatenate([seg.get(6, p := int(rng.integers(8)), int(plen[p])),
                                                  seg.get(7, i, int(rng.integers(20, 101)))]), 16)
            for i in range(n)]


def round_robin_sessions(sessions: int = 8, turns: int = 6, seed: int = 0) -> list[TraceRequest]:
    """Several sessions served round-robin (vLLM 48435): each turn re-sends the whole
    conversation so far (U(2k, 6k)-token start, U(200, 800)-token turns), one arrival per step."""
    return _conversations("r", sessions, turns, (2000, 6001), (200, 801), 64, seed, 8)


def agent_conversations(sessions: int = 16, turns: int = 8, seed: int = 0) -> list[TraceRequest]:
    """Multi-turn agent conversations that grow turn by turn (tool output U(300, 1500) tokens
    per turn on a 1k system prompt shared by all)."""
    return _conversations("g", sessions, turns, (1000, 1001), (300, 1501), 100, seed, 9, shared_start=True)


def growing_chats(sessions: int = 64, turns: int = 8, seed: int = 0) -> list[TraceRequest]:
    """Many growing chats at once, more than the pool holds: ``sessions`` conversations of
    U(2k, 6k)-token starts and U(500, 2000)-token turns (100-token answers), served round-robin
    (each turn re-sends the whole conversation so far), one arrival per step."""
    return _conversations("c", sessions, turns, (2000, 6001), (500, 2001), 100, seed, 10)


def _conversations(tag: str, sessions: int, turns: int, first: tuple[int, int], step: tuple[int, int], out: int,
                   seed: int, kind: int, shared_start: bool = False) -> list[TraceRequest]:
    rng = np.random.default_rng([seed, kind])
    seg = Segments(seed)
    convo = [[seg.get(kind, 0 if shared_start else s, int(rng.integers(*first)))] for s in range(sessions)]
    reqs = []
    for t in range(turns):
        for s in range(sessions):
            if t:
                convo[s].append(seg.get(kind + 100, (s * turns + t) * 2, out))  # the previous answer
            convo[s].append(seg.get(kind + 100, (s * turns + t) * 2 + 1, int(rng.integers(*step))))
            reqs.append(TraceRequest(f"{tag}{s}t{t}", np.concatenate(convo[s]), out, arrival_step=len(reqs)))
    return reqs


def mamba_shared_prefix(n: int = 64, seed: int = 0) -> list[TraceRequest]:
    """A 1,500-token shared prefix with 700-token suffixes (vLLM 45238, on a Mamba hybrid)."""
    seg = Segments(seed)
    return [TraceRequest(f"m{i}", np.concatenate([seg.get(10, 0, 1500), seg.get(11, i, 700)]), 32)
            for i in range(n)]


def agent_branches(sessions: int = 8, depth: int = 4, branches: int = 3, seed: int = 0) -> list[TraceRequest]:
    """Agentic sessions that branch at tool calls: a 1,500-token system prompt shared by all,
    a U(300, 1,500)-token task per session; at each of ``depth`` tool calls the agent tries
    ``branches`` calls (each a U(200, 1,200)-token call and its output appended to the path so
    far: one request per branch, 64 output tokens), then goes on from the first.  Sessions
    interleaved, one arrival per step."""
    rng = np.random.default_rng([seed, 12])
    seg = Segments(seed)
    system = seg.get(12, 0, 1500)
    paths = [[system, seg.get(13, s, int(rng.integers(300, 1501)))] for s in range(sessions)]
    reqs = []
    for d in range(depth):
        for s in range(sessions):
            for b in range(branches):
                call = seg.get(14, (s * depth + d) * branches + b, int(rng.integers(200, 1201)))
                reqs.append(TraceRequest(f"b{s}d{d}x{b}", np.concatenate(paths[s] + [call]), 64,
                                         arrival_step=len(reqs)))
                if b == 0:
                    chosen = call
            paths[s].append(chosen)
    return reqs


def rag_prompts(n: int = 256, chunks: int = 48, per_prompt: int = 4, seed: int = 0) -> list[TraceRequest]:
    """RAG prompts reusing retrieved chunks in other orders: a 600-token system prompt, then
    ``per_prompt`` distinct chunks of U(300, 900) tokens drawn from ``chunks`` (Zipf-like
    popularity: chunk i weighs 1 / (i + 1)), in the retriever's order (a prefix shared only up
    to the first chunk that differs), then a U(30, 120)-token question; 48 output tokens, one
    arrival per step."""
    rng = np.random.default_rng([seed, 15])
    seg = Segments(seed)
    clen = rng.integers(300, 901, size=chunks)
    w = 1.0 / np.arange(1, chunks + 1)
    w /= w.sum()
    out = []
    for i in range(n):
        picked = rng.choice(chunks, size=per_prompt, replace=False, p=w)
        parts = [seg.get(15, 0, 600)] + [seg.get(16, int(c), int(clen[c])) for c in picked]
        parts.append(seg.get(17, i, int(rng.integers(30, 121))))
        out.append(TraceRequest(f"g{i}", np.concatenate(parts), 48, arrival_step=i))
    return out


TRACES = {
    "short": short_prompts, "articles16": lambda **kw: articles(16, **kw),
    "articles64": lambda **kw: articles(64, **kw), "long": long_prompts,
    "hybrid-short": short_hybrid_prompts, "round-robin": round_robin_sessions,
    "agent": agent_conversations, "mamba-prefix": mamba_shared_prefix, "chats64": growing_chats,
    "agent-branch": agent_branches, "rag": rag_prompts,
}


class BlockTrie:
    """Node id of every full 16-token prompt block (equal ids = equal prefix up to that block),
    and the best possible prefix hit of the trace in arrival order."""

    def __init__(self, reqs: list[TraceRequest]):
        nodes: dict[tuple[int, bytes], int] = {}
        best = total = 0
        for r in sorted(reqs, key=lambda r: r.arrival_step):
            raw = r.tokens[: len(r.tokens) // BLOCK * BLOCK].tobytes()
            ids, parent, shared = [], -1, 0
            for off in range(0, len(raw), BLOCK * 8):
                key = (parent, raw[off:off + BLOCK * 8])
                node = nodes.get(key)
                if node is None:
                    node = nodes[key] = len(nodes)
                elif shared == len(ids):
                    shared += 1
                ids.append(node)
                parent = node
            r.block_ids = np.asarray(ids, dtype=np.int64)
            best += min(shared * BLOCK, (len(r.tokens) - 1) // BLOCK * BLOCK)
            total += len(r.tokens)
        self.best_hit = best / max(total, 1)


def needed_bytes(model, live: list[tuple[TraceRequest, int, int]]) -> int:
    """Needed bytes (module doc) of live requests given as (request, computed, new this step)."""
    total = 0
    for g in model.groups:
        s = g.spec
        if s.kind == "mamba":
            total += s.state_bytes() * g.num_layers * len(live)
            continue
        window = s.window if s.kind == "sliding" else None
        shared, tokens = [], 0
        for r, c, n in live:
            hi = c + n
            lo = 0 if window is None else max(0, c - window + 1)
            b0, b1 = -(-lo // BLOCK), hi // BLOCK
            if b0 >= b1:
                tokens += hi - lo
                continue
            npb = len(r.block_ids)
            if b0 < npb:
                shared.append(r.block_ids[b0:min(b1, npb)])
            tokens += (b0 * BLOCK - lo) + (hi - b1 * BLOCK) + max(0, b1 - max(b0, npb)) * BLOCK
        if shared:
            tokens += len(np.unique(np.concatenate(shared))) * BLOCK
        total += tokens * s.bytes_per_token() * g.num_layers
    return total
