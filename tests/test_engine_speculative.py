"""Speculative decoding with draft + target in one jenga pool.

Greedy output must equal the target alone token for token (and HF ``generate``) for k = 1, 3, 5
with a draft that is sometimes wrong (the target's weights plus noise: acceptance strictly
between 0 and 1), with a random draft of another architecture, and under forced preemption.
A draft with the target's own weights must have every proposal accepted (its K/V in the shared
pool is right).  Rejection sampling is checked statistically on a 5-token vocabulary.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import jenga
from jenga import SamplingParams
from jenga.engine.rejection_sampler import verify
from jenga.errors import InsufficientMemoryError, InvalidArgumentError

torch.set_num_threads(1)
GREEDY = SamplingParams(max_tokens=12)
_BASE: dict = {}


def prompts(lengths=(20, 37, 9), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (n,), generator=gen).tolist() for n in lengths]


def target_alone(name, ps, params=GREEDY):
    key = (name, repr(ps), params.max_tokens)
    if key not in _BASE:
        llm = jenga.LLM(name, kv_memory="8MiB")
        _BASE[key] = [o.token_ids for o in llm.generate(ps, params)], llm
    return _BASE[key]


def noisy_draft(llm, std=0.02, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in llm.speculative.draft.model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_equals_target_alone_with_a_sometimes_wrong_draft(k):
    ps = prompts()
    want, base = target_alone("tiny-gemma3", ps)
    llm = jenga.LLM("tiny-gemma3", kv_memory="8MiB", speculative_model="tiny-gemma3", num_speculative_tokens=k,
                    speculative_seed=0)
    assert [g.name for g in llm.manager.model.groups] == ["sliding", "full", "draft/sliding", "draft/full"]
    noisy_draft(llm)
    got = [o.token_ids for o in llm.generate(ps, GREEDY)]
    assert got == want
    m = llm.metrics
    assert 0 < m.acceptance_rate < 1
    assert m.tokens_per_target_forward > 1
    if k == 3:  # and the target alone is HF's own greedy decoding
        hf = tf.Gemma3ForCausalLM(base.config).eval()
        hf.load_state_dict(base.model.state_dict())
        for p, toks in zip(ps, got, strict=True):
            ids = torch.tensor([p])
            res = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                              pad_token_id=0)
            assert toks == res[0, len(p):].tolist()


def test_identical_draft_is_always_accepted():
    ps = prompts()
    want, _ = target_alone("tiny-llama", ps)
    llm = jenga.LLM("tiny-llama", kv_memory="8MiB", speculative_model="tiny-llama", num_speculative_tokens=3,
                    speculative_seed=0)
    assert [o.token_ids for o in llm.generate(ps, GREEDY)] == want
    assert llm.metrics.acceptance_rate == 1.0
    assert llm.metrics.tokens_per_target_forward > 3


def test_random_draft_of_another_architecture():
    ps = prompts(seed=1)
    want, _ = target_alone("tiny-gemma3", ps)
    llm = jenga.LLM("tiny-gemma3", kv_memory="8MiB", speculative_model="tiny-llama", num_speculative_tokens=3)
    assert [o.token_ids for o in llm.generate(ps, GREEDY)] == want
    assert llm.metrics.spec_proposed > 0


def test_forced_preemption_keeps_greedy_output():
    ps = prompts((40, 35, 44, 30, 38), seed=2)
    params = SamplingParams(max_tokens=32)
    want, _ = target_alone("tiny-llama", ps, params)
    llm = jenga.LLM("tiny-llama", kv_memory="1MiB", speculative_model="tiny-llama", num_speculative_tokens=3,
                    speculative_seed=0, max_num_batched_tokens=64)
    noisy_draft(llm)
    got = [o.token_ids for o in llm.generate(ps, params)]
    assert llm.scheduler.stats.preemptions > 0
    assert got == want
    llm.manager.check_integrity()
    assert llm.manager.stats().used_bytes == 0  # nothing leaked


def test_sampling_runs_with_seeded_requests():
    llm = jenga.LLM("tiny-llama", kv_memory="8MiB", speculative_model="tiny-llama", num_speculative_tokens=3,
                    speculative_seed=0)
    noisy_draft(llm)
    params = SamplingParams(max_tokens=12, temperature=0.8, top_k=50, seed=7)
    a = [o.token_ids for o in llm.generate(prompts(), params)]
    assert all(len(t) == 12 for t in a)
    assert llm.metrics.spec_accepted > 0


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_keeps_the_target_distribution():
    gen = torch.Generator().manual_seed(0)
    V, k, trials = 5, 2, 6000
    p = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05], [0.1, 0.1, 0.2, 0.3, 0.3], [0.2, 0.2, 0.2, 0.2, 0.2]])
    q = torch.tensor([[0.05, 0.1, 0.15, 0.3, 0.4], [0.3, 0.3, 0.2, 0.1, 0.1]])
    first = torch.zeros(V)
    second_after_accept = torch.zeros(V)
    naive = torch.zeros(V)
    accepted_first = 0
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
        out = verify(p, q, drafts, gen)
        first[out[0]] += 1
        naive[drafts[0]] += 1  # a broken verifier that keeps every draft
        if len(out) > 1:
            accepted_first += 1
            second_after_accept[out[1]] += 1
    # chi-square with 4 degrees of freedom: 18.47 is the 0.1 % critical value
    assert _chi2(first, p[0]) < 18.47
    assert _chi2(second_after_accept, p[1]) < 18.47
    assert _chi2(naive, p[0]) > 1000  # the test can tell a wrong distribution apart
    overlap = float(torch.minimum(p[0], q[0]).sum())  # P(first draft kept) = sum min(p, q)
    assert abs(accepted_first / trials - overlap) < 0.025  # 4 standard deviations


def test_bad_speculative_arguments():
    with pytest.raises(InvalidArgumentError, match="num_speculative_tokens"):
        jenga.LLM("tiny-llama", speculative_model="tiny-llama", num_speculative_tokens=0)
    with pytest.raises(InvalidArgumentError, match="vision-language"):
        jenga.LLM("tiny-gemma3-vision", speculative_model="tiny-gemma3")


def test_the_schedulers_fit_probe_counts_the_draft_slots(monkeypatch):
    """A request running alone whose chunk does not fit is given the longest chunk ``can_allocate``
    accepts; ``allocate`` adds the draft slots, so the probe must count them too (found by the cache
    oracle: a probe without them picked a chunk ``allocate`` then refused, and the engine raised
    "needs pages for N tokens, more than the whole KV cache holds")."""
    llm = jenga.LLM("tiny-gemma3", kv_memory="8MiB", speculative_model="tiny-gemma3", num_speculative_tokens=3)
    seq = llm.add_request(prompts((20,))[0], GREEDY)
    llm.scheduler._enter(seq)
    asked = []
    raw = llm.manager.can_allocate
    monkeypatch.setattr(llm.manager, "can_allocate", lambda rid, n, **kw: asked.append(kw) or raw(rid, n, **kw))
    assert llm.scheduler.mgr.can_allocate(seq.request_id, 5)
    assert asked == [dict(num_lookahead=3)]
    llm.abort(seq.request_id)


def test_the_request_limits_count_the_draft_slots():
    """Every step also holds the ``k`` draft slots past its tokens, so a sliding group holds a page
    more than the same request without a draft: the length ``RequestLimits`` promises counts them
    (``capacity.peak_pages`` with the lookahead), so the longest request it admits runs to the end
    alone, and a longer one is refused at ``add_request`` (found by the cache oracle: at a tight
    budget the limits promised twice the tokens, and the engine raised "needs pages for N tokens,
    more than the whole KV cache holds" mid-run)."""
    spec = dict(speculative_model="tiny-gemma3", num_speculative_tokens=3)
    page = jenga.LLM("tiny-gemma3", kv_memory="8MiB", **spec).manager.large_page_bytes
    llm = jenga.LLM("tiny-gemma3", kv_memory=15 * page, **spec)
    longest = llm.limits.max_len
    assert longest < llm.limits.model_max_len
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    [out] = llm.generate(prompts((longest - 8,)), params)
    assert len(out.token_ids) == 8
    with pytest.raises(InsufficientMemoryError, match=f"at most {longest} tokens"):
        llm.add_request(prompts((longest - 7,))[0], params)
    assert not llm.scheduler.waiting and not llm.scheduler.running
    assert not llm.manager.requests
    llm.manager.check_integrity()
