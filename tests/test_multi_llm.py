"""``MultiLLM``: each model's greedy outputs through the shared pool equal that model served alone
(same budget) under a load that shifts from one model to the other; aborts leak no page."""

from __future__ import annotations

import pytest
import torch

from jenga import LLM, SamplingParams
from jenga.engine.multi_llm import MultiLLM
from jenga.errors import InvalidArgumentError

torch.set_num_threads(1)
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 500, (int(torch.randint(24, 90, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(n)]


def shifting_load(eng: MultiLLM, a: str, b: str) -> dict:
    """A wave at ``a`` (and one request at ``b``), then, while it runs, a wave at ``b``."""
    first = [(a, p) for p in prompts(8, 1)] + [(b, p) for p in prompts(1, 2)]
    second = [(b, p) for p in prompts(8, 3)] + [(a, p) for p in prompts(1, 4)]
    peak = dict.fromkeys((a, b), 0)

    def step():
        eng.step()
        for m in peak:
            peak[m] = max(peak[m], eng.manager.model_used_bytes(m))

    seqs = [(m, p, eng.add_request(m, {"prompt_token_ids": p}, GREEDY)) for m, p in first]
    for _ in range(6):
        step()
    seqs += [(m, p, eng.add_request(m, {"prompt_token_ids": p}, GREEDY)) for m, p in second]
    while eng.has_unfinished:
        step()
    eng.peak = peak
    eng.manager.check_integrity()
    assert eng.manager.used_bytes == 0
    return {m: [(p, list(s.output_token_ids)) for mm, p, s in seqs if mm == m] for m in (a, b)}


@pytest.mark.parametrize("a,b,split", [("tiny-llama", "tiny-gemma3", None), ("tiny-llama", "tiny-jamba", None),
                                       ("tiny-gemma3", "tiny-jamba-1to7", True)])
def test_shared_pool_outputs_equal_each_model_served_alone(a, b, split):
    """``split``: the groups split into power-of-two layer counts (Gemma's 5 sliding layers as 4 + 1,
    Jamba's 7 Mamba layers as 4 + 2 + 1), as a pool whose LCM page needs it plans them."""
    budget = "2MiB"
    eng = MultiLLM([a, b], kv_memory=budget, max_model_len=128, manager_kwargs={"split_groups": split})
    if split:
        assert len(eng.manager.model.groups) == 7
    got = shifting_load(eng, a, b)
    for name in (a, b):
        solo = LLM(name, kv_memory=budget)
        want = solo.generate([p for p, _ in got[name]], GREEDY)
        assert [o.token_ids for o in want] == [t for _, t in got[name]], name
    if split:
        return  # the 1:7 Jamba's state pages need less than half the pool at its wave
    # memory followed the load: each model at its wave held more than a static even split of the
    # same bytes would give it (a pool of half the budget, less its slack large page)
    S = eng.manager.pool.large_page_bytes
    half = (eng.manager.memory_bytes // 2 // S - 1) * S
    assert eng.peak[a] > half and eng.peak[b] > half, (eng.peak, half)


def test_aborts_leak_no_page_and_requests_are_routed():
    eng = MultiLLM(["tiny-llama", "tiny-gemma3"], kv_memory="1536KiB", max_model_len=128)
    ids = [eng.add_request(m, {"prompt_token_ids": p}, GREEDY).request_id
           for m in ("tiny-llama", "tiny-gemma3") for p in prompts(3, 5)]
    eng.step()
    eng.step()
    for rid in ids[::2]:
        assert eng.abort(rid)
    eng.manager.check_integrity()
    while eng.has_unfinished:
        eng.step()
    eng.manager.check_integrity()
    assert eng.manager.used_bytes == 0 and not eng.manager.requests
    with pytest.raises(InvalidArgumentError, match="unknown model 'tiny-qwen3'; served models: tiny-llama, tiny-gemma3"):
        eng.add_request("tiny-qwen3", [5, 6, 7])
    with pytest.raises(InvalidArgumentError, match="named twice"):
        MultiLLM(["tiny-llama", "tiny-llama"])
