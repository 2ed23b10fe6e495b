"""A host tier never costs device capacity: every request that runs without one runs with one.

The trace: 32 prompts sharing four prefixes (40-100 tokens each, 4-40 more per prompt), 12 output
tokens each, through the engine's scheduler over jenga's manager at a device pool of 1 MiB (two
to a few large pages for these tiny models), with and without a 4 MiB host tier.  The sampled
tokens are a function of request and position, so both runs see the same sequences.  Before the
scheduler gave up a held hit that did not fit with nothing else running, a hybrid's promoted
attention pages took the large page its state group needed, and the request was refused ("does not
fit in the KV cache even with nothing else running"; the seeds below, tiny Falcon-H1, Bamba,
Granite-4.0-H and Nemotron-H).  The engine itself (HF-equal tokens) is checked on one such trace in
the slow variant.
"""

from __future__ import annotations

import random

import pytest

from jenga.baselines import make_manager
from jenga.core.specs import ModelSpec
from jenga.engine.tiny import tiny_hf_config
from jenga.errors import InsufficientMemoryError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.scheduler import Scheduler
from jenga.sched.sequence import Sequence


def shared_prefix_trace(seed: int, n: int = 32) -> list[list[int]]:
    r = random.Random(seed)
    prefixes = [[r.randrange(3, 500) for _ in range(r.randrange(40, 100))] for _ in range(4)]
    return [prefixes[i % 4] + [r.randrange(3, 500) for _ in range(r.randrange(4, 40))] for i in range(n)]


def serve_trace(model: str, prompts: list[list[int]], host: int | None, kv: str = "1MiB"):
    """Serve ``prompts`` with the engine's scheduler; ``(refused request ids, tokens per request,
    manager)``.  A request refused with ``InsufficientMemoryError`` is aborted and the rest go on."""
    spec = ModelSpec.from_hf_config(tiny_hf_config(model).to_dict(), dtype="fp32", tokens_per_page=16)
    mgr = make_manager("jenga", spec, kv, tokens_per_page=16, **({} if host is None else {"host_memory_bytes": host}))
    sched = Scheduler(mgr, max_num_seqs=256, max_num_batched_tokens=2048)
    params = SamplingParams(max_tokens=12, temperature=0)
    seqs = [Sequence(i, p, params) for i, p in enumerate(prompts)]
    for s in seqs:
        sched.add(s)
    refused = []
    while sched.has_unfinished:
        try:
            plan = sched.schedule()
        except InsufficientMemoryError:
            seq = sched.running[0] if sched.running else sched.waiting[0]
            refused.append(seq.request_id)
            sched.finish(seq, "abort")
            continue
        mgr.take_copy_plan()
        sched.update(plan, [(it.seq.request_id * 31 + it.seq.num_tokens * 7) % 497 + 3 if it.sample else None
                            for it in plan.scheduled])
    mgr.check_integrity()
    assert mgr.used_bytes == 0
    return refused, [s.tokens for s in seqs], mgr


# (model, seeds): the hybrids' seeds were refused with a host tier before the fix; the attention
# models guard the same promise where nothing failed
CASES = [("tiny-falcon-h1", (5, 14, 16)), ("tiny-bamba", (5, 6)), ("tiny-granite-4h", (16,)),
         ("tiny-nemotron-h", (6,)), ("tiny-jamba", (5,)), ("tiny-gemma3", (5,)), ("tiny-llama", (16,))]


@pytest.mark.parametrize(("model", "seeds"), CASES, ids=[c[0] for c in CASES])
def test_every_request_that_runs_without_a_host_tier_runs_with_one(model, seeds):
    for seed in seeds:
        prompts = shared_prefix_trace(seed)
        without, want, _ = serve_trace(model, prompts, None)
        with_tier, got, mgr = serve_trace(model, prompts, 4 << 20)
        assert not without, f"{model} seed {seed}: the device pool alone should serve every request"
        assert with_tier == [], f"{model} seed {seed}: refused with a host tier: {with_tier}"
        assert got == want
        st = mgr.stats()
        assert st.demotions > 0 and st.promotions > 0, "the host tier should have served hits"


@pytest.mark.slow
def test_the_engine_serves_the_trace_with_a_host_tier_and_the_same_tokens():
    """tiny Falcon-H1 in the engine (random weights, greedy): request 7 of seed 5 was refused with the tier."""
    import torch

    import jenga

    torch.set_num_threads(1)
    prompts = [{"prompt_token_ids": p} for p in shared_prefix_trace(5)]
    params = jenga.SamplingParams(max_tokens=12, temperature=0, return_logits=True)
    outs = {}
    for host in (None, "4MiB"):
        llm = jenga.LLM("tiny-falcon-h1", random_weights=True, seed=0, kv_memory="1MiB", host_kv_memory=host)
        outs[host] = llm.generate(prompts, params)
        llm.manager.check_integrity()
        assert llm.manager.used_bytes == 0
    st = llm.manager.stats()
    assert st.demotions > 0 and st.promotions > 0 and st.host_hit_tokens > 0
    assert [o.token_ids for o in outs["4MiB"]] == [o.token_ids for o in outs[None]]
    for a, b in zip(outs["4MiB"], outs[None], strict=True):
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), atol=1e-4, rtol=1e-4)
