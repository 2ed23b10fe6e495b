"""The cache-correctness oracle of jenga's engine: prefix caching on must give what caching off gives.

A seeded random trace (:func:`make_trace`): rounds of requests over a few shared documents, later
rounds continuing earlier requests' prompts and answers (so hits land on pages and state
checkpoints written at decode positions), chunked prefill, random lengths.  :func:`check` runs it
through jenga's engine (fp32, greedy, random weights) with prefix caching on and off, under a KV
budget sized from the family's own manager (about two of the trace's longest requests at once: it
preempts and evicts; tighter budgets and longer decodes are tried until it preempts: :data:`TOGETHER`,
:data:`DECODES`), and asserts

* every request's tokens are equal, and its logits agree to 2e-3;
* no hit crossed what the trace allows (:class:`HitLedger`): a request's first lookup hits at most
  the longest common prefix with another request of the same salt (image placeholders compared
  by image content; a cross-attention model's requests only with the same images);
* the run was not vacuous: prefix hit tokens, preemptions and evicted pages > 0 (with the host
  tier: host hit tokens; with images: image encodings served from cache).

Features (:data:`FEATURES`): ``plain``; ``spec`` (a draft: the target's weights plus noise, 3
tokens a step); ``host`` (a host tier 4x the device budget: demotion and promotion); ``images``
(VLMs: requests share images); ``salts`` (requests under three salts).  :func:`supported` says
which features a family takes (LoRA runs inside vLLM only: ``tests/vllm_cache_oracle.py``).
``benchmarks/cache_oracle.py`` runs every family x feature over many seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

import jenga
from jenga import SamplingParams
from jenga.capacity import peak_pages
from jenga.core.policy.registry import cdiv
from jenga.engine.tiny import TINY_MODELS

FAMILIES = tuple(TINY_MODELS)
FEATURES = ("plain", "spec", "host", "images", "salts")
VLMS = ("tiny-gemma3-vision", "tiny-mllama")
CROSS = ("tiny-mllama",)  # text before an image reads it: a hit needs the same images
NOISE = {"tiny-qwen3-next": 0.001}  # the draft's weight noise (default 0.003): acceptance in (0, 1)
ATOL = 2e-3
TOKENS_PER_PAGE = 16
CHUNK = 48  # max_num_batched_tokens: prompts longer than this are prefilled in chunks


def supported(family: str) -> tuple[str, ...]:
    """The features :func:`check` runs for ``family`` (the engine refuses a draft for a VLM)."""
    if family in VLMS:
        return ("plain", "host", "images", "salts")
    return ("plain", "spec", "host", "salts")


@dataclass
class Request:
    """One request of a trace: token ids (image placeholders included), its images, salt and
    length; ``parent``: an earlier round's request whose prompt and answer it continues."""
    ids: list[int]
    max_tokens: int
    salt: str | None = None
    images: list = field(default_factory=list)
    parent: int | None = None  # index into the previous round


@dataclass
class Trace:
    rounds: list[list[Request]]

    @property
    def num_requests(self) -> int:
        return sum(len(r) for r in self.rounds)


def _image_block(family: str, img) -> list[int]:
    from jenga.engine.models.weights import TINY_BOI, TINY_EOI, TINY_IMAGE, TINY_MLLAMA_IMAGE

    if family == "tiny-mllama":
        return [TINY_MLLAMA_IMAGE]
    return [TINY_BOI] + [TINY_IMAGE] * 16 + [TINY_EOI]


def _image_pool(family: str, rng: random.Random, n: int = 3) -> list:
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if family == "tiny-mllama":  # processor-shaped: one 1x1-tile image (aspect-ratio id 1) of two tiles
        out = []
        for _ in range(n):
            pv = torch.zeros(1, 1, 2, 3, 32, 32)
            pv[0, 0, :1] = torch.randn(1, 3, 32, 32, generator=gen)
            out.append({"pixel_values": pv, "aspect_ratio_ids": torch.tensor([[1]]),
                        "aspect_ratio_mask": torch.tensor([[[1, 0]]])})
        return out
    return [torch.randn(3, 32, 32, generator=gen) for _ in range(n)]


def make_trace(family: str, seed: int, feature: str = "plain", *, rounds: int = 3, per_round: int = 6,
               max_tokens: tuple[int, int] = (6, 20), doc_len: tuple[int, int] = (20, 90)) -> Trace:
    """Seeded: ``rounds`` rounds of ``per_round`` requests over three documents (``doc_len`` tokens, an
    image inside with ``images``) plus 1-24 own tokens; from round 2 on, half of the requests
    continue a request of the round before (its prompt and answer plus a few new tokens)."""
    rng = random.Random(f"{family}:{seed}:{feature}")

    def toks(n):
        return [rng.randrange(3, 500) for _ in range(n)]

    pool = _image_pool(family, rng) if feature == "images" else []
    docs = []
    for _ in range(3):
        ids, imgs = toks(rng.randrange(*doc_len)), []
        if pool:
            img = rng.choice(pool)
            at = rng.randrange(0, len(ids))
            ids, imgs = ids[:at] + _image_block(family, img) + ids[at:], [img]
        docs.append((ids, imgs))
    salts = [None, "tenant-a", "tenant-b"] if feature == "salts" else [None]
    out = []
    for r in range(rounds):
        this = []
        for _ in range(per_round):
            mt = rng.randrange(*max_tokens)
            salt = rng.choice(salts)
            if r and rng.random() < 0.5:
                parent = rng.randrange(len(out[-1]))
                up = out[-1][parent]
                this.append(Request(toks(rng.randrange(1, 8)), mt, up.salt, list(up.images), parent=parent))
            else:
                ids, imgs = rng.choice(docs)
                this.append(Request(ids + toks(rng.randrange(1, 24)), mt, salt, list(imgs)))
        out.append(this)
    return Trace(out)


# ------------------------------------------------------------------------------------------ run

@dataclass
class Run:
    tokens: list[list[int]]
    logits: list
    counts: dict  # hits, preemptions, evicted, host_hits, image_hits, acceptance
    ledger: HitLedger


class HitLedger:
    """Every request's first lookup against what the engine could have cached by then: the hit must
    not exceed the longest prefix it shares with a request of the same salt admitted before it (that
    request's tokens so far: prompt and answer; image placeholders compared by image content; a
    cross-attention model's requests only with the same images)."""

    def __init__(self, cross: bool):
        self.cross = cross
        self.seen: dict = {}  # request id -> its live sequence, in admission order
        self.lookups: list[tuple] = []  # (request id, salt, hit, bound)

    def keys(self, seq) -> list:
        """Token ids with each image placeholder replaced by (its image's content hash, position in it);
        a cross-attention model's placeholder stands for encoder tokens outside the sequence (its images
        are compared whole: ``images_of``)."""
        out: list = list(seq.tokens)
        if self.cross:
            return out
        for ref in getattr(seq, "images", ()) or ():
            for j in range(ref.num_tokens):
                out[ref.offset + j] = (ref.content_hash, j)
        return out

    def images_of(self, seq) -> tuple:
        return tuple(r.content_hash for r in getattr(seq, "images", ()) or ()) if self.cross else ()

    def note_lookup(self, seq) -> None:
        """After ``seq``'s lookup (``seq.num_computed``: its hit); its first admission only."""
        if seq.request_id in self.seen:
            return
        keys, bound = self.keys(seq), 0
        for other in self.seen.values():
            if other.cache_salt != seq.cache_salt or self.images_of(other) != self.images_of(seq):
                continue
            n = 0
            for a, b in zip(keys, self.keys(other), strict=False):
                if a != b:
                    break
                n += 1
            bound = max(bound, n)
        self.seen[seq.request_id] = seq
        self.lookups.append((seq.request_id, seq.cache_salt, seq.num_computed, bound))

    def violations(self) -> list[str]:
        return [f"request {rid!r} (salt {salt!r}) hit {hit} tokens; a request of its salt admitted before "
                f"it shares at most {bound}" for rid, salt, hit, bound in self.lookups if hit > bound]


def _draft_noise(llm, family: str) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in llm.speculative.draft.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * NOISE.get(family, 0.003))


def engine_args(family: str, feature: str, chunk: int = CHUNK) -> dict:
    kw = dict(tokens_per_page=TOKENS_PER_PAGE, max_num_batched_tokens=chunk, state_checkpoint_interval=16)
    if feature == "spec":
        kw.update(speculative_model=family, num_speculative_tokens=3, speculative_seed=0)
    return kw


#: ``together`` shares :func:`compare` tries, in order, until the caching-on run preempts
TOGETHER = (0.3, 0.2, 0.1)
#: tried after every trace of :data:`DECODES` under every budget of :data:`TOGETHER`: a smaller budget, then
#: longer decodes (tiny Falcon-H1 and Granite-4.0-H with the host tier: none of those preempts)
LAST_TOGETHER = 0.05
#: the trace's ``max_tokens`` ranges :func:`compare` tries, in order, each under every budget of
#: :data:`TOGETHER`: admission keeps headroom for running requests' decode pages, so a family whose
#: requests hold mostly fixed-size state (tiny Bamba), or a trace whose longest request sets the
#: budget (tiny Gemma-3 vision seed 0, tiny Mistral seed 1), preempts only once decodes outgrow that headroom
DECODES = ((6, 20), (20, 64), (40, 96))
LAST_DECODES = (64, 128)


def budget(family: str, feature: str, trace: Trace, *, alone: float = 1.0, together: float = 0.3) -> int:
    """KV bytes from the family's own manager (its groups' peak pages at a length, in large pages):
    ``alone`` times the trace's longest request, at least ``together`` times what the largest round's
    requests hold at once (so requests preempt each other and evict cached pages)."""
    probe = jenga.LLM(family, kv_memory="64MiB", **engine_args(family, feature))
    mgr = probe.manager
    drafts = probe.scheduler.k if feature == "spec" else 0  # every step holds the drafts' slots too

    def large(n: int) -> int:
        return sum(cdiv(p, k) for p, k in zip(peak_pages(mgr, n, drafts), mgr.pool.small_per_large, strict=True))

    lengths: list[int] = []
    longest = peak_round = 0
    for rnd in trace.rounds:
        lengths = [len(q.ids) + q.max_tokens + (lengths[q.parent] if q.parent is not None else 0) for q in rnd]
        longest = max(longest, *lengths)
        peak_round = max(peak_round, sum(large(n) for n in lengths))
    # one more large page for the longest request: the allocator keeps one slack page
    return int((max(alone * large(longest) + 1, together * peak_round) + 1) * mgr.large_page_bytes)


def run(family: str, trace: Trace, *, caching: bool, feature: str = "plain", kv_memory: int,
        host_share: int = 4, chunk: int = CHUNK) -> Run:
    """``trace`` through one engine, round by round (a round's requests all at once)."""
    torch.set_num_threads(1)
    host = dict(host_kv_memory=host_share * kv_memory) if feature == "host" else {}
    llm = jenga.LLM(family, kv_memory=kv_memory, enable_prefix_caching=caching, **engine_args(family, feature, chunk),
                    **host)
    if feature == "spec":
        _draft_noise(llm, family)
    ledger = HitLedger(cross=family in CROSS)
    sched, enter = llm.scheduler, llm.scheduler._enter

    def spy(seq):
        enter(seq)
        ledger.note_lookup(seq)

    sched._enter = spy
    tokens, logits, prev, images = [], [], [], 0
    for rnd in trace.rounds:
        prompts, params = [], []
        for q in rnd:
            ids = q.ids if q.parent is None else prev[q.parent] + q.ids
            p = {"prompt_token_ids": ids}
            if q.images:
                p["multi_modal_data"] = {"image": q.images if family != "tiny-mllama" else q.images[0]}
                images += len(q.images)
            if q.salt is not None:
                p["cache_salt"] = q.salt
            prompts.append(p)
            params.append(SamplingParams(max_tokens=q.max_tokens, ignore_eos=True, return_logits=True))
        seqs = [llm.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        while sched.has_unfinished:
            llm.step()
        for s in seqs:
            tokens.append(list(s.output_token_ids))
            logits.append(torch.stack(s.logits) if s.logits else torch.zeros(0))
        prev = [p["prompt_token_ids"] + list(s.output_token_ids) for p, s in zip(prompts, seqs, strict=True)]
    st = llm.manager.stats()
    llm.manager.check_integrity()
    assert st.used_bytes == 0, "pages held after every request finished"
    counts = dict(hits=st.prefix_hit_tokens, preemptions=sched.stats.preemptions, evicted=st.evicted_pages,
                  host_hits=st.host_hit_tokens, promotions=st.promotions, demotions=st.demotions,
                  image_hits=images - llm.metrics.encoder_runs if images else 0,
                  acceptance=llm.metrics.acceptance_rate)
    return Run(tokens, logits, counts, ledger)


@dataclass
class Result:
    family: str
    feature: str
    seed: int
    equal: int  # requests whose tokens (and logits) agree
    total: int
    on: dict  # caching-on counts
    off: dict
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(family: str, feature: str = "plain", seed: int = 0, **trace_kw) -> Result:
    """Caching on vs off over one seeded trace: what agrees, the counts, and every problem found
    (a differing request, a hit past the trace's bound, a vacuous run)."""
    fixed = "max_tokens" in trace_kw
    decodes = (trace_kw.pop("max_tokens"),) if fixed else DECODES
    # the first trace and budget under which requests preempt each other: the grid, then the last resorts
    tries = [(d, t) for d in decodes for t in TOGETHER]
    tries += [(d, t) for d in (*decodes, *(() if fixed else (LAST_DECODES,))) for t in (*TOGETHER, LAST_TOGETHER)
              if (d, t) not in tries]
    traces = {}
    for max_tokens, together in tries:
        if max_tokens not in traces:
            traces[max_tokens] = make_trace(family, seed, feature, max_tokens=max_tokens, **trace_kw)
        trace = traces[max_tokens]
        kv = budget(family, feature, trace, together=together)
        on = run(family, trace, caching=True, feature=feature, kv_memory=kv)
        if on.counts["preemptions"]:
            break
    off = run(family, trace, caching=False, feature=feature, kv_memory=kv)
    problems, equal, differ = [], 0, {}
    for i, (a, b, la, lb) in enumerate(zip(on.tokens, off.tokens, on.logits, off.logits, strict=True)):
        if a != b:
            problems.append(f"request {i}: tokens {a} with caching, {b} without")
        elif la.shape != lb.shape:
            problems.append(f"request {i}: logits differ by shape")
        elif (diff := (la - lb).abs().max().item() if la.numel() else 0.0) > ATOL:
            differ[i] = diff
        else:
            equal += 1
    if differ:  # the same tokens: the model's own noise under another prefill split, or the cache's?
        noise = chunk_noise(family, trace, feature, kv, off, list(differ))
        for i, diff in differ.items():
            if diff <= NOISE_SHARE * noise[i]:
                equal += 1
            else:
                problems.append(f"request {i}: logits differ by {diff} (caching off, prefill split "
                                f"otherwise: {noise[i]})")
    problems += on.ledger.violations()
    c = on.counts
    need = dict(hits=c["hits"], preemptions=c["preemptions"], evicted=c["evicted"])
    if feature == "host":
        need.update(host_hits=c["host_hits"], promotions=c["promotions"], demotions=c["demotions"])
    if feature == "images":
        need["image_hits"] = c["image_hits"]
    if feature == "spec" and not 0 < c["acceptance"] < 1:
        problems.append(f"acceptance {c['acceptance']:.2f}: drafts should be kept and rejected")
    problems += [f"vacuous: {k} = 0 with caching on" for k, v in need.items() if not v]
    return Result(family, feature, seed, equal, trace.num_requests, on.counts, off.counts, problems)


#: a caching-on request whose tokens agree but whose logits differ by more than ``ATOL`` agrees if
#: the same request differs by at least ``1 / NOISE_SHARE`` of that between two caching-off runs that
#: split the prefill otherwise (``chunk_noise``): a hit changes where the prefill's chunks start, and a
#: model whose router sits near a tie (tiny Nemotron-H MoE's group-limited router, seed 1: 0.0158
#: either way) moves as much without any cache
NOISE_SHARE = 2


def chunk_noise(family: str, trace: Trace, feature: str, kv: int, off: Run, requests: list[int]) -> dict:
    """Per request of ``requests``: its largest logit difference between ``off`` (caching off) and a
    caching-off run whose prefill chunks are half as long."""
    other = run(family, trace, caching=False, feature=feature, kv_memory=kv, chunk=CHUNK // 2)
    out = {}
    for i in requests:
        a, b = off.logits[i], other.logits[i]
        same = off.tokens[i] == other.tokens[i] and a.shape == b.shape
        out[i] = (a - b).abs().max().item() if same and a.numel() else 0.0
    return out


def check(family: str, feature: str = "plain", seed: int = 0, **trace_kw) -> Result:
    """:func:`compare`, asserting no problem."""
    res = compare(family, feature, seed, **trace_kw)
    assert res.ok, f"{family} {feature} seed {seed}: " + "; ".join(res.problems[:6])
    return res
