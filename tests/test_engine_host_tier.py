"""The host-memory tier in the engine, per page kind, against HF and against the same run without it.

Each test serves a cyclic set of long prompts ("articles") through a device pool that holds about
two of them, twice over: without the tier the second round misses (its prefixes were evicted);
with ``host_kv_memory`` the evicted pages are demoted to host and the second round's hits are
promoted back before the step's forward.  The tier's counters must show demotions, promotions
and tokens served from host; greedy tokens equal the run without the tier and HF's ``generate``
(logits to 1e-4).  Kinds: full + sliding attention (tiny Gemma-3), Mamba state checkpoints
(tiny Jamba), vision-embedding pages (tiny Gemma-3 with images: the image is not encoded again),
and preemption: a request leaving after its lookup promoted pages (before the copy ran), a running
one holding promoted pages preempted and admitted again.
"""

from __future__ import annotations

import pytest
import torch
from test_engine_e2e import check_against_hf, hf_twin, rand_prompts
from test_engine_hybrid import assert_hf_equal
from test_engine_vlm import check as check_vlm
from test_engine_vlm import images, prompt

import jenga
from jenga import SamplingParams
from jenga.errors import InsufficientMemoryError, InvalidArgumentError

torch.set_num_threads(1)
GREEDY = SamplingParams(max_tokens=4, return_logits=True)


def two_rounds(llm, docs, params=GREEDY, seed=50):
    """Each document with a question, one request at a time, then each with another question."""
    qs = rand_prompts([5] * 2 * len(docs), seed=seed)
    outs = []
    for r in range(2):
        for i, d in enumerate(docs):
            outs += llm.generate([d + qs[r * len(docs) + i]], params)
    return outs


def tier_moved(llm, prefix_hit: bool = True) -> dict:
    st = llm.manager.stats()
    assert st.host_total_bytes > 0
    assert st.demotions > 0 and st.bytes_demoted > 0, "the small device pool should demote evicted pages"
    assert st.promotions > 0 and st.bytes_promoted > 0, "the second round should hit host pages"
    assert (st.host_hit_tokens > 0) == prefix_hit  # an image's pages are no prefix hit
    pool = llm.host_pool.counters  # the engine copied exactly what the manager planned
    assert (pool.pages_demoted, pool.pages_promoted) == (st.demotions, st.promotions)
    assert (pool.bytes_demoted, pool.bytes_promoted) == (st.bytes_demoted, st.bytes_promoted)
    llm.manager.check_integrity()
    return st


def same_tokens(a, b):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.stack(x.logits), torch.stack(y.logits), atol=1e-5, rtol=1e-5)


def test_full_and_sliding_pages_round_trip():
    docs = rand_prompts([150, 140, 160, 130], seed=40)
    kw = dict(kv_memory="1152KiB", max_num_batched_tokens=64)
    base = jenga.LLM("tiny-gemma3", **kw)
    tier = jenga.LLM("tiny-gemma3", host_kv_memory="4MiB", **kw)
    want, got = two_rounds(base, docs), two_rounds(tier, docs)
    tier_moved(tier)
    hits = [sum(o.prefix_hit_tokens for o in outs[len(docs):]) for outs in (want, got)]
    assert hits[1] >= hits[0] + 3 * 128, f"second-round hits {hits}: the tier should serve the evicted prefixes"
    same_tokens(want, got)
    check_against_hf(tier, got, 4)


def test_mamba_checkpoints_round_trip():
    gen = torch.Generator().manual_seed(41)
    docs = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (96, 100, 90, 104)]
    kw = dict(kv_memory="400KiB", max_num_batched_tokens=64, state_checkpoint_interval=32)
    base = jenga.LLM("tiny-jamba", **kw)
    tier = jenga.LLM("tiny-jamba", host_kv_memory="2MiB", **kw)
    want, got = two_rounds(base, docs), two_rounds(tier, docs)
    tier_moved(tier)
    assert sum(o.prefix_hit_tokens for o in got[4:]) > sum(o.prefix_hit_tokens for o in want[4:])
    same_tokens(want, got)
    assert_hf_equal(tier, got)


def test_image_pages_are_promoted_not_encoded_again():
    p = SamplingParams(max_tokens=5, return_logits=True)
    (img,) = images(1, seed=12)
    first, again = prompt([6, 5], [img], seed=13), prompt([7, 4], [img], seed=15)
    gen = torch.Generator().manual_seed(14)
    fillers = [torch.randint(3, 500, (60,), generator=gen).tolist() for _ in range(4)]
    runs = {}
    for host in (None, "4MiB"):
        llm = jenga.LLM("tiny-gemma3-vision", kv_memory=640 << 10, max_num_batched_tokens=64, host_kv_memory=host)
        outs = llm.generate(first, p)
        llm.generate(fillers, SamplingParams(max_tokens=4))
        outs += llm.generate(again, p)
        runs[host] = (llm, outs)
    assert runs[None][0].metrics.encoder_runs == 2  # without the tier the evicted image runs again
    llm, outs = runs["4MiB"]
    assert llm.metrics.encoder_runs == 1, "the image's embedding pages should come back from host"
    tier_moved(llm, prefix_hit=False)
    same_tokens(runs[None][1], outs)
    check_vlm(llm, [first, again], outs)


def test_promotions_of_requests_that_leave_or_are_preempted(monkeypatch):
    """tiny-llama (full attention), a pool of ~1.5 of the batch's requests: a waiting request's lookup
    promotes its host pages, then its first chunk does not fit and it leaves before the step (the
    manager gives the promotion back: no copy), and a running one holding promoted pages is
    preempted by decode growth, freed and admitted again."""
    docs = rand_prompts([100, 90, 110], seed=42)
    kw = dict(kv_memory="640KiB", max_num_batched_tokens=64)
    params = SamplingParams(max_tokens=60, return_logits=True, ignore_eos=True)
    llm = jenga.LLM("tiny-llama", host_kv_memory="2MiB", **kw)
    base = jenga.LLM("tiny-llama", **kw)
    for engine in (llm, base):  # the documents' pages: cached, then pushed to host by two other prompts
        engine.generate(docs, SamplingParams(max_tokens=2))
        engine.generate(rand_prompts([150, 150], seed=43), SamplingParams(max_tokens=2))
    before = llm.manager.stats()
    left = []  # the scheduler's hook for an admission that did not fit
    leave = llm.scheduler.leave
    monkeypatch.setattr(llm.scheduler, "leave", lambda seq: (left.append(seq.request_id), leave(seq)))
    batch = [d + q for d, q in zip(docs, rand_prompts([9, 9, 9], seed=44), strict=True)]
    got, want = llm.generate(batch, params), base.generate(batch, params)
    assert any(o.num_preemptions for o in got), "decode growth should preempt"
    assert left, "a request with host hits should have been looked up and not fit"
    st = tier_moved(llm)
    assert st.promotions > before.promotions and st.host_hit_tokens > before.host_hit_tokens
    same_tokens(want, got)
    hf = hf_twin(llm)
    for out in got:  # ignore_eos: HF's forward over the whole sequence
        seq = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            ref = hf(seq).logits[0, len(out.prompt_token_ids) - 1:-1]
        assert out.token_ids == ref.argmax(-1).tolist()
        torch.testing.assert_close(torch.stack(out.logits), ref, atol=1e-4, rtol=1e-4)


def test_bad_host_tier_sizes_are_typed_errors():
    with pytest.raises(InvalidArgumentError, match="byte size"):
        jenga.LLM("tiny-llama", host_kv_memory="lots")
    with pytest.raises(InsufficientMemoryError, match="host_memory_bytes"):
        jenga.LLM("tiny-llama", host_kv_memory=1000)  # less than one large page
    llm = jenga.LLM("tiny-llama", kv_memory="1MiB", host_kv_memory="1MiB")
    assert llm.host_pool.layout.num_large == llm.manager.host_num_large == (1 << 20) // llm.manager.large_page_bytes
    assert jenga.LLM("tiny-llama").host_pool is None
