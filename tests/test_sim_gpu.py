"""GPU specs, model size estimates, memory budget and the roofline cost model."""

import dataclasses

import pytest

from jenga.core.specs import ModelSpec
from jenga.sim.gpu import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    GH200_144GB,
    GPUS,
    H100_80GB,
    H200_141GB,
    L4_24GB,
    CostModel,
    GPUSpec,
    ModelDoesNotFitError,
    UnknownGPUError,
    get_gpu,
    memory_budget,
)
from jenga.sim.model_cost import ModelCost
from jenga.structure import CATALOG_NAMES

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=128256,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, vocab_size=128256,
                 num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False)
JAMBA_MINI = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=65536,
                  num_attention_heads=32, num_key_value_heads=8, attn_layer_period=8, attn_layer_offset=4,
                  expert_layer_period=2, expert_layer_offset=1, num_experts=16, num_experts_per_tok=2,
                  mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=256)
SCOUT = dict(model_type="llama4", text_config=dict(
    model_type="llama4_text", hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
    num_hidden_layers=48, vocab_size=202048, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
    num_local_experts=16, num_experts_per_tok=1, interleave_moe_layer_step=1),
    vision_config=dict(hidden_size=1408, num_hidden_layers=34, intermediate_size=5632))
NEMOTRON_H_8B = dict(hidden_size=4096, intermediate_size=21504, num_hidden_layers=52, vocab_size=131072,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, mlp_hidden_act="relu2",
                     hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
                     mamba_num_heads=128, mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4)
GPT_OSS_20B = dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, vocab_size=201088,
                   num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                   experts_per_token=4, layer_types=["sliding_attention", "full_attention"] * 12)


def llama8(dtype="bf16"):
    return ModelCost.from_hf_config(LLAMA_8B, name="llama-3.1-8b", dtype=dtype)


# ----------------------------------------------------------------------------------------- GPUs

def test_gpu_names_and_lookup():
    assert set(GPUS) == {"h100-80gb", "l4-24gb", "h200-141gb", "gh200-144gb"}
    assert get_gpu("H100-80GB") is H100_80GB
    with pytest.raises(UnknownGPUError) as e:
        get_gpu("a100")
    assert "a100" in str(e.value) and "h100-80gb" in str(e.value) and "l4-24gb" in str(e.value)
    assert isinstance(e.value, KeyError)


def test_datasheet_constants():
    assert H100_80GB.hbm_bytes_per_s == 3.35e12 and L4_24GB.hbm_bytes_per_s == 300e9
    assert H200_141GB.hbm_bytes_per_s == 4.8e12
    assert H100_80GB.peak_flops_bf16 == pytest.approx(989e12, rel=0.01)
    assert L4_24GB.peak_flops_bf16 == pytest.approx(121e12, rel=0.01)
    assert H200_141GB.peak_flops_bf16 == H100_80GB.peak_flops_bf16
    assert 80e9 <= H100_80GB.memory_bytes < 90e9
    assert 24e9 <= L4_24GB.memory_bytes < 26e9
    assert 141e9 <= H200_141GB.memory_bytes < 155e9
    for g in GPUS.values():
        assert g.peak_flops("fp8") == pytest.approx(2 * g.peak_flops_bf16, rel=0.01)
        assert g.source
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100_80GB.memory_bytes = 1  # type: ignore[misc]


# --------------------------------------------------------------------------------- model sizes

def test_llama_param_counts():
    m8 = llama8()
    assert m8.params_total == pytest.approx(8.03e9, rel=0.05)
    assert m8.params_active == m8.params_total
    assert m8.num_layers == m8.num_attention_layers == 32
    m70 = ModelCost.from_hf_config(LLAMA_70B)
    assert m70.params_total == pytest.approx(70.6e9, rel=0.05)
    assert m70.head_dim == 128  # derived from hidden / heads
    assert m8.weight_bytes == 2 * m8.params_total
    assert llama8("fp8").weight_bytes == m8.params_total


def test_moe_hybrid_and_multimodal_estimates():
    jamba = ModelCost.from_hf_config(JAMBA_MINI)
    assert jamba.params_total == pytest.approx(52e9, rel=0.05)
    assert jamba.params_active == pytest.approx(12e9, rel=0.08)
    assert (jamba.num_layers, jamba.num_attention_layers) == (32, 4)
    scout = ModelCost.from_hf_config(SCOUT)
    assert scout.params_total == pytest.approx(109e9, rel=0.05)
    assert scout.params_active == pytest.approx(17e9, rel=0.08)
    assert scout.vision_params > 0
    nemo = ModelCost.from_hf_config(NEMOTRON_H_8B)
    assert nemo.params_total == pytest.approx(8.1e9, rel=0.05)
    assert (nemo.num_layers, nemo.num_attention_layers) == (52, 4)
    oss = ModelCost.from_hf_config(GPT_OSS_20B, dtype="mxfp4")
    assert oss.params_total == pytest.approx(21e9, rel=0.05)
    assert oss.params_active == pytest.approx(3.6e9, rel=0.2)


def test_tied_embeddings_counted_once():
    tied = ModelCost.from_hf_config(dict(LLAMA_8B, tie_word_embeddings=True))
    assert llama8().params_total - tied.params_total == 128256 * 4096


def test_missing_fields_are_recorded_or_rejected():
    assert llama8().assumed == ()
    trimmed = {k: v for k, v in LLAMA_8B.items() if k not in ("intermediate_size", "tie_word_embeddings")}
    m = ModelCost.from_hf_config(trimmed)
    assert set(m.assumed) == {"intermediate_size", "tie_word_embeddings"}
    assert m.params_total == pytest.approx(8.03e9, rel=0.05)  # 3.5 x hidden fallback
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelCost.from_hf_config(trimmed, strict=True)
    qwen = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=4, vocab_size=1000, num_experts=8,
                num_attention_heads=16,
                num_experts_per_tok=2, intermediate_size=6144, tie_word_embeddings=False)
    assert ModelCost.from_hf_config(qwen).assumed == ("moe_intermediate_size",)


#: Published total parameter counts (billions, model cards / safetensors metadata), vision towers included.
PUBLISHED_PARAMS_B = {
    "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.6, "llama-3.2-1b": 1.24, "mistral-7b": 7.24, "ministral-8b": 8.02,
    "gemma-2-9b": 9.24, "gemma-2-27b": 27.2, "gemma-3-4b": 4.3, "gemma-3-12b": 12.2, "gemma-3-27b": 27.4,
    "gpt-oss-20b": 21.0, "gpt-oss-120b": 117.0, "llama-4-scout": 109.0, "llama-3.2-11b-vision": 10.6,
    "llama-3.2-90b-vision": 88.6, "jamba-1.5-mini": 52.0, "nemotron-h-8b": 8.1, "falcon-h1-7b": 7.6,
    "qwen3-next-80b": 80.0,
}


def test_published_table_covers_catalog():
    assert set(PUBLISHED_PARAMS_B) == set(CATALOG_NAMES)


@pytest.mark.parametrize("name", sorted(CATALOG_NAMES))
def test_catalog_configs_are_complete_and_sized(name):
    """Every catalog config carries the size fields ``ModelCost`` needs (no fallbacks) and lands
    within 15% of the published parameter count."""
    m = ModelCost.from_hf_config(ModelSpec.from_hf_config(name).hf_config, name=name, strict=True)
    assert m.assumed == ()
    assert m.params_total == pytest.approx(PUBLISHED_PARAMS_B[name] * 1e9, rel=0.15)
    assert m.params_active <= m.params_total


def test_config_errors():
    with pytest.raises(ValueError, match="hidden_size"):
        ModelCost.from_hf_config({"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="dtype"):
        ModelCost.from_hf_config(LLAMA_8B, dtype="fp7")
    with pytest.raises(ValueError, match="layer character"):
        ModelCost.from_hf_config(dict(NEMOTRON_H_8B, hybrid_override_pattern="M*X"))


def test_moe_weight_reads_grow_with_tokens():
    jamba = ModelCost.from_hf_config(JAMBA_MINI)
    one, many = jamba.weight_bytes_read(1), jamba.weight_bytes_read(4096)
    assert one < many <= jamba.weight_bytes
    assert many == pytest.approx(jamba.weight_bytes, rel=1e-6)
    assert llama8().weight_bytes_read(1) == llama8().weight_bytes


# ------------------------------------------------------------------------------ memory budget

def test_memory_budget_formula():
    w = llama8().weight_bytes
    b = memory_budget(H100_80GB, w)
    assert b == int(H100_80GB.memory_bytes * 0.9) - w - DEFAULT_ACTIVATION_RESERVE_BYTES
    b4 = memory_budget(H100_80GB, w, tp=4, utilization=0.8, activation_reserve_bytes=1 << 30)
    assert b4 == int(H100_80GB.memory_bytes * 0.8) - w // 4 - (1 << 30)
    with pytest.raises(ModelDoesNotFitError, match="l4-24gb"):
        memory_budget(L4_24GB, ModelCost.from_hf_config(LLAMA_70B).weight_bytes)
    for bad in (dict(tp=0), dict(utilization=0.0), dict(utilization=1.5), dict(activation_reserve_bytes=-1)):
        with pytest.raises(ValueError):
            memory_budget(H100_80GB, w, **bad)


def test_llama4_table2_context_lengths():
    """Paper Table 2 (Scout, TP8): 1.3M / 5.2M tokens on H100, 3.7M / 14.7M on H200 with a
    ~17.5 GB profile reserve."""
    w = ModelCost.from_hf_config(SCOUT).weight_bytes
    expected = {"h100-80gb": (1.3e6, 5.2e6), "h200-141gb": (3.7e6, 14.7e6)}
    for name, (vllm_len, jenga_len) in expected.items():
        total = 8 * memory_budget(get_gpu(name), w, tp=8, activation_reserve_bytes=int(17.5e9))
        assert total / 196_608 == pytest.approx(vllm_len, rel=0.05)
        assert (total - 36 * 8192 * 4096) / (12 * 4096) == pytest.approx(jenga_len, rel=0.05)


def test_host_links():
    """PCIe Gen5 x16 for H100 / H200 (55 GB/s effective), Gen4 for L4, NVLink-C2C for GH200."""
    assert H100_80GB.host_link_bytes_per_s == pytest.approx(55e9)
    assert H200_141GB.host_link_bytes_per_s == H100_80GB.host_link_bytes_per_s
    assert L4_24GB.host_link_bytes_per_s == pytest.approx(H100_80GB.host_link_bytes_per_s / 2)
    assert GH200_144GB.host_link_bytes_per_s == pytest.approx(450e9 * 55 / 64)
    cm = CostModel(H100_80GB, llama8())
    assert cm.host_copy_time(0) == 0.0
    assert cm.host_copy_time(55e9) == pytest.approx(1.0)
    assert CostModel(H100_80GB, llama8(), tp=2).host_copy_time(55e9) == pytest.approx(0.5)  # one link per GPU


# --------------------------------------------------------------------------------- cost model

def test_decode_batch1_sanity():
    m = llama8()
    ideal = CostModel(H100_80GB, m, bandwidth_efficiency=1.0, step_overhead_s=0, per_seq_overhead_s=0)
    assert ideal.step_time(0, 1) == pytest.approx(16.06e9 / 3.35e12, rel=0.02)
    assert ideal.step_time(0, 1) == pytest.approx(4.8e-3, rel=0.03)
    real = CostModel(H100_80GB, m)
    assert 4.8e-3 < real.step_time(0, 1) < 4.8e-3 / real.bandwidth_efficiency + 3e-3


def test_gpu_ordering():
    m = llama8()
    for args in [(0, 1), (0, 64, 64 * 4096 * 131072), (8192, 0)]:
        t = {g: CostModel(GPUS[g], m).step_time(*args) for g in GPUS}
        assert t["l4-24gb"] > t["h100-80gb"] >= t["h200-141gb"]


def test_step_time_monotone():
    cm = CostModel(H100_80GB, llama8())
    assert cm.step_time(0, 0) == 0.0
    prev = 0.0
    for decode in (1, 8, 64, 256, 1024, 4096):
        t = cm.step_time(0, decode, decode * 1000 * 131072)
        assert t > prev
        prev = t
    prev = 0.0
    for prefill in (16, 512, 2048, 8192, 16384):
        t = cm.step_time(prefill, 0, context_lens=[0], query_lens=[prefill])
        assert t >= prev
        prev = t
    assert cm.step_time(0, 8, kv_bytes_read=1e9) > cm.step_time(0, 8, kv_bytes_read=0)
    assert cm.step_time(4096, 0, attention_flops=1e15) > cm.step_time(4096, 0)


def test_prefill_is_compute_bound_and_attention_flops():
    m = llama8()
    cm = CostModel(H100_80GB, m, step_overhead_s=0, per_seq_overhead_s=0)
    t = cm.step_time(8192, 0, num_seqs=1)
    flops = m.matmul_flops(8192, 1)
    assert t == pytest.approx(flops / (H100_80GB.peak_flops_bf16 * cm.mfu))
    one = m.attention_flops([1], [999])
    assert one == pytest.approx(4 * 32 * 128 * 1000 * 32)
    assert m.attention_flops([1, 1], [999, 999]) == pytest.approx(2 * one)
    with pytest.raises(ValueError, match="shape"):
        m.attention_flops([1, 2], [3])
    long = cm.step_time(8192, 0, context_lens=[100_000], query_lens=[8192])
    assert long > cm.step_time(8192, 0, context_lens=[0], query_lens=[8192]) > cm.step_time(8192, 0)


def test_tensor_parallel_and_fp8():
    m70 = ModelCost.from_hf_config(LLAMA_70B)
    tp1, tp4 = CostModel(H100_80GB, m70), CostModel(H100_80GB, m70, tp=4)
    assert tp4.step_time(0, 32) < tp1.step_time(0, 32)
    assert tp4.allreduce_time(32) > 0 == tp1.allreduce_time(32)
    fp8 = ModelCost.from_hf_config(LLAMA_8B, dtype="fp8")
    assert CostModel(H100_80GB, fp8).step_time(8192, 0) < CostModel(H100_80GB, llama8()).step_time(8192, 0)


def test_cost_model_validation():
    for bad in (dict(tp=0), dict(mfu=0), dict(bandwidth_efficiency=1.5), dict(step_overhead_s=-1)):
        with pytest.raises(ValueError):
            CostModel(H100_80GB, llama8(), **bad)
    with pytest.raises(ValueError):
        CostModel(H100_80GB, llama8()).step_time(-1, 0)
    assert isinstance(H100_80GB, GPUSpec)
