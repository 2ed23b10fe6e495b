"""``benchmarks/cache_bound.py``: the clairvoyant one-at-a-time ceiling on a tiny cyclic trace,
where plain LRU would hit nothing, with the exact hits worked out by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from cache_bound import belady_serial_hit, bridged_hit_bound, bytes_per_block  # noqa: E402
from conftest import full, group, model, sliding  # noqa: E402
from manager_traces import BlockTrie, TraceRequest  # noqa: E402

from jenga.core.specs import ModelSpec  # noqa: E402


def _cyclic(rounds: int = 2) -> list[TraceRequest]:
    """Articles A, B, C of 4 blocks each, asked in order A B C A B C, one new token each."""
    arts = [np.arange(1 + 64 * a, 65 + 64 * a, dtype=np.int64) for a in range(3)]
    reqs = []
    for r in range(rounds):
        for a in range(3):
            q = np.asarray([1000 + 10 * r + a], dtype=np.int64)
            reqs.append(TraceRequest(f"a{a}r{r}", np.concatenate([arts[a], q]), 1, arrival_step=len(reqs)))
    BlockTrie(reqs)
    return reqs


def test_cyclic_trace_keeps_what_is_used_soonest():
    # pool 9 blocks: a running request holds its 4 prompt blocks + 1 private, so two articles fit.
    # A, B miss; C misses and evicts B (next use 4) before A (3); A hits; B misses and evicts A
    # (never used again); C hits -> 2 x 64 hit tokens of 6 x 65.
    assert belady_serial_hit(_cyclic(), 9) == pytest.approx(128 / 390)


def test_pool_holding_every_article_hits_every_repeat():
    assert belady_serial_hit(_cyclic(), 13) == pytest.approx(3 * 64 / 390)


def test_pool_smaller_than_one_request_is_refused():
    with pytest.raises(ValueError, match="needs 5 blocks"):
        belady_serial_hit(_cyclic(), 4)


def test_ceiling_only_where_every_block_costs_the_same():
    llama = ModelSpec.from_hf_config("llama-3.1-8b", vision=False)
    assert bytes_per_block(llama, 100_000) == 32 * 4096 * 16
    ministral = ModelSpec.from_hf_config("ministral-8b", vision=False)  # 32k window
    assert bytes_per_block(ministral, 22_000) == 36 * 4096 * 16
    assert bytes_per_block(ministral, 40_000) is None
    assert bytes_per_block(ModelSpec.from_hf_config("jamba-1.5-mini", vision=False), 100) is None


def test_bridged_bound_equals_the_ceiling_where_blocks_cost_the_same():
    llama = ModelSpec.from_hf_config("llama-3.1-8b", vision=False)
    b = bytes_per_block(llama, 100)
    for blocks in (9, 13):
        assert bridged_hit_bound(_cyclic(), llama, blocks * b) == pytest.approx(belady_serial_hit(_cyclic(), blocks))


def test_bridged_bound_charges_a_hit_only_the_window_before_it():
    # one full and one sliding layer of equal bytes per block, window 17 tokens (one block before
    # the hit): a hit on an article's 4 blocks needs 4 + 1 units cached, a running request holds
    # 5 full blocks + its last window block (6).  With 12 units, at moment 2 (C's first question
    # running) the 6 left hold A's bridge and a fifth of B's; at moment 4 (B's second) C's bridge.
    toy = model(group("full", full(), 1), group("swa", sliding(17), 1, first_layer=1))
    unit = toy.groups[0].spec.bytes_per_token() * 16
    assert bytes_per_block(toy, 65) is None  # no uniform-cost ceiling here
    assert bridged_hit_bound(_cyclic(), toy, 12 * unit) == pytest.approx((64 + 64 / 5 + 64) / 390)
    assert bridged_hit_bound(_cyclic(), toy, 11 * unit) == pytest.approx(128 / 390)


def test_bound_without_first_use_bridges_counts_only_prefixes_reused_before():
    # a pool holding every article: rounds 2 and 3 hit (6 x 64 of 9 x 65 tokens); with
    # ``after_uses=2`` round 2's hits need pages kept since their only earlier use, across other
    # requests: only round 3's count; with 3 none does
    llama = ModelSpec.from_hf_config("llama-3.1-8b", vision=False)
    pool = 13 * bytes_per_block(llama, 100)
    reqs = _cyclic(3)
    assert bridged_hit_bound(reqs, llama, pool) == pytest.approx(6 * 64 / 585)
    assert bridged_hit_bound(reqs, llama, pool, after_uses=2) == pytest.approx(3 * 64 / 585)
    assert bridged_hit_bound(reqs, llama, pool, after_uses=3) == 0.0
    # a repeat right after the first use spans no other request: it keeps nothing past one, counts
    art = np.arange(1, 65, dtype=np.int64)
    twice = [TraceRequest(f"q{i}", np.concatenate([art, [1000 + i]]), 1, arrival_step=i) for i in range(2)]
    BlockTrie(twice)
    assert bridged_hit_bound(twice, llama, pool, after_uses=2) == pytest.approx(64 / 130)
