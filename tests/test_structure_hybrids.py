"""Tiny configs of hybrid and multimodal families, planned through transformers (no family list).

Each expected shape is written by hand from the config's public fields (the formulas in the comments), so a
test fails when the structure read from transformers' cache layers and meta-device modules disagrees.
"""

from __future__ import annotations

import pytest

from jenga.core.specs import (
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)
from jenga.structure import model_spec_from_hf_config


def groups(cfg: dict, **kw) -> dict[str, tuple]:
    """group name -> (kind, layers, (kv heads, head dim) or state shapes)."""
    m = model_spec_from_hf_config(cfg, name="tiny", **kw)
    out = {}
    for g in m.groups:
        s = g.spec
        detail = s.shapes if isinstance(s, MambaSpec) else (s.hidden_size if isinstance(s, VisionEmbeddingSpec)
                                                            else (s.num_kv_heads, s.head_dim))
        out[g.name] = (g.kind, g.layers, detail)
    return out


ATTN = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            vocab_size=128, intermediate_size=128)


def test_jamba_mamba1_and_attention():
    cfg = dict(model_type="jamba", num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
               expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_d_conv=4,
               mamba_expand=2, **ATTN)
    # d_inner = 2 * 64: conv (128, 4 - 1), SSM (128, 8); attention head_dim 64 / 4
    assert groups(cfg) == {"mamba": ("mamba", (0, 2), ((128, 3), (128, 8))), "full": ("full", (1, 3), (2, 16))}


def test_bamba_mamba2():
    cfg = dict(model_type="bamba", num_hidden_layers=4, attn_layer_indices=[2], mamba_n_heads=8, mamba_d_head=16,
               mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, **ATTN)
    # conv (8 * 16 + 2 * 2 * 16, 3), SSM (8, 16, 16)
    assert groups(cfg) == {"mamba": ("mamba", (0, 1, 3), ((192, 3), (8, 16, 16))), "full": ("full", (2,), (2, 16))}


def test_granite_moe_hybrid_mamba2():
    cfg = dict(model_type="granitemoehybrid", num_hidden_layers=4, mamba_n_heads=4, mamba_d_head=32,
               mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, num_local_experts=2,
               num_experts_per_tok=1, layer_types=["mamba", "attention", "mamba", "mamba"], **ATTN)
    # conv (4 * 32 + 2 * 1 * 8, 3), SSM (4, 32, 8)
    assert groups(cfg) == {"mamba": ("mamba", (0, 2, 3), ((144, 3), (4, 32, 8))), "full": ("full", (1,), (2, 16))}


def test_nemotron_h_pattern_with_mlp_and_moe_layers():
    cfg = dict(model_type="nemotron_h", hybrid_override_pattern="M-*E", mamba_num_heads=8, mamba_head_dim=8,
               n_groups=2, ssm_state_size=16, conv_kernel=4, head_dim=16, n_routed_experts=2,
               num_experts_per_tok=1, moe_intermediate_size=32, **ATTN)
    # M: conv (8 * 8 + 2 * 2 * 16, 3), SSM (8, 8, 16); "-" (MLP) and "E" (MoE) layers keep nothing
    assert groups({**cfg, "num_hidden_layers": 4}) == {"mamba": ("mamba", (0,), ((128, 3), (8, 8, 16))),
                                                       "full": ("full", (2,), (2, 16))}


def test_falcon_h1_attention_and_mamba2_in_every_layer():
    cfg = dict(model_type="falcon_h1", num_hidden_layers=3, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4,
               mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, **ATTN)
    # conv (4 * 16 + 2 * 1 * 8, 3), SSM (4, 16, 8), in the same layers as the attention
    assert groups(cfg) == {"full": ("full", (0, 1, 2), (2, 16)), "mamba": ("mamba", (0, 1, 2), ((80, 3), (4, 16, 8)))}
    split = groups(cfg, split_mamba_state=True)
    assert split["mamba.conv"][2] == ((80, 3),) and split["mamba.ssm"][2] == ((4, 16, 8),)


def test_qwen3_next_gated_deltanet():
    cfg = dict(model_type="qwen3_next", num_hidden_layers=4, head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
               num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
               layer_types=["linear_attention"] * 3 + ["full_attention"], **ATTN)
    # conv (2 * 2 * 16 + 4 * 8, 3), SSM (4, 16, 8)
    assert groups(cfg) == {"mamba": ("mamba", (0, 1, 2), ((96, 3), (4, 16, 8))), "full": ("full", (3,), (2, 16))}
    assert groups(cfg, tp=2)["mamba"][2] == ((48, 3), (2, 16, 8))


def test_gemma3_conditional_generation_gets_vision_embeddings():
    cfg = dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
               text_config=dict(model_type="gemma3_text", num_hidden_layers=6, head_dim=32, sliding_window=128,
                                **ATTN),
               vision_config=dict(model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64, image_size=28, patch_size=14))
    g = groups(cfg)
    assert g == {"sliding": ("sliding", (0, 1, 2, 3, 4), (2, 32)), "full": ("full", (5,), (2, 32)),
                 "vision": ("vision", (6,), 64)}
    m = model_spec_from_hf_config(cfg)
    assert m.group("sliding").spec == SlidingWindowSpec("gemma3", num_kv_heads=2, head_dim=32, window=128)
    assert "vision" not in groups(cfg, vision=False)


def test_mllama_cross_attention_layers():
    cfg = dict(model_type="mllama", architectures=["MllamaForConditionalGeneration"],
               text_config=dict(model_type="mllama_text_model", num_hidden_layers=5, cross_attention_layers=[1, 3],
                                **ATTN),
               vision_config=dict(model_type="mllama_vision_model", hidden_size=32, num_hidden_layers=1,
                                  num_global_layers=1, attention_heads=2, intermediate_size=64, image_size=28,
                                  patch_size=14, vision_output_dim=64))
    assert groups(cfg) == {"full": ("full", (0, 2, 4), (2, 16)), "cross": ("cross", (1, 3), (2, 16))}
    m = model_spec_from_hf_config(cfg)
    assert isinstance(m.group("cross").spec, CrossAttentionSpec) and isinstance(m.group("full").spec, FullAttentionSpec)


def test_state_layer_without_a_mixer_is_named():
    from transformers import AutoConfig

    from jenga.structure.probe import probe_states
    from jenga.structure.source import UnsupportedModelError

    tc = AutoConfig.for_model("llama", num_hidden_layers=2, **ATTN)
    with pytest.raises(UnsupportedModelError, match="layer 1: state layer without a recognisable mixer"):
        probe_states(tc, [1], "toy")


def test_inkling_per_layer_kv_heads_come_from_the_built_modules():
    """Inkling's sliding layers use ``swa_num_key_value_heads`` (a field the generic reader does not know);
    since the model is built for its short-convolution states, the attention modules' own sizes are used."""
    cfg = dict(model_type="inkling_text", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
               num_key_value_heads=1, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2,
               swa_head_dim=16, sliding_window_size=32, rel_extent=32, local_layer_ids=[0], conv_kernel_size=4,
               intermediate_size=128, moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1,
               n_shared_experts=1, vocab_size=128, max_position_embeddings=4096)
    g = groups(cfg)
    assert g["sliding"][:2] == ("sliding", (0,)) and g["sliding"][2] == (2, 16)
    assert g["full"][:2] == ("full", (1,)) and g["full"][2] == (1, 16)
    # states: the depthwise K, V and residual short convs of each layer, (channels, kernel - 1)
    states = {name: v for name, v in g.items() if v[0] == "mamba"}
    assert sorted(v[2] for v in states.values()) == [((16 + 16 + 64 + 64, 3),), ((2 * 16 + 2 * 16 + 64 + 64, 3),)]
