"""Drive a vLLM ``Scheduler`` (stock or ``JengaScheduler``) over a trace with a runner that computes
nothing, and price every step in time (``vs_vllm_sched.py``).

The engine loop is vLLM's synchronous one: ``schedule()``, the model runs, ``update_from_output``.
The stand-in runner samples a token (a hash of the request id and its output index) for every
request whose known tokens the step finished; requests stop after their ``output_len`` tokens
(``ignore_eos``).  Requests arrive at their trace's ``arrival_step`` (scheduler steps).

Each step is priced by the simulator's calibrated cost model on the model's real GPU
(:class:`jenga.sim.step_clock.StepClock`: per scheduled request its context end after the step
and its new tokens; a one-token step counts as decode).  Both sides run the same loop and the
same prices, so req/s and TTFT differ only by what the schedulers decided.

Counted: steps; tokens computed, split into decode tokens (one per output token after the first)
and prefill tokens (the rest: prompt tokens not hit, and a preempted request's recompute); the
prefix hit of each request's first admission (``num_computed_tokens`` of its first
``scheduled_new_reqs`` entry); mean and peak batch (requests per step); preemptions (``Request.
num_preemptions``); simulated seconds, req/s, TTFT p50 / p99 / mean / max (first token's step end minus
arrival).
"""

from __future__ import annotations

import time
import zlib

import numpy as np


def _runner_output(req_ids: list[str], sampled: list[list[int]]):
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput
    kw = dict(req_ids=req_ids, sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
              pooler_output=[])
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:  # gone in 0.34
        kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(**kw)


def run(sched, hash_block: int, trace, clock, *, max_steps: int = 200_000) -> dict:
    """Serve ``trace`` (``manager_traces.TraceRequest``s) with ``sched``; ``clock`` a fresh
    ``StepClock``.  Returns the counters of the module docstring."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block, hash_fn)
    reqs = {r.request_id: Request(r.request_id, r.tokens.tolist(),
                                  SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True), None,
                                  block_hasher=hasher) for r in trace}
    pending = sorted(trace, key=lambda r: r.arrival_step)
    arrived, first_tok, hit = {}, {}, {}
    steps = computed = batch = peak = 0
    cpu = 0.0
    i = 0
    while i < len(pending) or sched.has_requests():
        while i < len(pending) and pending[i].arrival_step <= steps:
            rid = pending[i].request_id
            sched.add_request(reqs[rid])
            arrived[rid] = clock.seconds
            i += 1
        t0 = time.perf_counter()
        out = sched.schedule()
        cpu += time.perf_counter() - t0
        steps += 1
        if steps > max_steps:
            left = [f"{r.request_id} {r.num_computed_tokens}/{r.num_tokens}" for r in reqs.values() if not r.is_finished()]
            raise SystemExit(f"sched_driver: no end after {max_steps} steps; requests left (computed/known tokens): "
                             f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''}")
        for r in out.scheduled_new_reqs:
            hit.setdefault(r.req_id, r.num_computed_tokens)
        ids, sampled = [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = reqs[rid]
            end = req.num_computed_tokens  # advanced by schedule() already
            clock.computed(end, n)
            computed += n
            ids.append(rid)
            sampled.append([(zlib.crc32(rid.encode()) + 7919 * req.num_output_tokens) % 32000]
                           if end >= req.num_tokens else [])
        batch += len(ids)
        peak = max(peak, len(ids))
        clock.step_done()
        t0 = time.perf_counter()
        sched.update_from_output(out, _runner_output(ids, sampled))
        cpu += time.perf_counter() - t0
        for rid, s in zip(ids, sampled, strict=True):
            if s and rid not in first_tok:
                first_tok[rid] = clock.seconds
    prompt = sum(len(r.tokens) for r in trace)
    outputs = sum(r.output_len for r in trace)
    ttft = np.array([first_tok[r] - arrived[r] for r in arrived])
    return dict(steps=steps, computed=computed, prefill=computed - (outputs - len(trace)),
                hit=sum(hit.values()) / max(prompt, 1), batch=batch / max(steps, 1), peak=peak,
                preempt=sum(r.num_preemptions for r in reqs.values()), seconds=clock.seconds,
                rps=len(trace) / clock.seconds, ttft50=float(np.percentile(ttft, 50)),
                ttft99=float(np.percentile(ttft, 99)), ttft_mean=float(ttft.mean()), ttft_max=float(ttft.max()),
                cpu=cpu, n=len(trace))
