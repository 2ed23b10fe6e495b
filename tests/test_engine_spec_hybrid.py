"""Speculative decoding on state hybrids (Mamba-1, Mamba-2, Gated DeltaNet) gives the target's tokens.

A rejected draft must leave each recurrent state (conv and SSM / delta-rule) where the accepted
tokens put it, in the target and in the draft (:mod:`jenga.engine.speculative_state`), and a prefix
hit must only restore a state written at an accepted position.  Greedy output equals the target
alone with a draft that is sometimes wrong (the target's weights plus noise), prefix caching on and
off, checkpoints every page (so kept drafts cross checkpoint positions), and under pressure
(preemptions and evictions asserted).  The draft's own state is checked directly: every proposal
equals the draft model alone's greedy continuation of the same tokens.  The fast slice takes one
``k`` per family; the full grid (k = 1, 3, 5 x caching x pressure, six families) is marked slow.
"""

from __future__ import annotations

import pytest
import torch

import jenga
from jenga import SamplingParams
from jenga.engine import speculative
from jenga.errors import UnsupportedFeatureError

torch.set_num_threads(1)
MAX_TOKENS = 10
GREEDY = SamplingParams(max_tokens=MAX_TOKENS)
COMMON = dict(state_checkpoint_interval=16, max_num_batched_tokens=128)
NOISE = {"tiny-qwen3-next": 0.001}  # per family: the draft's weight noise (default 0.003): acceptance in (0, 1)
_ALONE: dict = {}


def prompts(n=8, seed=0):
    """``n`` prompts over two shared prefixes (one past a page, one past two) and short suffixes."""
    gen = torch.Generator().manual_seed(seed)
    pre = [torch.randint(3, 500, (m,), generator=gen).tolist() for m in (21, 37)]
    return [pre[i % 2] + torch.randint(3, 500, (1 + (5 * i) % 9,), generator=gen).tolist() for i in range(n)]


def target_alone(model, ps):
    key = (model, repr(ps))
    if key not in _ALONE:
        _ALONE[key] = [o.token_ids for o in jenga.LLM(model, **COMMON).generate(ps, GREEDY)]
    return _ALONE[key]


def noisy(llm, std, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in llm.speculative.draft.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)


def speculative_run(model, ps, k, *, caching=True, kv_memory="64MiB", draft=None, **engine):
    llm = jenga.LLM(model, **{**COMMON, **engine}, speculative_model=draft or model, num_speculative_tokens=k,
                    speculative_seed=0, enable_prefix_caching=caching, kv_memory=kv_memory)
    if draft is None:
        noisy(llm, NOISE.get(model, 0.003))
    outs = llm.generate(ps, GREEDY)
    llm.hit_tokens = sum(o.prefix_hit_tokens for o in outs)
    return [o.token_ids for o in outs], llm


def check(model, k, caching, kv_memory=None):
    """Speculative greedy output equals the target alone's; ``kv_memory``: under pressure (a budget
    admitting every prompt at once, so requests preempt), else 64 MiB with prefix hits asserted."""
    ps = prompts()
    pressure = dict(kv_memory=kv_memory, max_num_batched_tokens=512) if kv_memory else {}
    got, llm = speculative_run(model, ps, k, caching=caching, **pressure)
    assert got == target_alone(model, ps)
    assert 0 < llm.metrics.acceptance_rate < 1  # drafts kept and drafts rejected
    if not kv_memory:
        assert (llm.hit_tokens > 0) == caching  # prefix hits restored states (caching on)
    llm.manager.check_integrity()
    assert llm.manager.stats().used_bytes == 0
    return llm


@pytest.mark.parametrize("model,k", [("tiny-qwen3-next", 3), ("tiny-jamba", 5), ("tiny-falcon-h1", 1),
                                     ("tiny-bamba", 3)])
def test_greedy_equals_target_alone(model, k):
    for caching in (True, False):
        check(model, k, caching)


def test_under_pressure_with_preemption_and_eviction():
    llm = check("tiny-jamba", 3, True, kv_memory="768KiB")
    assert llm.scheduler.stats.preemptions > 0
    assert llm.manager.stats().evicted_pages > 0


def test_with_a_host_tier_under_pressure():
    ps = prompts()
    got, llm = speculative_run("tiny-jamba", ps, 3, kv_memory="768KiB", max_num_batched_tokens=512,
                               host_kv_memory="4MiB")
    assert got == target_alone("tiny-jamba", ps)
    c = llm.host_pool.counters
    assert c.pages_demoted > 0 and c.pages_promoted > 0 and llm.scheduler.stats.preemptions > 0


def test_next_turn_resumes_from_states_written_by_kept_drafts():
    """Turn 2 continues turn 1's prompts and answers: its prefix hits restore checkpoints written at
    decode positions, some of them inside kept drafts (written by the replay, not by a forward)."""
    gen = torch.Generator().manual_seed(3)
    model, ps = "tiny-jamba", [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (5, 9, 14, 20, 27, 30)]
    params = SamplingParams(max_tokens=24)
    llm = jenga.LLM(model, **COMMON, speculative_model=model, num_speculative_tokens=5, speculative_seed=0)
    noisy(llm, NOISE.get(model, 0.003))
    alone = jenga.LLM(model, **COMMON)
    first = [o.token_ids for o in llm.generate(ps, params)]
    assert first == [o.token_ids for o in alone.generate(ps, params)]
    turn2 = [p + a + [7, 8, 9] for p, a in zip(ps, first, strict=True)]
    outs = llm.generate(turn2, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in alone.generate(turn2, params)]
    assert any(o.prefix_hit_tokens > len(p) + 16 for o, p in zip(outs, ps, strict=True))  # past the old prompt
    assert 0 < llm.metrics.acceptance_rate < 1


def test_draft_proposals_equal_the_draft_alone(monkeypatch):
    """The draft's state after rejected proposals is rolled back: each step's proposals are the draft
    model's own greedy continuation of the tokens so far (checked against the draft alone)."""
    model, ps, seen = "tiny-bamba", prompts(), []
    forward = speculative.SpeculativeDecoder._forward

    def spy(self, runner, items, rows, spec=None):
        if runner is self.target and spec is not None:
            for it, s in zip(items, spec, strict=True):
                if s:
                    toks = it.seq.tokens[:it.start + it.num_tokens]
                    seen.append((toks[:-s], toks[-s:]))
        return forward(self, runner, items, rows, spec)

    monkeypatch.setattr(speculative.SpeculativeDecoder, "_forward", spy)
    got, llm = speculative_run(model, ps, 3)
    assert got == target_alone(model, ps)
    assert 0 < llm.metrics.acceptance_rate < 1 and len(seen) > len(ps)
    alone = jenga.LLM(model, **COMMON, seed=0)
    alone.model.load_state_dict(llm.speculative.draft.model.state_dict())
    want = alone.generate([c for c, _ in seen], [SamplingParams(max_tokens=len(d)) for _, d in seen])
    assert [d for _, d in seen] == [o.token_ids for o in want]


@pytest.mark.parametrize("model,draft", [("tiny-jamba", "tiny-llama"), ("tiny-llama", "tiny-qwen3-next")])
def test_hybrid_and_attention_models_as_target_and_draft(model, draft):
    ps = prompts()
    got, llm = speculative_run(model, ps, 3, draft=draft)
    assert got == target_alone(model, ps)
    assert llm.metrics.spec_proposed > 0


def test_a_manager_without_draft_groups_is_refused_at_start():
    with pytest.raises(UnsupportedFeatureError, match="manager .paged.*shared cache groups"):
        jenga.LLM("tiny-jamba", manager="paged", speculative_model="tiny-jamba")


#: per family: a KV budget that preempts (caching off) and evicts (caching on) these prompts
PRESSURE = {"tiny-qwen3-next": "512KiB", "tiny-jamba": "768KiB"}


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("model", ["tiny-qwen3-next", "tiny-jamba", "tiny-falcon-h1", "tiny-bamba",
                                   "tiny-nemotron-h", "tiny-granite-4h"])
def test_full_grid(model, k):
    for caching in (True, False):
        check(model, k, caching)
        llm = check(model, k, caching, kv_memory=PRESSURE.get(model, "1536KiB"))
        if caching:
            assert llm.manager.stats().evicted_pages > 0
        else:
            assert llm.scheduler.stats.preemptions > 0
