"""``JENGA_VLLM_STEP_CHECKPOINTS=value`` (``jenga.vllm.specs``): an align-mode state keeps the
state a prefill step ends on from the token where it saves more recompute than its page holds
bytes: the tokens whose K/V take one state page."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vLLM tests need the jenga[vllm] extra")

from jenga.core import specs as js  # noqa: E402
from jenga.vllm.specs import STEP_CHECKPOINTS_ENV, UnsupportedInVllm, _with_step_ends, step_end_from  # noqa: E402


def jamba_like() -> list[js.LayerGroup]:
    """Jamba-1.5-Mini's groups: 28 Mamba layers (conv 8192 x 3, SSM 8192 x 16, bf16: 311,296 B
    a layer) and 4 full-attention layers (8 KV heads of 128, bf16: 4,096 B a token a layer)."""
    state = js.CopyForwardMambaSpec("jamba", shapes=((8192, 3), (8192, 16)), dtypes=("bf16", "bf16"))
    attn = js.FullAttentionSpec("jamba", num_kv_heads=8, head_dim=128)
    return [js.LayerGroup("m", state, tuple(range(28)), 80), js.LayerGroup("a", attn, tuple(range(28, 32)), 80)]


def test_step_end_from_is_the_tokens_one_state_page_holds():
    assert step_end_from(jamba_like()) == -(-28 * 311_296 // (4 * 4_096)) == 532
    assert step_end_from(jamba_like()[1:]) == 0  # no state group


def test_env_switches_the_step_end_checkpoints(monkeypatch):
    monkeypatch.setenv(STEP_CHECKPOINTS_ENV, "off")
    assert _with_step_ends(jamba_like())[0].spec.step_end_from == 0
    monkeypatch.delenv(STEP_CHECKPOINTS_ENV)  # the default: value
    out = _with_step_ends(jamba_like())
    assert out[0].spec.step_end_from == 532 and out[1] == jamba_like()[1]
    monkeypatch.setenv(STEP_CHECKPOINTS_ENV, "dense")
    with pytest.raises(UnsupportedInVllm, match=STEP_CHECKPOINTS_ENV):
        _with_step_ends(jamba_like())
