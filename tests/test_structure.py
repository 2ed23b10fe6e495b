"""HF config -> layer groups: exact numbers from shared/reference/models.md for every catalog model."""

from __future__ import annotations

import json

import pytest

from jenga.core.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)
from jenga.structure import (
    CATALOG_NAMES,
    UnsupportedModelError,
    list_catalog,
    model_spec_from_hf_config,
)

KiB, MiB = 1 << 10, 1 << 20

EXPECTED_CATALOG = {
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "mistral-7b", "ministral-8b", "gemma-2-9b",
    "gemma-2-27b", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b", "gpt-oss-20b", "gpt-oss-120b",
    "llama-4-scout", "llama-3.2-11b-vision", "llama-3.2-90b-vision", "jamba-1.5-mini", "nemotron-h-8b",
    "falcon-h1-7b", "qwen3-next-80b",
}

# name -> (num_layers, max_model_len, [(group, kind, n_layers, per-layer page bytes at 16 tokens, bf16)])
GROUPS = {
    "llama-3.1-8b": (32, 131072, [("full", "full", 32, 16 * 4096)]),
    "llama-3.1-70b": (80, 131072, [("full", "full", 80, 16 * 4096)]),
    "llama-3.2-1b": (16, 131072, [("full", "full", 16, 16 * 2048)]),
    "mistral-7b": (32, 32768, [("sliding", "sliding", 32, 16 * 4096)]),
    "ministral-8b": (36, 131072, [("full", "full", 9, 16 * 4096), ("sliding", "sliding", 27, 16 * 4096)]),
    "gemma-2-9b": (42, 8192, [("sliding", "sliding", 21, 16 * 8192), ("full", "full", 21, 16 * 8192)]),
    "gemma-2-27b": (46, 8192, [("sliding", "sliding", 23, 16 * 8192), ("full", "full", 23, 16 * 8192)]),
    "gemma-3-4b": (34, 131072, [("sliding", "sliding", 29, 16 * 4096), ("full", "full", 5, 16 * 4096),
                                ("vision", "vision", 1, 16 * 2560 * 2)]),
    "gemma-3-12b": (48, 131072, [("sliding", "sliding", 40, 16 * 8192), ("full", "full", 8, 16 * 8192),
                                 ("vision", "vision", 1, 16 * 7680)]),
    "gemma-3-27b": (62, 131072, [("sliding", "sliding", 52, 16 * 8192), ("full", "full", 10, 16 * 8192),
                                 ("vision", "vision", 1, 16 * 5376 * 2)]),
    "gpt-oss-20b": (24, 131072, [("sliding", "sliding", 12, 16 * 2048), ("full", "full", 12, 16 * 2048)]),
    "gpt-oss-120b": (36, 131072, [("sliding", "sliding", 18, 16 * 2048), ("full", "full", 18, 16 * 2048)]),
    "llama-4-scout": (48, 10485760, [("chunked", "chunked", 36, 16 * 4096), ("full", "full", 12, 16 * 4096)]),
    "llama-3.2-11b-vision": (40, 131072, [("full", "full", 32, 16 * 4096), ("cross", "cross", 8, 16 * 4096)]),
    "llama-3.2-90b-vision": (100, 131072, [("full", "full", 80, 16 * 4096), ("cross", "cross", 20, 16 * 4096)]),
    "jamba-1.5-mini": (32, 262144, [("mamba", "mamba", 28, 311_296), ("full", "full", 4, 16 * 4096)]),
    "nemotron-h-8b": (52, 8192, [("mamba", "mamba", 24, 2_158_592), ("full", "full", 4, 16 * 4096)]),
    "falcon-h1-7b": (44, 262144, [("full", "full", 44, 16 * 1024), ("mamba", "mamba", 44, 1_594_368)]),
    "qwen3-next-80b": (48, 262144, [("mamba", "mamba", 36, 1_097_728), ("full", "full", 12, 16 * 2048)]),
}


def test_catalog_names():
    assert set(CATALOG_NAMES) == EXPECTED_CATALOG
    assert list_catalog() == sorted(EXPECTED_CATALOG)
    assert set(GROUPS) == EXPECTED_CATALOG


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_catalog_groups(name):
    num_layers, max_len, expected = GROUPS[name]
    m = model_spec_from_hf_config(name)
    assert m.name == name
    assert m.num_layers == num_layers
    assert m.max_model_len == max_len
    got = [(g.name, g.kind, g.num_layers, g.layer_page_bytes) for g in m.groups]
    assert got == expected
    assert all(g.tokens_per_page == 16 and g.pad_bytes == 0 for g in m.groups)
    assert all(g.spec.model == name for g in m.groups)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_catalog_json_is_hf_style(name):
    m = model_spec_from_hf_config(name)
    assert m.hf_config["model_type"] and m.hf_config["architectures"]
    # layers of one kind never overlap, and decoder layers stay within range
    for g in m.groups:
        assert len(set(g.layers)) == len(g.layers)
        assert all(0 <= i < m.num_layers for i in g.layers) or g.kind == "vision"


def layers(m: ModelSpec, group: str) -> tuple[int, ...]:
    return m.group(group).layers


def test_layer_placement_attention_models():
    m = model_spec_from_hf_config("ministral-8b")
    assert layers(m, "full") == tuple(range(0, 36, 4))
    assert m.group("sliding").spec == SlidingWindowSpec("ministral-8b", "bf16", 8, 128, window=32768)
    assert model_spec_from_hf_config("mistral-7b").group("sliding").spec.window == 4096
    g2 = model_spec_from_hf_config("gemma-2-9b")
    assert layers(g2, "sliding") == tuple(range(0, 42, 2))
    assert g2.group("sliding").spec.window == 4096
    g3 = model_spec_from_hf_config("gemma-3-27b")
    assert layers(g3, "full") == tuple(range(5, 62, 6))
    assert g3.group("sliding").spec.window == 1024
    assert layers(g3, "vision") == (62,)  # one past the last decoder layer
    assert g3.group("vision").spec == VisionEmbeddingSpec("gemma-3-27b", "bf16", hidden_size=5376)
    oss = model_spec_from_hf_config("gpt-oss-20b")
    assert layers(oss, "sliding") == tuple(range(0, 24, 2))
    assert oss.group("sliding").spec.window == 128
    assert oss.group("full").spec.head_dim == 64
    l4 = model_spec_from_hf_config("llama-4-scout")
    assert layers(l4, "full") == tuple(range(3, 48, 4))
    assert isinstance(l4.group("chunked").spec, ChunkedLocalSpec)
    assert l4.group("chunked").spec.chunk == 8192


def test_layer_placement_vision_llama():
    m = model_spec_from_hf_config("llama-3.2-11b-vision")
    assert layers(m, "cross") == (3, 8, 13, 18, 23, 28, 33, 38)
    assert isinstance(m.group("cross").spec, CrossAttentionSpec)
    assert isinstance(m.group("full").spec, FullAttentionSpec)
    assert len(set(layers(m, "full")) | set(layers(m, "cross"))) == 40
    assert layers(model_spec_from_hf_config("llama-3.2-90b-vision"), "cross") == tuple(range(3, 99, 5))


def test_hybrid_state_shapes():
    jamba = model_spec_from_hf_config("jamba-1.5-mini")
    assert layers(jamba, "full") == (4, 12, 20, 28)
    assert jamba.group("mamba").spec.shapes == ((8192, 3), (8192, 16))
    assert jamba.group("mamba").page_bytes == 28 * 311_296 == 133 * 2**16

    nem = model_spec_from_hf_config("nemotron-h-8b")
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert layers(nem, "mamba") == tuple(i for i, c in enumerate(pattern) if c == "M")
    assert layers(nem, "full") == tuple(i for i, c in enumerate(pattern) if c == "*") == (7, 18, 29, 40)
    assert nem.group("mamba").spec.shapes == ((8192 + 2 * 8 * 128, 3), (128, 64, 128))

    qn = model_spec_from_hf_config("qwen3-next-80b")
    assert layers(qn, "full") == tuple(range(3, 48, 4))
    assert qn.group("mamba").spec.shapes == ((4096 + 4096, 3), (32, 128, 128))

    fh = model_spec_from_hf_config("falcon-h1-7b")
    assert layers(fh, "full") == layers(fh, "mamba") == tuple(range(44))
    assert fh.group("mamba").spec.shapes == ((3072 + 2 * 256, 3), (24, 128, 256))
    assert fh.group("full").spec.num_kv_heads == 2 and fh.group("full").spec.head_dim == 128


def test_mamba_ssm_dtype_and_checkpoint():
    j = model_spec_from_hf_config("jamba-1.5-mini", mamba_ssm_dtype="fp32", mamba_checkpoint_interval=256)
    spec = j.group("mamba").spec
    assert spec.state_bytes() == 573_440 and spec.dtypes == ("bf16", "fp32")
    assert spec.checkpoint_interval == 256
    q = model_spec_from_hf_config("qwen3-next-80b", mamba_ssm_dtype="float32")
    assert q.group("mamba").spec.state_bytes() == 2_146_304
    # Nemotron-H's config default mamba_ssm_cache_dtype=float32 is ignored: caller's dtype wins
    assert model_spec_from_hf_config("nemotron-h-8b").group("mamba").spec.dtypes == ("bf16", "bf16")


def test_kv_bytes_per_token_totals():
    def per_token(name: str, kinds=("full", "sliding", "chunked", "cross")) -> int:
        m = model_spec_from_hf_config(name)
        return sum(g.spec.bytes_per_token() * g.num_layers for g in m.groups if g.kind in kinds)

    assert per_token("llama-3.1-8b") == 131_072
    assert per_token("llama-3.1-70b") == 327_680
    assert per_token("gemma-2-9b") == 344_064
    assert per_token("gemma-3-12b") == 393_216
    assert per_token("gemma-3-27b") == 507_904
    assert per_token("gemma-3-27b", ("full",)) == 81_920
    assert per_token("ministral-8b") == 147_456
    assert per_token("gpt-oss-20b", ("full",)) == 24_576
    assert per_token("llama-4-scout") == 196_608
    assert per_token("falcon-h1-7b") == 45_056
    assert per_token("qwen3-next-80b") == 24_576
    assert per_token("llama-3.2-11b-vision", ("full",)) == 131_072


def test_paper_lcm_examples():
    mini = model_spec_from_hf_config("ministral-8b")
    assert (mini.group("full").page_bytes, mini.group("sliding").page_bytes) == (576 * KiB, 1728 * KiB)
    assert mini.large_page_bytes == 1728 * KiB
    mll = model_spec_from_hf_config("llama-3.2-11b-vision")
    assert (mll.group("full").page_bytes, mll.group("cross").page_bytes) == (2 * MiB, 512 * KiB)
    assert mll.large_page_bytes == 2 * MiB
    split = model_spec_from_hf_config("jamba-1.5-mini", split_mamba_state=True)
    assert [g.name for g in split.groups] == ["mamba.conv", "mamba.ssm", "full"]
    assert split.large_page_bytes == 21 * MiB
    assert [split.large_page_bytes // g.page_bytes for g in split.groups] == [16, 3, 84]
    assert model_spec_from_hf_config("jamba-1.5-mini").large_page_bytes == 133 * 2**18  # 33.25 MiB
    assert model_spec_from_hf_config("nemotron-h-8b").large_page_bytes == 1581 * 2**18  # 395 MiB
    assert model_spec_from_hf_config("qwen3-next-80b").large_page_bytes == 603 * 2**17  # 75.4 MiB


def test_tensor_parallel_division():
    m = model_spec_from_hf_config("llama-3.1-70b", tp=4)
    assert m.group("full").spec.num_kv_heads == 2 and m.group("full").layer_page_bytes == 16 * 4096 // 4
    assert model_spec_from_hf_config("llama-3.1-70b", tp=16).group("full").spec.num_kv_heads == 1
    nem = model_spec_from_hf_config("nemotron-h-8b", tp=2).group("mamba").spec
    assert nem.shapes == ((4096 + 2 * 4 * 128, 3), (64, 64, 128)) and nem.state_bytes() == 2_158_592 // 2
    assert model_spec_from_hf_config("jamba-1.5-mini", tp=2).group("mamba").spec.state_bytes() == 155_648
    qn = model_spec_from_hf_config("qwen3-next-80b", tp=4)
    assert qn.group("full").spec.num_kv_heads == 1  # 2 KV heads replicated across 4 ranks
    assert qn.group("mamba").spec.state_bytes() == 1_097_728 // 4
    fh = model_spec_from_hf_config("falcon-h1-7b", tp=2).group("mamba").spec  # 1 group replicated
    assert fh.shapes == ((1536 + 2 * 256, 3), (12, 128, 256)) and fh.state_bytes() == 798_720
    g3 = model_spec_from_hf_config("gemma-3-27b", tp=2)
    assert g3.group("vision").spec.hidden_size == 5376  # embeddings are replicated
    with pytest.raises(ValueError, match="tp"):
        model_spec_from_hf_config("llama-3.1-8b", tp=3)
    with pytest.raises(ValueError, match="tp"):
        model_spec_from_hf_config("llama-3.1-8b", tp=0)


def test_dtype_options():
    assert model_spec_from_hf_config("llama-3.1-8b", dtype="fp8").group("full").layer_page_bytes == 16 * 2048
    assert model_spec_from_hf_config("llama-3.1-8b", dtype="bfloat16").group("full").spec.dtype == "bf16"
    with pytest.raises(ValueError, match="dtype"):
        model_spec_from_hf_config("llama-3.1-8b", dtype="int3")


def test_unknown_sources_name_the_missing_fact():
    with pytest.raises(UnsupportedModelError) as e:
        model_spec_from_hf_config({"model_type": "no_such_family", "num_hidden_layers": 2})
    assert "'no_such_family'" in str(e.value) and isinstance(e.value, ValueError)
    with pytest.raises(UnsupportedModelError, match="Catalog names: .*jamba-1.5-mini"):
        model_spec_from_hf_config("no-such-model-9000b")
    with pytest.raises(UnsupportedModelError, match="model_type"):
        model_spec_from_hf_config({"num_hidden_layers": 2})
    with pytest.raises(UnsupportedModelError, match="'vit' has no causal-LM"):  # a vision encoder: no decoder
        model_spec_from_hf_config({"model_type": "vit"})
    with pytest.raises(UnsupportedModelError, match="'num_key_value_heads' must be a positive integer, got 0"):
        model_spec_from_hf_config({**model_spec_from_hf_config("llama-3.2-1b").hf_config, "num_key_value_heads": 0})
    with pytest.raises(TypeError):
        model_spec_from_hf_config(42)


def test_local_directory_and_json_file(tmp_path):
    raw = model_spec_from_hf_config("ministral-8b").hf_config
    d = tmp_path / "My-Ministral"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    from_dir = model_spec_from_hf_config(d)
    assert from_dir.name == "My-Ministral"
    assert [(g.name, g.layers) for g in from_dir.groups] == \
        [(g.name, g.layers) for g in model_spec_from_hf_config("ministral-8b").groups]
    assert from_dir.hf_config == raw
    assert model_spec_from_hf_config(str(d / "config.json")).name == "My-Ministral"
    f = tmp_path / "nemo.json"
    f.write_text(json.dumps(model_spec_from_hf_config("nemotron-h-8b").hf_config))
    assert model_spec_from_hf_config(f, name="x").group("mamba").num_layers == 24
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        model_spec_from_hf_config(empty)


def test_dict_with_layer_types_is_authoritative():
    cfg = {"model_type": "llama", "num_hidden_layers": 6, "hidden_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 2, "sliding_window": 512, "max_position_embeddings": 4096,
           "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2}
    m = model_spec_from_hf_config(cfg, name="toy", tokens_per_page=32)
    assert [(g.name, g.layers) for g in m.groups] == [("sliding", (0, 1, 3, 4)), ("full", (2, 5))]
    assert m.group("sliding").spec.window == 512
    assert m.group("full").layer_page_bytes == 32 * 2 * 2 * 128 * 2
    assert m.max_model_len == 4096 and m.hf_config == cfg
    with pytest.raises(ValueError, match="layer_types"):
        model_spec_from_hf_config({**cfg, "layer_types": ["full_attention"]})
    # a Mistral config without a window is plain full attention
    mistral = {**model_spec_from_hf_config("mistral-7b").hf_config, "sliding_window": None}
    assert [g.name for g in model_spec_from_hf_config(mistral).groups] == ["full"]


def test_group_names_get_suffixes_when_kinds_repeat():
    from jenga.structure.groups import group_entries as _group

    a = SlidingWindowSpec("t", window=1024)
    b = SlidingWindowSpec("t", window=4096)
    full = FullAttentionSpec("t")
    groups = _group([(0, "sliding", a), (1, "sliding", b), (2, "full", full), (3, "sliding", a)], 16)
    assert [(g.name, g.layers) for g in groups] == [("sliding_1024", (0, 3)), ("sliding_4096", (1,)),
                                                    ("full", (2,))]


def test_vision_group_optional_and_classmethod():
    assert [g.name for g in model_spec_from_hf_config("gemma-3-4b", vision=False).groups] == ["sliding", "full"]
    via_cls = ModelSpec.from_hf_config("jamba-1.5-mini", tp=2)
    assert via_cls == model_spec_from_hf_config("jamba-1.5-mini", tp=2)
    assert isinstance(via_cls.group("mamba").spec, MambaSpec)


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_stored_catalog_structure_is_what_transformers_derives(name):
    """catalog/structure.json (what catalog names are planned from) equals a fresh derivation."""
    from jenga.structure.catalog import catalog_facts, derive_catalog_facts

    assert catalog_facts(name) == derive_catalog_facts(name)
