"""The cache-correctness oracle inside vLLM 0.32 (``tests/vllm_cache_oracle.py``): jenga's scheduler
with prefix caching on gives the greedy tokens it gives with caching off, for every family and
feature the integration supports (text and state families, salts, LoRA, speculative decoding, the
host tier, images on the two VLMs), over a seeded trace whose caching-on run hits, preempts and
evicts at a budget tuned per case.

Each case starts two engines (a minute or more of CPU): one small case runs in ``make test``, the
rest under ``-m slow`` and in ``benchmarks/cache_oracle.py``.
"""

from __future__ import annotations

import pytest
from vllm_cache_oracle import ADAPTERS, FAMILIES, _feature_kw, check

FAST = ("llama", "plain")
FAST_TRACE = dict(doc_len=(64, 128), max_tokens=(16, 32))  # shorter answers: it preempts at 16 blocks, one budget
CASES = [(f, x) for f, (_, _, feats) in FAMILIES.items() for x in feats]


@pytest.mark.xdist_group("vllm-cache-oracle")
def test_caching_on_equals_off_inside_vllm(tmp_path_factory):
    res = check(*FAST, seed=0, root=tmp_path_factory.getbasetemp(), **FAST_TRACE)
    assert res.equal == res.total


@pytest.mark.slow
@pytest.mark.parametrize("family,feature", [pytest.param(f, x, marks=pytest.mark.xdist_group(f"vllm-oracle-{f}"))
                                            for f, x in CASES if (f, x) != FAST])
def test_every_family_and_feature_inside_vllm(family, feature, tmp_path_factory):
    check(family, feature, seed=0, root=tmp_path_factory.getbasetemp())


def test_lora_leaves_the_last_slot_free():
    """While vLLM's CPU LoRA ops give base-model tokens (slot ``-1``) the last slot's adapter, the
    oracle leaves that slot free (module doc of ``vllm_cache_oracle``), or stock vLLM's own tokens
    would change with the batches caching makes."""
    import torch
    from vllm.lora.ops.torch_ops.lora_ops import bgmv_shrink

    w, x, out = torch.ones(2, 1, 4, 8), torch.ones(2, 8), torch.zeros(2, 4)
    w[0] = 0  # slot 0 empty, slot 1 loaded; token 0 under the adapter of slot 0, token 1 base model
    bgmv_shrink(x, w, out, torch.tensor([0, -1]))
    if out[1].any():
        assert _feature_kw("llama", "lora", None, "", 0)["max_loras"] > len(ADAPTERS)
