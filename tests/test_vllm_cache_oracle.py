"""The cache-correctness oracle inside vLLM 0.32 (``tests/vllm_cache_oracle.py``): jenga's scheduler
with prefix caching on gives the greedy tokens it gives with caching off, for every family and
feature the integration supports (text families, salts, LoRA, speculative decoding, the host tier),
over a seeded trace whose caching-on run hits, preempts and evicts.

Each case starts two engines (a minute or more of CPU): one small case runs in ``make test``, the
rest under ``-m slow`` and in ``benchmarks/cache_oracle.py``.
"""

from __future__ import annotations

import pytest
from vllm_cache_oracle import FAMILIES, check

FAST = ("llama", "plain")
CASES = [(f, x) for f, (_, _, feats) in FAMILIES.items() for x in feats]


@pytest.mark.xdist_group("vllm-cache-oracle")
def test_caching_on_equals_off_inside_vllm(tmp_path_factory):
    res = check(*FAST, seed=0, root=tmp_path_factory.getbasetemp())
    assert res.equal == res.total


@pytest.mark.slow
@pytest.mark.parametrize("family,feature", [pytest.param(f, x, marks=pytest.mark.xdist_group(f"vllm-oracle-{f}"))
                                            for f, x in CASES if (f, x) != FAST])
def test_every_family_and_feature_inside_vllm(family, feature, tmp_path_factory):
    check(family, feature, seed=0, root=tmp_path_factory.getbasetemp())
