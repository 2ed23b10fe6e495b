"""Catalog-free model size estimates from a Hugging Face ``config.json`` dict.

:class:`ModelCost` — total / active parameters and weight bytes for dense, MoE, Mamba-1/2,
Gated DeltaNet and multimodal (``text_config`` + ``vision_config``) models, plus the matmul
and attention FLOPs the roofline :class:`jenga.sim.gpu.CostModel` needs.  Like the rest of
:mod:`jenga.sim` it is an approximation meant for *relative* comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# --------------------------------------------------------------------------------- weight dtypes

#: Bits per weight element.  ``mxfp4`` = 4-bit elements + one 8-bit scale per 32 (gpt-oss).
WEIGHT_DTYPE_BITS: dict[str, float] = {
    "fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "mxfp4": 4.25,
}

#: Fallbacks for size fields a trimmed config may lack (recorded in ``ModelCost.assumed``):
#: ``intermediate_size = ffn_ratio x hidden`` (3.5 = Llama-3.1 / Mistral / Jamba SwiGLU ratio),
#: ``vocab_size`` 32,000 (Llama-2 / Mistral-7B), ``tie_word_embeddings`` True only for Gemma,
#: ``moe_intermediate_size`` = ``intermediate_size`` (Mixtral / Jamba / Llama 4 / gpt-oss style).
CONFIG_FALLBACKS: dict[str, float] = {"ffn_ratio": 3.5, "vocab_size": 32000}


def _weight_bits(dtype: str) -> float:
    try:
        return WEIGHT_DTYPE_BITS[dtype]
    except KeyError:
        raise ValueError(f"unknown weight dtype {dtype!r}; choose one of {sorted(WEIGHT_DTYPE_BITS)}") from None


# ------------------------------------------------------------------------------ model estimates

def _first(cfg: Mapping, *keys: str, default=None):
    for k in keys:
        v = cfg.get(k)
        if v is not None:
            return v
    return default


def _mamba1_params(cfg: Mapping, h: int) -> int:
    """Mamba-1 mixer (Jamba, Hymba): in_proj, conv, x_proj, dt_proj, A, D, out_proj."""
    d_inner = int(_first(cfg, "mamba_expand", "expand", default=2)) * h
    d_state = int(_first(cfg, "mamba_d_state", "state_size", default=16))
    d_conv = int(_first(cfg, "mamba_d_conv", "conv_kernel", default=4))
    dt_rank = int(_first(cfg, "mamba_dt_rank", "time_step_rank", default=-(-h // 16)))
    return (h * 2 * d_inner + d_inner * d_conv + d_inner * (dt_rank + 2 * d_state)
            + dt_rank * d_inner + d_inner + d_inner * d_state + d_inner + d_inner * h)


def _mamba2_params(cfg: Mapping, h: int) -> int:
    """Mamba-2 mixer (Nemotron-H, Falcon-H1): in_proj(z,x,B,C,dt), conv, A/D/dt_bias, norm, out_proj."""
    n_heads = int(_first(cfg, "mamba_num_heads", "mamba_n_heads", default=0))
    head_dim = int(_first(cfg, "mamba_head_dim", "mamba_d_head", default=64))
    d_inner = int(_first(cfg, "mamba_d_ssm", default=n_heads * head_dim))
    if not d_inner:
        d_inner = int(_first(cfg, "mamba_expand", "expand", default=2)) * h
        n_heads = d_inner // head_dim
    n_heads = n_heads or d_inner // head_dim
    groups = int(_first(cfg, "n_groups", "mamba_n_groups", default=1))
    d_state = int(_first(cfg, "ssm_state_size", "mamba_d_state", default=128))
    d_conv = int(_first(cfg, "conv_kernel", "mamba_d_conv", default=4))
    xbc = d_inner + 2 * groups * d_state
    return h * (d_inner + xbc + n_heads) + xbc * d_conv + 3 * n_heads + d_inner + d_inner * h


def _gdn_params(cfg: Mapping, h: int) -> int:
    """Gated DeltaNet mixer (Qwen3-Next / Qwen3.5): in_proj_qkvz, in_proj_ba, conv, norm, out_proj."""
    key_dim = int(cfg.get("linear_num_key_heads", 16)) * int(cfg.get("linear_key_head_dim", 128))
    n_v = int(cfg.get("linear_num_value_heads", 32))
    value_dim = n_v * int(cfg.get("linear_value_head_dim", 128))
    conv = int(cfg.get("linear_conv_kernel_dim", 4))
    return (h * (2 * key_dim + 2 * value_dim) + h * 2 * n_v + (2 * key_dim + value_dim) * conv
            + 2 * n_v + value_dim + value_dim * h)


#: FLOPs per state element per token of a recurrent state update (decay, input and read-out
#: multiply-adds: Mamba's ``h = exp(dt A) h + dt B x; y = C h``, the delta rule's update and read).
SCAN_FLOPS_PER_STATE_ELEMENT = 6


def _state_elements(cfg: Mapping, h: int, mixer: str) -> int:
    """State elements one token updates in one layer's recurrent mixer (0 for attention)."""
    if mixer == "mamba1":
        return (int(_first(cfg, "mamba_expand", "expand", default=2)) * h
                * int(_first(cfg, "mamba_d_state", "state_size", default=16)))
    if mixer == "mamba2":
        n_heads = int(_first(cfg, "mamba_num_heads", "mamba_n_heads", default=0))
        d_inner = int(_first(cfg, "mamba_d_ssm", default=n_heads * int(_first(cfg, "mamba_head_dim",
                                                                                  "mamba_d_head", default=64))))
        d_inner = d_inner or int(_first(cfg, "mamba_expand", "expand", default=2)) * h
        return d_inner * int(_first(cfg, "ssm_state_size", "mamba_d_state", default=128))
    if mixer == "gdn":
        return (int(cfg.get("linear_num_value_heads", 32)) * int(cfg.get("linear_key_head_dim", 128))
                * int(cfg.get("linear_value_head_dim", 128)))
    return 0


def _layer_plan(cfg: Mapping, n_layers: int, n_experts: int) -> list[tuple[str, str]]:
    """(mixer, ffn) per layer; mixer in {attn, mamba1, mamba2, gdn, attn+mamba1, attn+mamba2, none},
    ffn in {dense, moe, none}.  Rules follow reference/models.md §0."""
    def moe_at(i: int) -> bool:
        if n_experts <= 1:
            return False
        if "expert_layer_period" in cfg:  # Jamba
            return i % int(cfg["expert_layer_period"]) == int(cfg.get("expert_layer_offset", 0))
        if "interleave_moe_layer_step" in cfg:  # Llama 4
            return (i + 1) % max(1, int(cfg["interleave_moe_layer_step"])) == 0
        if i in (cfg.get("mlp_only_layers") or ()) or i < int(cfg.get("first_k_dense_replace", 0)):
            return False
        return (i + 1) % max(1, int(cfg.get("decoder_sparse_step", 1))) == 0

    pattern = cfg.get("hybrid_override_pattern")
    if pattern:  # Nemotron-H: one block per layer
        kinds = {"M": ("mamba2", "none"), "*": ("attn", "none"), "-": ("none", "dense"), "E": ("none", "moe")}
        try:
            return [kinds[c] for c in pattern]
        except KeyError as e:
            raise ValueError(f"hybrid_override_pattern: unknown layer character {e.args[0]!r}") from None
    ffn = ["moe" if moe_at(i) else "dense" for i in range(n_layers)]
    if "attn_layer_period" in cfg:  # Jamba
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset", 0))
        return [("attn" if i % period == offset else "mamba1", ffn[i]) for i in range(n_layers)]
    types = cfg.get("layer_types")
    if isinstance(types, Sequence) and not isinstance(types, str) and len(types) == n_layers:
        def mixer(t: str) -> str:
            return "gdn" if t == "linear_attention" else "mamba2" if "mamba" in t else "attn"
        return [(mixer(str(t)), ffn[i]) for i, t in enumerate(types)]
    if "full_attention_interval" in cfg:  # Qwen3-Next without layer_types
        k = int(cfg["full_attention_interval"])
        return [("attn" if (i + 1) % k == 0 else "gdn", ffn[i]) for i in range(n_layers)]
    if "global_attn_idx" in cfg:  # Hymba: attention and Mamba heads in every layer
        return [("attn+mamba1", ffn[i]) for i in range(n_layers)]
    if cfg.get("model_type") == "falcon_h1" or "mamba_d_ssm" in cfg:
        return [("attn+mamba2", ffn[i]) for i in range(n_layers)]
    return [("attn", ffn[i]) for i in range(n_layers)]


#: ``MllamaVisionConfig.vision_output_dim`` default in HF transformers (the projector's input width).
MLLAMA_VISION_OUTPUT_DIM = 7680


def _vision_params(vcfg: Mapping, text_hidden: int) -> int:
    """ViT tower: (4 h^2 + 2 h * intermediate) per layer (non-gated MLP), global layers included,
    plus mllama's ``multi_modal_projector`` (``vision_output_dim x`` text hidden)."""
    h = int(_first(vcfg, "hidden_size", "width", default=0))
    layers = int(_first(vcfg, "num_hidden_layers", "depth", default=0)) + int(vcfg.get("num_global_layers", 0))
    inter = int(_first(vcfg, "intermediate_size", default=4 * h))
    out = int(vcfg.get("vision_output_dim", MLLAMA_VISION_OUTPUT_DIM if vcfg.get("model_type") == "mllama_vision_model"
                       else 0))
    return layers * (4 * h * h + 2 * h * inter) + out * text_hidden


@dataclass(frozen=True)
class ModelCost:
    """Parameter counts of one model (approximate; norms/biases only partly counted).

    ``body_params`` are the decoder layers (attention/mixer + FFN + norms), ``body_active_params``
    what one token touches (top-k routed experts + shared experts for MoE).  ``embedding_params``
    is the input table (a lookup, no FLOPs); ``lm_head_params`` the output projection, stored
    separately unless ``tied``.  ``vision_params`` is the vision tower (+ projector); its FLOPs
    are :meth:`image_flops`, not part of :meth:`matmul_flops`, and its weights are read only by
    steps that encode images.  ``cross_kv_params`` are the K/V projections of cross-attention
    layers (mllama): image tokens pass only through the tower and these, never through the
    language model (``images_in_lm`` False).  ``scan_flops_per_token`` are the recurrent state
    updates of one token over all state layers (:data:`SCAN_FLOPS_PER_STATE_ELEMENT` per element).  ``routed_expert_params`` is the total over layers of
    all routed experts, used for MoE weight-read estimates.  ``assumed`` names the config fields
    that were missing and replaced by :data:`CONFIG_FALLBACKS` (empty for a complete config).
    """

    name: str
    body_params: int
    body_active_params: int
    embedding_params: int
    lm_head_params: int
    tied: bool = False
    vision_params: int = 0
    cross_kv_params: int = 0
    routed_expert_params: int = 0
    num_experts: int = 0
    experts_per_tok: int = 0
    num_layers: int = 0
    num_attention_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    head_dim: int = 0
    scan_flops_per_token: int = 0
    dtype: str = "bf16"
    assumed: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _weight_bits(self.dtype)

    @property
    def params_total(self) -> int:
        return (self.body_params + self.embedding_params + self.vision_params
                + (0 if self.tied else self.lm_head_params))

    @property
    def params_active(self) -> int:
        """Parameters touched per generated token (embedding and lm_head included)."""
        return self.body_active_params + self.embedding_params + (0 if self.tied else self.lm_head_params)

    @property
    def weight_bytes(self) -> int:
        return int(self.params_total * _weight_bits(self.dtype) / 8)

    @property
    def images_in_lm(self) -> bool:
        """Whether image positions run through the language model (Llama 4, Gemma 3: yes;
        cross-attention models such as mllama: no)."""
        return not self.cross_kv_params

    def weight_bytes_read(self, num_tokens: int, num_image_tokens: int = 0) -> float:
        """Weight bytes one forward pass over ``num_tokens`` tokens streams from HBM.

        Dense models read every language-model weight; the vision tower only when the pass
        encodes images (``num_image_tokens > 0``).  MoE models read the non-expert weights plus
        the expected fraction of routed experts hit by ``num_tokens`` independent top-k draws:
        ``1 - (1 - k/E)^num_tokens``.
        """
        bpp = _weight_bits(self.dtype) / 8
        params = self.params_total - (0 if num_image_tokens > 0 else self.vision_params)
        if self.routed_expert_params and self.num_experts > 0:
            frac = 1.0 - (1.0 - self.experts_per_tok / self.num_experts) ** max(0, num_tokens)
            params -= self.routed_expert_params * (1.0 - frac)
        return bpp * params

    def image_flops(self, num_image_tokens: int) -> float:
        """Encoder FLOPs of ``num_image_tokens`` image positions: ``2 x (vision tower + cross-
        attention K/V projections)`` each (one tower pass per position — exact for mllama's
        1601 tokens per tile; towers that pool patches, e.g. Gemma 3's, are undercounted)."""
        return 2.0 * (self.vision_params + self.cross_kv_params) * num_image_tokens

    def matmul_flops(self, num_tokens: int, num_logits: int | None = None) -> float:
        """``2 x params`` FLOPs: body active params for every token, lm_head for ``num_logits``
        tokens (default all of them)."""
        logits = num_tokens if num_logits is None else num_logits
        return 2.0 * (self.body_active_params * num_tokens + self.lm_head_params * logits)

    def attention_flops(self, query_lens, context_lens) -> float:
        """QK^T + AV FLOPs over all attention layers, every layer attending to the whole context.

        ``query_lens[i]`` new tokens of sequence ``i`` attend causally to ``context_lens[i]``
        already-cached tokens plus the new ones: ``4 x H_q x D x q x (c + (q + 1) / 2)`` per layer.
        Callers with windowed layers should compute their own figure.
        """
        q = np.asarray(query_lens, dtype=np.float64)
        c = np.asarray(context_lens, dtype=np.float64)
        if q.shape != c.shape:
            raise ValueError(f"query_lens and context_lens differ in shape: {q.shape} vs {c.shape}")
        per_layer = 4.0 * self.num_attention_heads * self.head_dim * float(np.sum(q * (c + (q + 1) / 2)))
        return per_layer * self.num_attention_layers

    @classmethod
    def from_hf_config(cls, config: Mapping, name: str | None = None, dtype: str = "bf16",
                       strict: bool = False) -> ModelCost:
        """Estimate counts from an HF ``config.json`` dict (no catalog, no download).

        Reads ``text_config`` when present (multimodal) and estimates ``vision_config`` as a ViT.
        Per layer: attention ``h*(H_q*D) + 2*h*(H_kv*D) + (H_q*D)*h`` (q doubled when
        ``attn_output_gate``); FFN ``3*h*I`` (gated; ``2*h*I`` for ``relu2``); MoE
        ``E*3*h*I_e + h*E`` router + shared experts; Mamba-1/2 and Gated DeltaNet mixers as in
        their reference implementations; plus ``2*h`` of norms.  Embedding ``V*h`` plus an
        untied lm_head ``V*h``.  Within a few percent for Llama/Mistral/Gemma/Jamba/gpt-oss.

        ``hidden_size`` and ``num_hidden_layers`` are required.  Missing size fields fall back to
        :data:`CONFIG_FALLBACKS` and are listed in :attr:`assumed`; with ``strict=True`` any such
        fallback raises ``ValueError`` naming the missing fields instead.
        """
        text = config.get("text_config") or config
        assumed: list[str] = []

        def get(keys: tuple[str, ...], fallback, *, record: bool = True):
            v = _first(text, *keys, default=config.get(keys[0]))
            if v is None and record:
                assumed.append(keys[0])
            return fallback if v is None else v

        try:
            h = int(_first(text, "hidden_size", "d_model", "n_embd"))
            n_layers = int(_first(text, "num_hidden_layers", "n_layer", "num_layers"))
        except (TypeError, ValueError):
            raise ValueError(f"config needs hidden_size and num_hidden_layers (got keys {sorted(text)})") from None
        vocab = int(get(("vocab_size",), CONFIG_FALLBACKS["vocab_size"]))
        heads = int(get(("num_attention_heads", "n_head"), max(1, h // 128)))
        kv_heads = int(get(("num_key_value_heads",), heads, record=False))  # HF default: MHA
        head_dim = int(get(("head_dim",), h // heads, record=False))
        n_exp = int(get(("num_local_experts", "num_experts", "n_routed_experts"), 0, record=False))
        plan = _layer_plan(text, n_layers, n_exp)
        has_dense = any(f == "dense" for _, f in plan)
        inter = int(get(("intermediate_size", "ffn_dim"), round(CONFIG_FALLBACKS["ffn_ratio"] * h),
                        record=has_dense or n_exp > 0))
        dense_inter = int(get(("intermediate_size_mlp",), inter, record=False))
        top_k = int(get(("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk"),
                        1 if n_exp else 0, record=n_exp > 0))
        family = str(text.get("model_type", config.get("model_type", "")))
        exp_inter = int(get(("moe_intermediate_size",), inter,
                            record=n_exp > 0 and family.startswith(("qwen", "deepseek"))))
        shared_inter = int(get(("shared_expert_intermediate_size",), 0, record=False))
        if not shared_inter and text.get("n_shared_experts"):
            shared_inter = int(text["n_shared_experts"]) * exp_inter
        if not shared_inter and family.startswith("llama4"):
            shared_inter = exp_inter  # Llama 4 MoE layers carry one shared expert
        tied = bool(get(("tie_word_embeddings",), family.startswith("gemma")))
        if strict and assumed:
            raise ValueError(f"config lacks {assumed}; pass a full config.json or strict=False")
        mats = 2 if str(get(("mlp_hidden_act", "hidden_act"), "silu", record=False)) == "relu2" else 3

        q_dim = heads * head_dim * (2 if text.get("attn_output_gate") else 1)
        attn = h * q_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        part = {"attn": lambda: attn, "none": lambda: 0, "mamba1": lambda: _mamba1_params(text, h),
                "mamba2": lambda: _mamba2_params(text, h), "gdn": lambda: _gdn_params(text, h)}
        mixers = {m: sum(part[p]() for p in m.split("+")) for m in {m for m, _ in plan}}
        expert, shared = mats * h * exp_inter, mats * h * shared_inter
        body = active = routed = 0
        for mixer, ffn in plan:
            m = mixers[mixer] + 2 * h
            if ffn == "dense":
                f = fa = mats * h * dense_inter
            elif ffn == "moe":
                routed += n_exp * expert
                f = n_exp * expert + h * n_exp + shared
                fa = top_k * expert + h * n_exp + shared
            else:
                f = fa = 0
            body += m + f
            active += m + fa
        scan = SCAN_FLOPS_PER_STATE_ELEMENT * sum(_state_elements(text, h, p) for m, _ in plan for p in m.split("+"))
        vcfg = config.get("vision_config")
        vision = _vision_params(vcfg, h) if isinstance(vcfg, Mapping) else 0
        cross = len(text.get("cross_attention_layers") or ()) * 2 * h * kv_heads * head_dim
        return cls(
            name=name or str(_first(config, "_name_or_path", "model_type", default="model")),
            body_params=body, body_active_params=active, embedding_params=vocab * h,
            lm_head_params=vocab * h, tied=tied, vision_params=vision, cross_kv_params=cross,
            routed_expert_params=routed,
            num_experts=n_exp, experts_per_tok=top_k, num_layers=len(plan),
            num_attention_layers=sum("attn" in m for m, _ in plan), hidden_size=h,
            num_attention_heads=heads, head_dim=head_dim, scan_flops_per_token=scan, dtype=dtype, assumed=tuple(assumed))
