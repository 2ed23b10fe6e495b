"""Discrete-event simulation of continuous batching over a KV-cache manager.

Contract of :meth:`Simulator.run` (one manager, one trace):

* Requests join the scheduler at their arrival time; when nothing runs, time jumps to the next
  arrival.  Scheduling is the engine's (:mod:`jenga.sim.batching`): FCFS admission with
  ``lookup`` then ``allocate`` (admission stops at the first ``None``), chunked prefill under
  ``max_num_batched_tokens``, preemption by recompute of the newest running request.
* Prompt ids come from ``SimRequest.prompt_token_ids`` (shared prefixes and images are real
  shared token runs, so prefix caching sees them); output ids are synthetic but a pure
  function of ``(seed, request id, position)``.  A cross-attention model's images are encoder
  tokens: the scheduler and the manager get the decoder's prompt (text + one image token per
  image, :mod:`jenga.sim.decoder_view`); the cost model still prices the trace's positions.
* Speculative decoding (``num_spec_tokens = k > 0``): each decode step allocates ``1 + k``
  slots (``num_lookahead = k``) and accepts ``min(k, Geometric)`` draft tokens + 1, i.e. a
  draft token survives with probability ``acceptance`` given its predecessors did; draws are a
  pure function of ``(seed, request id)``.  The manager's model is ``target.combine(draft)``.
* Step time = :meth:`CostModel.step_time` with the KV bytes the real model reads
  (:mod:`jenga.sim.costing`), plus ``k`` draft passes when drafting.
* Requests that can never fit (longer than the model's max length, or bigger than the whole
  cache) are rejected with a reason and counted, never retried forever.
* Every ``record_every`` steps the manager's ``stats()`` is recorded (:class:`StepRecord`).
* Host tier (``host_memory_bytes``): after each ``schedule`` the manager's copy plan is taken and
  its bytes cost :meth:`CostModel.host_copy_time` per direction, demotes then promotes, added to the
  step **without overlap** (the engine issues both on the compute stream before the forward, so
  this is the serial cost, an upper bound for an engine that overlaps them).  Against it the
  result sets ``host_recompute_s``: what prefilling the tokens served from host would have cost
  (one prefill of that many tokens with no earlier context, a lower bound on recomputing them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from jenga.errors import InvalidArgumentError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.sequence import Sequence
from jenga.sim.batching import SCHEDULERS, ManagerView
from jenga.sim.decoder_view import DecoderView, decoder_view
from jenga.sim.gpu import TERMS
from jenga.sim.host_copies import HostTierTotals
from jenga.sim.setup import Setup, build_setup
from jenga.sim.workloads import FIRST_TOKEN_ID, SimRequest, Workload, _stable_int


class SimulationStalledError(RuntimeError):
    """The scheduler made no progress for many steps (a bug, not a workload property)."""


@dataclass(slots=True)
class SimConfig:
    """Knobs of one simulation.  ``record_every``: record ``stats()`` every N steps (1 = all)."""

    max_num_batched_tokens: int | None = 8192  # None: the scheduler's default (v0: max(max_len, 2048))
    max_num_seqs: int = 256
    scheduler: str = "chunked"  # a key of jenga.sim.batching.SCHEDULERS: chunked (vLLM v1) | v0
    tokens_per_page: int = 16
    enable_prefix_caching: bool = True
    seed: int = 0
    record_every: int = 1
    vocab_size: int = 32000
    check_integrity: bool = False
    max_lcm_ratio: float = 8.0
    record_terms: bool = False  # keep every step's CostModel.terms (SimResult.step_terms), for calibration
    host_memory_bytes: int | None = None  # a host KV tier of this many bytes (jenga's manager), None: none
    manager_kwargs: dict = field(default_factory=dict)  # extra keyword arguments for every manager
    manager_kwargs_for: dict = field(default_factory=dict)  # manager name -> its own extra keyword arguments


@dataclass(slots=True)
class StepRecord:
    """Memory and batch state after one step (bytes are whole-model, all TP ranks)."""

    step: int
    time_s: float
    num_running: int
    num_decode: int
    num_prefill_tokens: int
    total_bytes: int
    used_bytes: int
    cached_bytes: int
    free_bytes: int
    needed_bytes: int
    waste_bytes: int
    waste_large_page_bytes: int
    waste_frac: float
    needed_by_kind: dict


@dataclass(slots=True)
class _Track:
    req: SimRequest
    seq: Sequence
    img_tokens: int
    out_base: int
    accepts: np.ndarray | None
    view: DecoderView
    verify_steps: int = 0
    first_token_s: float = math.nan
    finish_s: float = math.nan


@dataclass
class SimResult:
    """Outcome of one manager on one trace; :meth:`summary` gives the headline metrics."""

    manager: str
    model: str
    workload: str
    memory_bytes: int
    num_requests: int
    finished: int
    rejected: dict
    output_tokens: int
    makespan_s: float
    latencies_s: np.ndarray
    ttfts_s: np.ndarray
    decode_batches: list = field(repr=False)
    timeline: list = field(repr=False)
    preemptions: int = 0
    steps: int = 0
    max_concurrent: int = 0
    prefix_hit_rate: float = 0.0
    wall_s: float = 0.0
    step_terms: np.ndarray | None = field(default=None, repr=False)  # steps x TERMS (record_terms)
    prefill_tokens: int = 0  # prompt (and recomputed) tokens the steps computed: prefix hits are not in it
    host: HostTierTotals | None = None  # the host tier's copies and their cost (host_memory_bytes)

    def summary(self) -> dict:
        lat, ttft = self.latencies_s, self.ttfts_s
        span = self.makespan_s
        rec = [r.waste_frac for r in self.timeline if r.used_bytes]
        db = self.decode_batches

        def stat(a: np.ndarray, fn) -> float:
            return float(fn(a)) if len(a) else 0.0

        return {
            "throughput_req_s": self.finished / span if span > 0 else 0.0,
            "throughput_tok_s": self.output_tokens / span if span > 0 else 0.0,
            "latency_mean_s": stat(lat, np.mean), "latency_p99_s": stat(lat, lambda a: np.percentile(a, 99)),
            "ttft_mean_s": stat(ttft, np.mean), "ttft_p99_s": stat(ttft, lambda a: np.percentile(a, 99)),
            "decode_batch_mean": float(np.mean(db)) if db else 0.0,
            "waste_frac_mean": float(np.mean(rec)) if rec else 0.0,
            "prefix_hit_rate": self.prefix_hit_rate,
            "preemptions": self.preemptions, "steps": self.steps, "max_concurrent": self.max_concurrent,
            "finished": self.finished, "rejected": len(self.rejected), "requests": self.num_requests,
            "makespan_s": span, "memory_bytes": self.memory_bytes, "wall_s": self.wall_s,
            "prefill_tokens": self.prefill_tokens,
            **(self.host.summary() if self.host is not None else {}),
        }


class Simulator:
    """Runs traces against managers built by ``jenga.baselines.make_manager``."""

    def __init__(self, setup: Setup, config: SimConfig | None = None):
        self.setup = setup
        self.cfg = config or SimConfig()

    def make_manager(self, name: str):
        from jenga.baselines import make_manager
        c = self.cfg
        kw = dict(tokens_per_page=c.tokens_per_page, enable_prefix_caching=c.enable_prefix_caching,
                  **c.manager_kwargs, **c.manager_kwargs_for.get(name, {}))
        if name == "jenga":
            kw["max_lcm_ratio"] = c.max_lcm_ratio
        if c.host_memory_bytes:
            kw["host_memory_bytes"] = c.host_memory_bytes
        return make_manager(name, self.setup.model, self.setup.memory_bytes, **kw)

    def _track(self, r: SimRequest, k: int, acceptance: float) -> _Track:
        c = self.cfg
        view = decoder_view(r.prompt_token_ids(vocab_size=c.vocab_size, seed=c.seed), r.images,
                            self.setup.coster.images_in_cross)
        seq = Sequence(r.request_id, view.ids.tolist(), SamplingParams(max_tokens=int(r.output_len), ignore_eos=True))
        acc = None
        if k:
            rng = np.random.default_rng([c.seed, _stable_int("accept", r.request_id)])
            acc = np.minimum(rng.geometric(max(1e-9, 1.0 - acceptance), size=int(r.output_len)) - 1, k)
        return _Track(r, seq, sum(n for _, n, _ in r.images), _stable_int(c.seed, r.request_id), acc, view)

    def _out_ids(self, t: _Track, n: int) -> list[int]:
        span = self.cfg.vocab_size - FIRST_TOKEN_ID
        j = len(t.seq.output_token_ids)
        return [FIRST_TOKEN_ID + (t.out_base + (j + i) * 7919) % span for i in range(n)]

    def run(self, workload: Workload, manager: str, *, num_spec_tokens: int | None = None,
            acceptance: float | None = None, progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate ``workload`` on a fresh ``manager``; ``progress(n)`` is called with the
        number of requests that finished or were rejected in each step."""
        import time as _time

        wall0 = _time.perf_counter()
        info = workload.info
        k = info.num_spec_tokens if num_spec_tokens is None else num_spec_tokens
        acc = (info.acceptance if info.acceptance is not None else 0.7) if acceptance is None else acceptance
        if k and self.setup.draft is None:
            k = 0  # no draft model: plain decoding
        c, st = self.cfg, self.setup
        mgr = self.make_manager(manager)
        view = ManagerView(mgr, k)
        try:
            kind = SCHEDULERS[c.scheduler]
        except KeyError:
            raise InvalidArgumentError(f"unknown scheduler {c.scheduler!r}; choose one of {list(SCHEDULERS)}") from None
        budget = {} if c.max_num_batched_tokens is None else {"max_num_batched_tokens": c.max_num_batched_tokens}
        sched = kind(view, max_num_seqs=c.max_num_seqs, **budget)
        max_len = mgr.model.max_model_len
        arrivals = sorted(workload, key=lambda r: r.arrival_s)
        tracks: dict[object, _Track] = {}
        done: list[_Track] = []
        rejected: dict[object, str] = {}
        timeline: list[StepRecord] = []
        decode_batches: list[int] = []
        now, i, steps, idle, max_conc, out_tokens, prefill_tokens = 0.0, 0, 0, 0, 0, 0, 0
        n_rej_seen = 0
        terms: list | None = [] if c.record_terms else None
        host = HostTierTotals(mgr.model, st.cost) if c.host_memory_bytes else None
        while i < len(arrivals) or sched.has_unfinished:
            while i < len(arrivals) and arrivals[i].arrival_s <= now:
                r = arrivals[i]
                i += 1
                if r.prompt_len + r.output_len > max_len:
                    rejected[r.request_id] = (f"{r.prompt_len} + {r.output_len} tokens exceed the model's max "
                                              f"length {max_len}")
                    if progress:
                        progress(1)
                    continue
                t = self._track(r, k, acc)
                tracks[r.request_id] = t
                sched.add_sim(t.seq, t.view.images)
            if not sched.has_unfinished:
                now = max(now, arrivals[i].arrival_s)
                continue
            plan = sched.schedule()
            if host is not None:  # the tiers' copies of this step's allocations, before its forward
                now += host.take(mgr.take_copy_plan())
            if len(sched.rejected) > n_rej_seen:
                for rid in list(sched.rejected)[n_rej_seen:]:
                    rejected[rid] = sched.rejected[rid]
                    tracks.pop(rid, None)
                    if progress:
                        progress(1)
                n_rej_seen = len(sched.rejected)
            if plan.empty:
                idle += 1
                if i < len(arrivals) and not sched.running:
                    now = max(now, arrivals[i].arrival_s)
                elif idle > 1000:
                    raise SimulationStalledError(f"{manager}: no progress for {idle} steps at t={now:.3f}s "
                                                 f"({len(sched.waiting)} waiting, {len(sched.running)} running)")
                continue
            idle = 0
            steps += 1
            max_conc = max(max_conc, len(sched.running))
            now += self._step_time(plan, tracks, k, terms)
            sampled, n_dec = [], 0
            for item in plan.scheduled:
                if not item.sample:
                    sampled.append(None)
                    continue
                t = tracks[item.seq.request_id]
                if item.seq.output_token_ids:
                    n_dec += 1
                    if k:
                        a = int(t.accepts[min(t.verify_steps, len(t.accepts) - 1)])
                        t.verify_steps += 1
                        sampled.append(self._out_ids(t, a + 1))
                        continue
                elif math.isnan(t.first_token_s):
                    t.first_token_s = now
                sampled.append(self._out_ids(t, 1))
            if n_dec:
                decode_batches.append(n_dec)
            prefill_tokens += sum(it.num_tokens for it in plan.scheduled) - n_dec
            finished = sched.update(plan, sampled)
            for seq in finished:
                t = tracks.pop(seq.request_id)
                t.finish_s = now
                out_tokens += len(seq.output_token_ids)
                seq.tokens = seq.prompt_token_ids = []  # drop the ids; keep the counts
                done.append(t)
            if progress and finished:
                progress(len(finished))
            if steps % c.record_every == 0 or not sched.has_unfinished:
                timeline.append(self._record(mgr, steps, now, sched, n_dec, plan, tracks, host))
                if c.check_integrity:
                    mgr.check_integrity()
        lat = np.array([t.finish_s - t.req.arrival_s for t in done])
        ttft = np.array([t.first_token_s - t.req.arrival_s for t in done])
        s = mgr.stats()
        if host is not None:
            host.close(s)
        return SimResult(manager, st.model.name, info.name, st.memory_bytes, len(arrivals), len(done), rejected,
                         out_tokens, now - (arrivals[0].arrival_s if arrivals else 0.0), lat, ttft,
                         decode_batches, timeline, sched.stats.preemptions, steps, max_conc, s.prefix_hit_rate,
                         _time.perf_counter() - wall0, None if terms is None else np.array(terms).reshape(-1, len(TERMS)),
                         prefill_tokens, host)

    @staticmethod
    def _arrays(items, tracks) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start, end, q, image tokens) per item, positions of the trace (:class:`DecoderView`)."""
        views = [tracks[it.seq.request_id].view for it in items]
        start = np.fromiter((v.expanded(it.start) for v, it in zip(views, items, strict=True)), np.int64, len(items))
        end = np.fromiter((v.expanded(it.start + it.num_tokens) for v, it in zip(views, items, strict=True)), np.int64, len(items))
        img = np.fromiter((tracks[it.seq.request_id].img_tokens for it in items), np.int64, len(items))
        return start, end, end - start, img

    @staticmethod
    def _image_overlap(items, tracks, start: np.ndarray, end: np.ndarray, upto_start: bool) -> np.ndarray:
        """Image positions per item in ``[0, start)`` (``upto_start``) or in the step's new tokens."""
        out = np.zeros(len(items), np.int64)
        for j, it in enumerate(items):
            spans = tracks[it.seq.request_id].req.images
            lo, hi = (0, start[j]) if upto_start else (start[j], end[j])
            out[j] = sum(max(0, min(hi, o + n) - max(lo, o)) for o, n, _ in spans)
        return out

    def _step_time(self, plan, tracks, k: int, record: list | None = None) -> float:
        st = self.setup
        items = plan.scheduled
        start, end, q, img = self._arrays(items, tracks)
        img_new = img_ctx = None
        if img.any():
            img_new = self._image_overlap(items, tracks, start, end, False)
            img_ctx = self._image_overlap(items, tracks, start, end, True) + img_new
        decode = np.fromiter((it.sample and bool(it.seq.output_token_ids) and it.num_tokens <= 1 + k
                              for it in items), bool, len(items))
        if k:  # the target verifies 1 + k tokens per decoding request
            q = np.where(decode, 1 + k, q)
            end = np.where(decode, end + k, end)
        kv, flops = st.coster.step(end, q, img, img_ctx, img_new)
        n_dec = int(decode.sum())
        dec_tok = int(q[decode].sum())
        pre_tok = int(q[~decode].sum())
        n_img = 0 if img_new is None else int(img_new[~decode].sum())
        terms = st.cost.terms(pre_tok, dec_tok, kv, attention_flops=flops, num_seqs=len(items),
                              num_image_tokens=n_img)
        if record is not None:
            record.append(terms)
        t = st.cost.time_of(terms)
        if k and st.draft_cost is not None:
            dkv, dfl = st.draft_coster.step(end, q, img)
            t += st.draft_cost.step_time(pre_tok, n_dec, dkv, attention_flops=dfl, num_seqs=len(items))
            if n_dec:
                dkv1, dfl1 = st.draft_coster.step(end[decode], np.ones(n_dec, np.int64), img[decode])
                t += (k - 1) * st.draft_cost.step_time(0, n_dec, dkv1, attention_flops=dfl1, num_seqs=n_dec)
        return t

    def _record(self, mgr, step, now, sched, n_dec, plan, tracks, host=None) -> StepRecord:
        s = mgr.stats()
        if host is not None:
            host.observe(s)
        running = sched.running
        end = np.fromiter((seq.num_computed for seq in running), np.int64, len(running))
        img = np.fromiter((tracks[seq.request_id].img_tokens for seq in running), np.int64, len(running))
        by_kind = self.setup.coster.needed_by_kind(end, img)
        if self.setup.draft_coster is not None:
            for kind, b in self.setup.draft_coster.needed_by_kind(end, img).items():
                by_kind[f"draft {kind}"] = b
        tot = sum(by_kind.values())
        scale = s.needed_bytes / tot if tot else 0.0  # the manager's own total, split by kind
        by_kind = {kind: b * scale for kind, b in by_kind.items()}
        pre = sum(it.num_tokens for it in plan.scheduled) - n_dec
        return StepRecord(step, now, len(running), n_dec, pre, s.total_bytes, s.used_bytes, s.cached_bytes,
                          s.free_bytes, s.needed_bytes, s.waste_bytes, s.waste_large_page_bytes, s.waste_frac,
                          by_kind)


def simulate(model: str, workload: Workload, managers, *, gpu: str = "h100-80gb", tp: int = 1,
             draft: str | None = None, config: SimConfig | None = None, progress=None,
             on_unavailable: Callable[[str, Exception], None] | None = None, **setup_kw) -> dict[str, SimResult]:
    """Run ``workload`` on each manager name; managers whose module is missing are skipped
    (reported to ``on_unavailable``).  ``progress(manager, n)`` reports finished requests."""
    sim = Simulator(build_setup(model, gpu, tp, draft=draft, **setup_kw), config)
    out = {}
    for name in managers:
        try:
            sim.make_manager(name)
        except (ImportError, NameError, InvalidArgumentError) as e:  # a baseline that has not landed yet
            if on_unavailable is None:
                raise
            on_unavailable(name, e)
            continue
        cb = (lambda n, _name=name: progress(_name, n)) if progress else None
        out[name] = sim.run(workload, name, progress=cb)
    return out
