"""LoRA adapters inside vLLM with jenga's scheduler (tiny Gemma-3, two random rank-8 adapters
on the attention projections, written in PEFT's format): greedy tokens equal stock vLLM's
for the base model, each adapter alone, and both adapters in one batch; a prompt cached under
one adapter (or none) is never a prefix hit under another, and is one under the same adapter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm_support import close, engine, lora_dir, model_dir, scheduler, workloads

from jenga.vllm.adapter import JengaKVCacheAdapter

pytestmark = pytest.mark.xdist_group("vllm-lora")

MAX_TOKENS = 8


def phases(a, b):
    """(name, prompts (indices into ``prompts``), adapters): run one after another on one engine."""
    return [("a", [0], [a]), ("b", [0], [b]), ("base", [0], [None]),
            ("mixed", [0, 1, 0, 1], [a, b, b, a]), ("a again", [1], [a])]


def run_phases(llm, prompts, a, b, hits=None):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    for name, idx, loras in phases(a, b):
        before = hits() if hits else 0
        res = llm.generate([TokensPrompt(prompt_token_ids=prompts[i]) for i in idx], sp, use_tqdm=False,
                           lora_request=loras)
        out[name] = ([list(o.outputs[0].token_ids) for o in res], hits() - before if hits else None)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.getbasetemp()
    path = model_dir("gemma3", root)
    a = LoRARequest("a", 1, lora_dir(path, root, "a", seed=1))
    b = LoRARequest("b", 2, lora_dir(path, root, "b", seed=2))
    w = workloads()
    prompts = w["first"] + w["shared"][:1]
    kw = dict(enable_lora=True, max_loras=2, max_lora_rank=8)
    stock = engine(path, jenga=False, **kw)
    ref = run_phases(stock, prompts, a, b)
    close(stock)
    llm = engine(path, jenga=True, **kw)
    sched = scheduler(llm)
    got = run_phases(llm, prompts, a, b, hits=lambda: sched.jenga.stats().prefix_hit_tokens)
    yield dict(ref=ref, got=got, sched=sched)
    close(llm)


def test_every_phase_equals_stock(runs):
    assert {k: v[0] for k, v in runs["got"].items()} == {k: v[0] for k, v in runs["ref"].items()}
    # the adapters change the tokens: the comparison would notice an adapter mixed up
    assert len({tuple(runs["got"][k][0][0]) for k in ("a", "b", "base")}) == 3


def test_pages_never_shared_across_adapters(runs):
    got = runs["got"]
    assert got["a"][1] == 0  # a cold prompt
    assert got["b"][1] == 0  # cached under adapter a only
    assert got["base"][1] == 0  # cached under a and b, not under the base model
    # prompt 0 is cached under a and b (5 full blocks each); prompt 1 shares its first 4 blocks
    # with prompt 0 under each adapter
    assert got["mixed"][1] == 2 * 160 + 2 * 128
    assert got["a again"][1] >= 128


def test_every_page_reclaimed(runs):
    mgr = runs["sched"].jenga
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()


def test_jengas_own_hashes_are_salted_by_the_adapter():
    def req(salt, lora):
        return SimpleNamespace(cache_salt=salt, lora_request=None if lora is None else SimpleNamespace(lora_name=lora))

    salts = [JengaKVCacheAdapter.cache_salt(req(s, lr)) for s in (None, "t1") for lr in (None, "a", "b")]
    assert salts[0] is None and salts[3] == "t1"
    assert len(set(salts)) == 6

