"""Never a stall where stock vLLM runs: jenga's scheduler against vLLM's own at real model layouts.

vLLM's scheduler reserves a new request's whole prompt before it admits it
(``scheduler_reserve_full_isl``, on by default and on every server): ``allocate_slots(...,
full_sequence_must_fit=True)``.  Stock vLLM counts a sliding-window (or chunked-local) group at
most its window (chunk) plus the tokens in flight; jenga's adapter must count what the request
will hold at once too (``KVCacheManager.can_allocate(..., step=...)``), not every page of one
allocate of the whole prompt, which for a long prompt on a sliding model exceeds a pool where
the request runs: then nothing is ever admitted (a stall: requests wait, nothing runs).

Here: the real ``Scheduler`` with vLLM's manager and with jenga's adapter (the plugin's
page-layer config), the real layer layouts of Gemma-3-12B, gpt-oss-20b, Ministral-8B and
Llama-4-Scout (kinds per layer, windows, chunks, KV heads, head size, bf16), prompts of half
to all of ``max_model_len`` tokens, and a KV budget just above the smallest vLLM accepts (one
request of ``max_model_len`` tokens, vLLM's own start-time rule).  The stand-in runner of
:mod:`vllm_async_driver` checks every page read back.  Whatever stock finishes, jenga finishes,
with the same tokens.  No model runs: this module runs on every vLLM version ``make test``
installs.
"""

from __future__ import annotations

import random

import pytest
import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm_async_driver import async_config, kv_config, layer_specs, make_scheduler, run
from vllm_support import model_dir

from jenga.capacity import fits
from jenga.core.policy.registry import cdiv
from jenga.vllm import JengaScheduler
from jenga.vllm.plan import rewrite_config

pytestmark = pytest.mark.xdist_group("vllm-async")


def _pattern(n: int, every: int, local, full_at: int) -> list:
    """``n`` layers: every ``every``-th one (from ``full_at``) full attention, the rest ``local``."""
    return ["full" if i % every == full_at else local for i in range(n)]


#: real layouts (``jenga/catalog``): layer kinds, (KV heads, head size, dtype), max_model_len, the
#: step budget (vLLM's max_num_batched_tokens) and requests.  Ministral's 32k window needs prompts
#: past it (fewer, in larger steps, to stay fast); the others are scaled to 8k-20k-token prompts,
#: their window or chunk still far below the prompt
SHAPES = {
    "gemma-3-12b": (_pattern(48, 6, ("sliding", 1024), 5), (8, 256, torch.bfloat16), 8192, 2048, 5),
    "gpt-oss-20b": (_pattern(24, 2, ("sliding", 128), 1), (8, 64, torch.bfloat16), 8192, 2048, 5),
    "ministral-8b": (_pattern(36, 4, ("sliding", 32768), 0), (8, 128, torch.bfloat16), 49152, 8192, 2),
    "llama-4-scout": (_pattern(48, 4, ("chunked", 8192), 3), (8, 128, torch.bfloat16), 20480, 2048, 4),
}
MAX_TOKENS = 3


def _prompts(max_len: int, n: int) -> list[list[int]]:
    """One prompt as long as ``max_model_len`` allows, the others from half of it up."""
    rng = random.Random(max_len)
    lens = [max_len - MAX_TOKENS] + [rng.randrange(max_len // 2, max_len - MAX_TOKENS) for _ in range(n - 1)]
    return [[rng.randrange(3, 500) for _ in range(n)] for n in lens]


def _whole_prompt_fits(mgr, length: int) -> bool:
    """Whether one allocate of ``length`` tokens fits the empty pool: every page of every token
    group (the count of ``can_allocate`` without ``step``, the rule before the fix)."""
    pages = [cdiv(length, g.tokens_per_page) if g.spec.per_token else 1 for g in mgr.model.groups]
    return fits(mgr, pages)


@pytest.fixture(scope="module", params=[(s, a) for s in SHAPES for a in (False, True)
                                        if not a or s == "gemma-3-12b"],
                ids=lambda p: p[0] + ("-async" if p[1] else ""))
def rows(request, tmp_path_factory):
    shape, async_on = request.param
    layers, attn, max_len, step, n = SHAPES[shape]
    path = model_dir("gemma3", tmp_path_factory.getbasetemp())  # a config for vLLM; the layout comes from here
    ps = _prompts(max_len, n)
    out = {"shape": shape, "prompts": ps}
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the tiny folder's 2048 positions; no model runs
    try:
        for name, cls in (("stock", Scheduler), ("jenga", JengaScheduler)):
            cfg = async_config(path, max_model_len=max_len, max_num_batched_tokens=step, max_num_seqs=8)
            cfg.scheduler_config.async_scheduling = async_on
            assert cfg.scheduler_config.scheduler_reserve_full_isl  # vLLM's default, as on a server
            # just above vLLM's smallest budget: one request of max_model_len tokens (its start check)
            one = sum(s.max_memory_usage_bytes(cfg) for s in layer_specs(cfg, layers, shape=attn).values())
            kv = kv_config(cfg, layers, shape=attn, budget_bytes=one * 21 // 20)
            if cls is JengaScheduler:  # what jenga's vllm.general_plugins entry point does in the engine core
                kv = rewrite_config(kv, max_len)
            sched, hash_block = make_scheduler(cls, cfg, kv)
            tokens, runner, steps, _ = run(sched, hash_block, kv, ps, max_tokens=MAX_TOKENS)
            out[name] = dict(sched=sched, tokens=tokens, runner=runner)
    finally:
        mp.undo()
    return out


def test_jenga_finishes_what_stock_finishes(rows):
    stock, jenga = rows["stock"], rows["jenga"]
    assert all(len(t) == MAX_TOKENS for t in stock["tokens"])
    assert jenga["tokens"] == stock["tokens"]
    assert jenga["runner"].checked > 0
    mgr = jenga["sched"].jenga
    assert mgr.used_bytes == 0 and not mgr.requests
    mgr.check_integrity()


def test_the_whole_prompt_count_would_not_fit(rows):
    """The row is one where counting every page of the prompt stalls: the longest prompt's pages
    exceed jenga's pool, though the request runs (above) in steps holding its window or chunk."""
    mgr = rows["jenga"]["sched"].jenga
    assert not _whole_prompt_fits(mgr, max(len(p) for p in rows["prompts"]))


def _adapter_and_requests(layout: str, budget: int):
    """jenga's adapter on ``layout`` at ``budget`` vLLM blocks (``vllm_adapter_fuzz``'s configs),
    and a maker of one-output-token requests hashed as vLLM's scheduler hashes them."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    from vllm_adapter_fuzz import MAX_LEN, layouts

    from jenga.vllm.adapter import JengaKVCacheAdapter
    _, kv, sched, hash_block = layouts().get(layout, budget)
    adapter = JengaKVCacheAdapter(kv.jenga_plan, kv, max_model_len=MAX_LEN, enable_caching=True, log_stats=False,
                                  enable_kv_cache_events=False, hash_block_size=hash_block, max_step_tokens=MAX_LEN)
    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(hash_block, hash_fn)
    return adapter, lambda rid, prompt: Request(rid, prompt, SamplingParams(max_tokens=1, ignore_eos=True), None,
                                                block_hasher=hasher)


@pytest.mark.parametrize("layout", ["full+swa", "full+mamba"])
def test_waiting_holds_that_fill_the_pool_are_let_go_of_when_nothing_runs(layout):
    """Three 64-token prompts computed and finished (cached), then three waiting requests continuing
    them, looked up by vLLM's scheduler and not admitted: their hits stay held, and on a sliding
    window of 32 (a hit that resumes from its window) or a Mamba state no running request's
    allocation lets go of them.  A fresh prompt's admission with nothing running then lets go of
    them all and runs (else it would wait for ever: nothing else frees a page; with that branch
    taken out of ``JengaKVCacheAdapter._let_go_of_held_hits``, ``allocate_slots`` answers ``None``)."""
    adapter, request = _adapter_and_requests(layout, 14)
    for i in range(3):
        r = request(f"a{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + 64)))
        adapter.get_computed_blocks(r)
        assert adapter.allocate_slots(r, 64) is not None
        r.num_computed_tokens = 64
        adapter.free(r)
    held = []
    for i in range(3):
        r = request(f"b{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + 64)) + [7, 8])
        held.append(adapter.get_computed_blocks(r)[1])
    mgr = adapter.manager
    assert sum(held) >= 128 and mgr.num_allocated == 0, held
    fresh = request("c", list(range(50000, 50096)))
    adapter.get_computed_blocks(fresh)
    assert adapter.allocate_slots(fresh, 96) is not None
    assert [mgr.requests[f"b{i}"].hit for i in range(3)] == [0, 0, 0]
    mgr.check_integrity()
