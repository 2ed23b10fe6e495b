"""``benchmarks/vs_vllm_manager.py --repeat N`` on a row: the sides run N times, the outcome of
every run must agree (the managers are deterministic), us/step is the median."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vs_vllm_manager import fmt, merge_runs, run_row  # noqa: E402


def _args(repeat: int, no_prefix_caching: bool = False) -> SimpleNamespace:
    return SimpleNamespace(memory_gib=None, scale=0.02, no_vllm=True, budget=8192, max_running=256,
                           retention="0", verbose=False, repeat=repeat, no_prefix_caching=no_prefix_caching)


def test_repeated_runs_of_a_row_agree_and_report_the_median():
    once = run_row("llama-3.1-8b:short", _args(1))["jenga"]
    res = run_row("llama-3.1-8b:short", _args(3))
    j = res["jenga"]
    assert j["runs"] == 3 and "ratios" not in res  # no vLLM side: no ratio
    for k in ("steps", "hit", "query", "held", "needed", "preempt"):
        assert j[k] == once[k]
    assert j["hit"] > 0 and j["us_step"] > 0
    assert fmt(res)[6] == "-"


def test_runs_that_disagree_are_refused():
    base = dict(steps=10, held=5, stranded=5, needed=4, running=3, peak=2, preempt=0, hit=7, query=9, rehit=0,
                requery=0, us_step=1.0, gc_ms=0.5)
    merged = merge_runs([base, {**base, "us_step": 3.0, "gc_ms": 2.0}, {**base, "us_step": 2.0}])
    assert merged["us_step"] == 2.0 and merged["gc_ms"] == 2.0 and merged["runs"] == 3
    with pytest.raises(SystemExit, match="steps"):
        merge_runs([base, {**base, "steps": 11}])


def test_a_pairs_ratio_range_is_shown_with_its_median():
    res = run_row("llama-3.1-8b:short", _args(1))
    res["vllm"] = {**res["jenga"], "us_step": 2 * res["jenga"]["us_step"]}
    res["ratios"] = [0.4, 0.5, 0.7]
    assert fmt(res)[6] == "0.50x (0.40-0.70)"
    res["ratios"] = [0.5]
    assert fmt(res)[6] == "0.50x"


def test_without_prefix_caching_nothing_hits_and_prefix_copies_are_waste():
    cached = run_row("llama-3.1-8b:short", _args(1))["jenga"]
    plain = run_row("llama-3.1-8b:short", _args(1, no_prefix_caching=True))["jenga"]
    assert cached["hit"] > 0 and plain["hit"] == 0 and plain["query"] == cached["query"]
    # every request holds its own copy of its shared prefix: held bytes grow, needed bytes do not
    assert plain["held"] / plain["steps"] > cached["held"] / cached["steps"]
