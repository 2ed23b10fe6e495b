"""LCM bound: exact plans for the hybrid catalog models, the error path, and invariants on random models."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jenga.core.pagesize import PADDABLE_KINDS, WIDE_PAD_FRAC, PagePlan, PageSizeError, fit_page_sizes
from jenga.core.specs import FullAttentionSpec, LayerGroup, MambaSpec, ModelSpec, SlidingWindowSpec
from jenga.structure import CATALOG_NAMES, model_spec_from_hf_config

KiB, MiB = 1 << 10, 1 << 20


def plan(name: str, **kw) -> PagePlan:
    return fit_page_sizes(model_spec_from_hf_config(name), **kw)


def test_nemotron_pad_collapses_large_page_to_one_mamba_page():
    p = plan("nemotron-h-8b")
    assert p.raw_lcm_page_bytes == 1581 * 2**18 == 414_449_664  # 395.25 MiB
    assert p.raw_ratio == 8.0
    mamba, full = p.model.group("mamba"), p.model.group("full")
    assert mamba.pad_bytes == 98_304 and mamba.layer_page_bytes == 2_158_592 + 4096
    assert mamba.page_bytes == 198 * 2**18 == p.large_page_bytes == 51_904_512  # 49.5 MiB
    assert full.pad_bytes == 0 and full.page_bytes == 256 * KiB and full.tokens_per_page == 16
    assert p.ratio == 1.0
    assert p.pages_per_large_page == {"mamba": 1, "full": 198}
    assert p.pad_bytes_per_large_page == 98_304
    assert p.pad_frac == pytest.approx(98_304 / 51_904_512)  # 0.19%
    assert p.model.hf_config == model_spec_from_hf_config("nemotron-h-8b").hf_config


def test_nemotron_without_padding_keeps_raw_or_fails():
    raw = plan("nemotron-h-8b", max_pad_frac=0)
    assert (raw.large_page_bytes, raw.ratio, raw.pad_frac) == (414_449_664, 8.0, 0.0)
    with pytest.raises(PageSizeError, match="max_ratio=4x"):
        plan("nemotron-h-8b", max_pad_frac=0, max_ratio=4)


def test_jamba_fits_raw():
    p = plan("jamba-1.5-mini")
    assert (p.large_page_bytes, p.ratio, p.pad_bytes_per_large_page) == (133 * 2**18, 4.0, 0)
    assert p.pages_per_large_page == {"mamba": 4, "full": 133}
    split = fit_page_sizes(model_spec_from_hf_config("jamba-1.5-mini", split_mamba_state=True))
    assert split.large_page_bytes == 21 * MiB and split.ratio == 3.0  # the paper's 84 / 16 / 3
    assert split.pages_per_large_page == {"mamba.conv": 16, "mamba.ssm": 3, "full": 84}


def test_qwen3_next():
    p = plan("qwen3-next-80b")
    assert (p.large_page_bytes, p.ratio, p.pad_frac) == (603 * 2**17, 2.0, 0.0)  # 75.375 MiB
    fp32 = fit_page_sizes(model_spec_from_hf_config("qwen3-next-80b", mamba_ssm_dtype="fp32"))
    assert fp32.raw_lcm_page_bytes == 1179 * 2**17  # 147.4 MiB
    assert fp32.model.group("mamba").pad_bytes == 36 * 16_384
    assert fp32.large_page_bytes == 198 * 393_216 and fp32.ratio == 1.0  # 74.25 MiB, pad 0.76%
    assert fp32.pad_frac == pytest.approx(589_824 / (198 * 393_216))


def test_falcon_h1_needs_the_pad():
    p = plan("falcon-h1-7b")
    assert p.raw_ratio == 16.0 and p.raw_lcm_page_bytes == 17127 * 2**16
    assert p.large_page_bytes == 98 * 720_896 == p.model.group("mamba").page_bytes
    assert p.model.group("mamba").pad_bytes == 495_616 and p.ratio == 1.0


def test_attention_only_models_unchanged():
    mini = plan("ministral-8b")
    assert (mini.large_page_bytes, mini.ratio, mini.pad_frac) == (1728 * KiB, 1.0, 0.0)
    assert mini.model == model_spec_from_hf_config("ministral-8b")
    mll = plan("llama-3.2-11b-vision")
    assert (mll.large_page_bytes, mll.pages_per_large_page) == (2 * MiB, {"full": 1, "cross": 4})
    g3 = fit_page_sizes(model_spec_from_hf_config("gemma-3-27b", vision=False))
    assert (g3.large_page_bytes, g3.ratio) == (65 * 2**19, 5.0)


def test_gemma3_27b_vision_page_breaks_the_bound():
    with pytest.raises(PageSizeError) as e:
        plan("gemma-3-27b")
    msg = str(e.value)
    assert "gemma-3-27b" in msg and "65x" in msg and "105x" in msg
    assert "'vision'" in msg and "max_pad_frac=0.25 would fit" in msg
    assert isinstance(e.value, ValueError)
    wide = plan("gemma-3-27b", max_pad_frac=0.25)
    assert wide.large_page_bytes == 65 * 2**19 and wide.model.group("vision").page_bytes == 13 * 2**14


def test_every_catalog_model_fits_or_explains():
    for name in CATALOG_NAMES:
        try:
            p = plan(name)
        except PageSizeError:
            assert name == "gemma-3-27b"
            continue
        assert p.ratio <= 8.0 and p.large_page_bytes <= p.raw_lcm_page_bytes


def test_scaling_tokens_per_page_when_padding_cannot_help():
    # 3 full layers (196,608 B pages) + one 4 MiB state: raw ratio 3.  max_ratio=2 forces attention pages up.
    full = LayerGroup("full", FullAttentionSpec("t", num_kv_heads=8, head_dim=128), (0, 1, 2))
    state = LayerGroup("mamba", MambaSpec("t", shapes=((1 << 21,),), dtypes=("bf16",)), (3,))
    m = ModelSpec("t", (full, state))
    assert fit_page_sizes(m, max_pad_frac=0).model == m  # fits as is: no scaling
    padded = fit_page_sizes(m)  # a 0.78% pad halves the large page instead
    assert padded.model.group("mamba").pad_bytes == 32_768 and padded.large_page_bytes == 43 * 196_608
    p = fit_page_sizes(m, max_ratio=2, max_pad_frac=0)
    assert p.model.group("full").tokens_per_page == 512  # least scaling meeting the bound
    assert p.large_page_bytes == 3 * 2**22 and p.ratio == 2.0
    p1 = fit_page_sizes(m, max_ratio=1, max_pad_frac=0)
    assert p1.model.group("full").tokens_per_page == 1024 and p1.ratio == 1.0
    with pytest.raises(PageSizeError):
        fit_page_sizes(m, max_ratio=1, max_pad_frac=0, max_tokens_per_page=512)


def test_bad_arguments():
    m = model_spec_from_hf_config("llama-3.1-8b")
    for kw in ({"max_ratio": 0.5}, {"max_pad_frac": -0.1}, {"max_pad_frac": 1.0}, {"align_bytes": 0}):
        with pytest.raises(ValueError):
            fit_page_sizes(m, **kw)


_attn = st.builds(lambda n, h, d, w: (n, h, d, w), st.integers(1, 40), st.sampled_from([1, 2, 4, 8]),
                  st.sampled_from([64, 128, 256]), st.sampled_from([None, 1024, 4096]))
_state = st.builds(lambda n, a, b, c: (n, a, b, c), st.integers(1, 40), st.integers(1, 9000),
                   st.integers(1, 4), st.integers(1, 300_000))


@settings(max_examples=60, deadline=None)
@given(st.lists(_attn, min_size=1, max_size=3), st.lists(_state, max_size=2),
       st.sampled_from([16, 32]), st.sampled_from([0.0, 0.01, 0.05]), st.sampled_from([8.0, 64.0, 1e9]))
def test_plan_invariants(attn, states, base, frac, max_ratio):
    groups, layer = [], 0
    for i, (n, h, d, w) in enumerate(attn):
        spec = (SlidingWindowSpec("r", num_kv_heads=h, head_dim=d, window=w) if w
                else FullAttentionSpec("r", num_kv_heads=h, head_dim=d))
        groups.append(LayerGroup(f"a{i}", spec, tuple(range(layer, layer + n)), base))
        layer += n
    for i, (n, a, b, c) in enumerate(states):
        spec = MambaSpec("r", shapes=((a, b), (c,)), dtypes=("bf16", "fp32"))
        groups.append(LayerGroup(f"m{i}", spec, tuple(range(layer, layer + n)), base))
        layer += n
    model = ModelSpec("r", tuple(groups))
    try:
        p = fit_page_sizes(model, max_pad_frac=frac, max_ratio=max_ratio)
    except PageSizeError as e:
        assert f"max_ratio={max_ratio:g}x" in str(e)
        return
    S = p.large_page_bytes
    assert S == p.model.large_page_bytes <= p.raw_lcm_page_bytes
    assert p.ratio == S / p.model.max_small_page_bytes <= max_ratio
    for old, new in zip(model.groups, p.model.groups, strict=True):
        assert (new.name, new.spec, new.layers) == (old.name, old.spec, old.layers)
        assert S % new.page_bytes == 0
        mult = new.tokens_per_page // base
        assert new.tokens_per_page % base == 0 and mult & (mult - 1) == 0
        assert new.tokens_per_page == base or new.tokens_per_page <= 1024
        assert new.pad_bytes % (16 * new.num_layers) == 0
        assert new.pad_bytes <= frac * new.useful_page_bytes
        assert new.page_bytes == new.useful_page_bytes + new.pad_bytes
        if new.pad_bytes:
            assert new.kind in PADDABLE_KINDS
            assert new.layer_page_bytes % 16 == old.layer_page_bytes % 16
    assert p.pad_bytes_per_large_page == max(S // g.page_bytes * g.pad_bytes for g in p.model.groups)
    assert math.isclose(p.pad_frac, p.pad_bytes_per_large_page / S)


@pytest.mark.parametrize("tokens_per_page", [16, 32, 64, 128])
def test_every_catalog_model_works_at_every_page_size(tokens_per_page):
    """What a user may pick: each catalog model gets a manager, within the 8x bound, by the widened search
    where the default levers fail (Jamba-1.5-Mini at 64 and 128, Qwen3-Next at 128)."""
    from jenga.core.manager.manager import KVCacheManager

    for name in CATALOG_NAMES:
        model = model_spec_from_hf_config(name, tokens_per_page=tokens_per_page)
        mgr = KVCacheManager(model, 8 << 30, tokens_per_page=tokens_per_page)
        fitted, S = mgr.page_plan.model, mgr.page_plan.large_page_bytes
        assert S <= 8 * fitted.max_small_page_bytes, name
        for g in fitted.groups:
            assert S % g.page_bytes == 0 and g.tokens_per_page % tokens_per_page == 0, (name, g)
            limit = 0.25 if g.kind == "vision" else WIDE_PAD_FRAC
            assert g.pad_bytes <= limit * g.useful_page_bytes, (name, g)


def test_jamba_at_64_tokens_widens_the_state_pad():
    m = model_spec_from_hf_config("jamba-1.5-mini", tokens_per_page=64)
    with pytest.raises(PageSizeError):  # default levers: raw ratio 16, a 1% pad cannot remove the factor 7 * 19
        fit_page_sizes(m)
    p = fit_page_sizes(m, widen=True)
    mamba = p.model.group("mamba")
    assert mamba.useful_page_bytes == 133 * 2**16 and mamba.pad_bytes == 458_752  # 5.26%: 28 layers x 16 KiB
    assert mamba.page_bytes == 140 * 2**16 and p.large_page_bytes == 4 * mamba.page_bytes == 35 * MiB
    assert p.ratio == 4.0 and p.model.group("full").tokens_per_page == 64


def test_non_power_of_two_token_pages_when_pads_are_forbidden():
    # 3 full layers of 4 KiB per token at 16 tokens (192 KiB pages) + a 5 * 2^16 B state; no pad allowed
    full = LayerGroup("full", FullAttentionSpec("t", num_kv_heads=8, head_dim=128), (0, 1, 2))
    state = LayerGroup("mamba", MambaSpec("t", shapes=((5 * 2**15,),), dtypes=("bf16",)), (3,))
    m = ModelSpec("t", (full, state))
    with pytest.raises(PageSizeError):  # lcm(3 * 2^16, 5 * 2^16) = 15 * 2^16: ratio 5 > 2
        fit_page_sizes(m, max_ratio=2, max_pad_frac=0)
    p = fit_page_sizes(m, max_ratio=2, max_pad_frac=0, widen=True)
    assert p.model.group("full").tokens_per_page == 80  # 5 x 16: full pages of 15 * 2^16 = the large page
    assert p.large_page_bytes == 15 * 2**16 and p.ratio == 1.0 and p.pad_bytes_per_large_page == 0


def test_refusal_names_the_page_sizes_that_would_fit():
    # at 64 tokens: lcm(2^18, 5 * 2^14) = 5 * 2^18, ratio 5 > 4; at 16 tokens: 5 * 2^16 / 81,920 = 4
    full = LayerGroup("full", FullAttentionSpec("t", num_kv_heads=8, head_dim=128), (0,), 64)
    state = LayerGroup("mamba", MambaSpec("t", shapes=((5 * 2**13,),), dtypes=("bf16",)), (1,), 64)
    m = ModelSpec("t", (full, state))
    with pytest.raises(PageSizeError, match="tokens_per_page 16 would fit") as e:
        fit_page_sizes(m, max_ratio=4, max_pad_frac=0, max_tokens_per_page=64, widen=True)
    assert "Widened too" in str(e.value)
