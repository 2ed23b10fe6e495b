"""Families outside the catalog, from configs written here from their public config.json facts.

For each: ``jenga plan --json`` on a local directory gives the right layer count per kind, and the longest
request is within 3 % of a hand calculation: (KV memory - what a request keeps whatever its length)
/ (bytes every token adds), with the per-token and per-layer bytes written out from the fields below.
"""

from __future__ import annotations

import json

import pytest

from jenga.cli import main

GiB = 1 << 30
BF16 = 2

QWEN2_7B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=3584, intermediate_size=18944,
                num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
                vocab_size=152064, use_sliding_window=True, sliding_window=4096, max_window_layers=21)
STARCODER2_15B = dict(model_type="starcoder2", architectures=["Starcoder2ForCausalLM"], hidden_size=6144,
                      intermediate_size=24576, num_hidden_layers=40, num_attention_heads=48, num_key_value_heads=4,
                      max_position_embeddings=16384, sliding_window=4096, vocab_size=49152)
FALCON_MAMBA_7B = dict(model_type="falcon_mamba", architectures=["FalconMambaForCausalLM"], hidden_size=4096,
                       num_hidden_layers=64, state_size=16, expand=2, conv_kernel=4, vocab_size=65024)
MAMBA2_2_7B = dict(model_type="mamba2", architectures=["Mamba2ForCausalLM"], hidden_size=2560, num_hidden_layers=64,
                   num_heads=80, head_dim=64, n_groups=1, state_size=128, expand=2, conv_kernel=4, vocab_size=50288)
LFM2_1_2B = dict(model_type="lfm2", architectures=["Lfm2ForCausalLM"], hidden_size=2048, intermediate_size=12288,
                 num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, conv_L_cache=3,
                 full_attn_idxs=[2, 5, 8, 10, 12, 14], max_position_embeddings=128000, vocab_size=65536)
RECURRENT_GEMMA_2B = dict(model_type="recurrent_gemma", architectures=["RecurrentGemmaForCausalLM"],
                          hidden_size=2560, intermediate_size=15360, num_hidden_layers=26, num_attention_heads=10,
                          num_key_value_heads=1, head_dim=256, lru_width=2560, attention_window_size=2048,
                          conv1d_width=4, block_types=["recurrent", "recurrent", "attention"], vocab_size=256000)
DEEPSEEK_V3 = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
                   intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
                   num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
                   qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=256, n_shared_experts=1,
                   num_experts_per_tok=8, first_k_dense_replace=3, max_position_embeddings=163840, vocab_size=129280)
KIMI_LINEAR_48B = dict(model_type="kimi_linear", architectures=["KimiLinearForCausalLM"], hidden_size=2304,
                       intermediate_size=9216, moe_intermediate_size=1024, num_hidden_layers=27,
                       num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512, qk_rope_head_dim=64,
                       qk_nope_head_dim=128, v_head_dim=128, num_experts=256, num_experts_per_token=8,
                       model_max_length=1048576, vocab_size=163840,
                       linear_attn_config={"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
                                           "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
                                           "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4})


def plan(tmp_path, capsys, cfg: dict, *args: str) -> dict:
    d = tmp_path / cfg["model_type"]
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    assert main(["plan", "--model", str(d), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def layer_counts(d: dict) -> dict[str, int]:
    return {g["kind"]: g["layers"] for g in d["groups"]}


def close(got: int, hand: float) -> bool:
    return abs(got - hand) / hand < 0.03


def test_qwen2_sliding_above_max_window_layers(tmp_path, capsys):
    d = plan(tmp_path, capsys, QWEN2_7B)
    assert layer_counts(d) == {"full": 21, "sliding": 7}  # layers >= max_window_layers slide
    assert [g["layer_ids"] for g in d["groups"] if g["kind"] == "sliding"] == [list(range(21, 28))]
    per_layer = 2 * 4 * 128 * BF16  # K and V, 4 KV heads of 3584 / 28
    hand = (64 * GiB - 7 * 4096 * per_layer) / (21 * per_layer)
    assert close(d["max_context_tokens"]["jenga"], hand)
    assert close(d["max_context_tokens"]["paged"], 64 * GiB / (28 * per_layer))


def test_starcoder2_sliding_everywhere(tmp_path, capsys):
    d = plan(tmp_path, capsys, STARCODER2_15B)
    assert layer_counts(d) == {"sliding": 40}
    assert d["max_context_tokens"]["jenga"] is None  # only a 4096-token window per layer: unbounded
    assert close(d["max_context_tokens"]["paged"], 64 * GiB / (40 * 2 * 4 * 128 * BF16))


@pytest.mark.parametrize("cfg, state_elems", [
    (FALCON_MAMBA_7B, 8192 * 3 + 8192 * 16),  # Mamba-1: d_inner = 2 * 4096; conv d_inner x 3, SSM d_inner x 16
    (MAMBA2_2_7B, (5120 + 2 * 128) * 3 + 80 * 64 * 128),  # Mamba-2: conv (80*64 + 2*1*128) x 3, SSM 80x64x128
], ids=["falcon_mamba", "mamba2"])
def test_pure_state_models(tmp_path, capsys, cfg, state_elems):
    d = plan(tmp_path, capsys, cfg, "--managers", "jenga")
    assert layer_counts(d) == {"mamba": 64}
    (group,) = d["groups"]
    assert group["page_bytes"] - group["pad_bytes"] == 64 * state_elems * BF16
    assert d["max_context_tokens"]["jenga"] is None  # a fixed state per request, whatever its length


def test_lfm2_short_convolutions_and_attention(tmp_path, capsys):
    d = plan(tmp_path, capsys, LFM2_1_2B)
    assert layer_counts(d) == {"mamba": 10, "full": 6}
    conv = next(g for g in d["groups"] if g["kind"] == "mamba")
    assert conv["page_bytes"] - conv["pad_bytes"] == 10 * 2048 * (3 - 1) * BF16  # hidden x (L_cache - 1)
    per_layer = 2 * 8 * 64 * BF16
    hand = (64 * GiB - conv["page_bytes"]) / (6 * per_layer)
    assert close(d["max_context_tokens"]["jenga"], hand)


def test_recurrent_gemma_rg_lru_and_local_attention(tmp_path, capsys):
    d = plan(tmp_path, capsys, RECURRENT_GEMMA_2B)
    assert layer_counts(d) == {"mamba": 18, "sliding": 8}  # block pattern recurrent, recurrent, attention
    assert [g["layer_ids"] for g in d["groups"] if g["kind"] == "sliding"] == [list(range(2, 26, 3))]
    state = next(g for g in d["groups"] if g["kind"] == "mamba")
    assert state["page_bytes"] - state["pad_bytes"] == 18 * (2560 * 3 + 2560) * BF16  # conv + RG-LRU state
    assert d["max_context_tokens"]["jenga"] is None  # local attention (2048 window) + fixed states


def test_deepseek_v3_mla_latent(tmp_path, capsys):
    d = plan(tmp_path, capsys, DEEPSEEK_V3)
    assert layer_counts(d) == {"full": 61}
    per_token = 61 * (512 + 64) * BF16  # one kv_lora_rank + qk_rope_head_dim latent per layer
    assert d["groups"][0]["page_bytes"] == 16 * per_token
    assert close(d["max_context_tokens"]["jenga"], 64 * GiB / per_token)
    assert close(d["max_context_tokens"]["paged"], 64 * GiB / per_token)  # one kind: paged is the same


def test_kimi_linear_delta_attention_and_mla(tmp_path, capsys):
    d = plan(tmp_path, capsys, KIMI_LINEAR_48B)
    assert layer_counts(d) == {"mamba": 20, "full": 7}
    state = next(g for g in d["groups"] if g["kind"] == "mamba")
    # KDA: fused q/k/v conv (3 * 32 * 128) x 3 and a 128 x 128 state per head
    assert state["page_bytes"] - state["pad_bytes"] == 20 * (3 * 32 * 128 * 3 + 32 * 128 * 128) * BF16
    per_token = 7 * (512 + 64) * BF16
    hand = (64 * GiB - state["page_bytes"]) / per_token
    assert close(d["max_context_tokens"]["jenga"], hand)
