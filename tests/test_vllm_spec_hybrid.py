"""MTP on a Mamba hybrid inside vLLM (tiny Qwen3-Next, 3 Gated DeltaNet : 1 attention, one MTP
layer): refused at engine start, by name, and why there is no stock reference to verify it
against.  A module of its own: an engine alive in this process (``test_vllm_spec_decode.py``'s
fixture holds its engines until its module ends) would leave vLLM's parallel groups built for a
dense model, without the expert-parallel group Qwen3-Next's MoE layers ask for."""

from __future__ import annotations

import pytest
from vllm_support import (
    allow_engines_after_numba,
    close,
    engine,
    greedy,
    qwen3_next_mtp_dir,
    spec_stats,
    workloads,
)

K = 3


@pytest.mark.slow
@pytest.mark.xdist_group("vllm-spec-hybrid-mtp")
def test_mtp_on_a_hybrid_is_refused_and_why(tmp_path_factory):
    """Stock vLLM runs MTP on the tiny Qwen3-Next with prefix caching off; jenga refuses vLLM's
    speculative state blocks at engine start, by name; with prefix caching on, stock vLLM 0.32's CPU
    build itself fails at its first step (the align-mode state pre-copy is a Triton kernel), so there
    is no reference to verify jenga against."""
    from jenga.vllm.specs import UnsupportedInVllm

    allow_engines_after_numba()
    path = qwen3_next_mtp_dir(tmp_path_factory.getbasetemp())
    prompts = workloads()["first"]
    kw = dict(dtype="bfloat16", mamba_ssm_cache_dtype="bfloat16", disable_log_stats=False,
              speculative_config={"method": "mtp", "num_speculative_tokens": K})
    stock = engine(path, jenga=False, enable_prefix_caching=False, **kw)
    try:
        greedy(stock, prompts, max_tokens=4)
        assert spec_stats(stock)["draft_tokens"] > 0
    finally:
        close(stock)
    with pytest.raises(UnsupportedInVllm, match=r"speculative Mamba blocks .* 1 \+ 3 state blocks"):
        engine(path, jenga=True, enable_prefix_caching=False, **kw)
    stock = engine(path, jenga=False, **kw)
    try:
        with pytest.raises(TypeError, match="not subscriptable"):
            greedy(stock, prompts, max_tokens=4)
    finally:
        close(stock)
