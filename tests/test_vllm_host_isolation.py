"""Salts and LoRA adapters keep jenga's host pages apart inside vLLM 0.32 (CPU) end to end.

One jenga engine (tight device budget, host tier through ``kv_offloading_size``, LoRA on) serves
one prompt under tenant A (``cache_salt``), other documents until A's pages have left the device
for the host, the prompt under tenant B, then under A again; and the same with two LoRA adapters.
Under B (the other salt, the other adapter) nothing is a hit although A's pages sit on the host;
under A again the whole hit is promoted from the host.  Greedy tokens equal stock vLLM's (no
offloading, ample memory: its CPU build refuses its own) in every phase, so an adapter's pages
served to another would also show in the tokens.  The scheduler-level version, on 0.32 / 0.33 /
0.34 and in the fast suite: ``tests/test_vllm_host_connector.py``.
"""

from __future__ import annotations

import pytest
from vllm_support import close, engine, lora_dir, model_dir, scheduler, workloads

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-lora")]

MAX_TOKENS = 8
TIGHT, HOST_GIB = 128, 0.008  # about 4x the device pool (tests/test_vllm_host_tier.py's Gemma-3 row)


def phases(a: dict, b: dict) -> list[tuple[str, list[list[int]], dict]]:
    """(name, prompts, A's or B's keyword arguments) in order: the prompt under A, other documents
    (no salt, no adapter), under B, under A again."""
    prompt, flush = workloads()["pressure"][:1], workloads(seed=1)["pressure"]
    return [("a", prompt, a), ("flush", flush, {}), ("b", prompt, b), ("a again", prompt, a)]


def serve(llm, cases, hits=None) -> dict:
    """Each phase's greedy tokens and, with ``hits`` (the manager's stats), its (prefix hit, host
    hit) tokens."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    out = {}
    for kind, (a, b) in cases.items():
        for name, prompts, kw in phases(a, b):
            salt = {"cache_salt": kw["salt"]} if "salt" in kw else {}
            before = hits() if hits else None
            res = llm.generate([TokensPrompt(prompt_token_ids=p, **salt) for p in prompts], sp, use_tqdm=False,
                               lora_request=kw.get("lora"))
            after = hits() if hits else None
            out[(kind, name)] = ([list(o.outputs[0].token_ids) for o in res],
                                 None if hits is None else (after.prefix_hit_tokens - before.prefix_hit_tokens,
                                                            after.host_hit_tokens - before.host_hit_tokens))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from vllm.lora.request import LoRARequest

    root = tmp_path_factory.getbasetemp()
    path = model_dir("gemma3", root)
    cases = {"salt": (dict(salt="tenant-a"), dict(salt="tenant-b")),
             "lora": (dict(lora=LoRARequest("a", 1, lora_dir(path, root, "a", seed=1))),
                      dict(lora=LoRARequest("b", 2, lora_dir(path, root, "b", seed=2))))}
    kw = dict(enable_lora=True, max_loras=2, max_lora_rank=8, max_model_len=320)
    stock = engine(path, jenga=False, **kw)
    ref = serve(stock, cases)
    close(stock)
    llm = engine(path, jenga=True, num_blocks=TIGHT, kv_offloading_size=HOST_GIB, **kw)
    sched = scheduler(llm)
    got = serve(llm, cases, hits=sched.jenga.stats)
    yield dict(ref=ref, got=got, sched=sched)
    close(llm)


def test_every_phase_equals_stock(runs):
    assert {k: v[0] for k, v in runs["got"].items()} == {k: v[0] for k, v in runs["ref"].items()}


@pytest.mark.parametrize("kind", ["salt", "lora"])
def test_no_host_hit_across_tenants_or_adapters_and_one_within(runs, kind):
    hits = {name: h for (k, name), (_, h) in runs["got"].items() if k == kind}
    print(f"\n{kind}: (prefix hit, host hit) tokens per phase {hits}")
    assert hits["b"] == (0, 0)  # A's pages were on the host (the next phase finds them there)
    assert hits["a again"][0] == hits["a again"][1] > 0  # every hit token promoted from the host


def test_every_page_back(runs):
    mgr = runs["sched"].jenga
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()
