"""The memory vLLM's start-up profile run keeps back from the KV cache (per GPU).

vLLM sizes its KV cache as ``memory x gpu_memory_utilization - weights - peak of one dummy
forward pass`` (v0 ``Worker.determine_num_available_blocks``, v1 ``Worker.determine_available_memory``),
and that dummy pass runs ``max_num_batched_tokens`` tokens at once.  With chunked prefill off
(vLLM v0) that is ``max(max_model_len, 2048)`` — 131,072 tokens for a 128k-context model — so
the reserve of a long-context v0 server is far above the flat default of
:data:`jenga.sim.gpu.DEFAULT_ACTIVATION_RESERVE_BYTES` (2 GiB, this project's figure for an
8,192-token profile).

:func:`profile_reserve_bytes` = that default for up to :data:`BASE_PROFILE_TOKENS` tokens, plus,
for each further token, the largest activations alive at once in one decoder layer, read off
the config's shapes (bf16, per GPU under tensor parallelism):

* the fused QKV output ``(H_q + 2 H_kv) x D / tp``;
* the MLP's gate/up output and its activation ``3 x I / tp`` (MoE: ``top_k x`` the expert
  width, plus a shared expert);
* the residual stream and the normed hidden state ``2 x h``.

No constant here is tuned: the shapes come from the model's config, the method from vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping

from jenga.sim.gpu import DEFAULT_ACTIVATION_RESERVE_BYTES

#: Profile size (tokens) the flat default reserve stands for (vLLM v1's H100 serving budget).
BASE_PROFILE_TOKENS = 8192
ACTIVATION_BYTES = 2  # bf16 activations


def activation_bytes_per_token(config: Mapping, tp: int = 1) -> float:
    """Peak live activation bytes per token of one decoder layer, per GPU (see module doc)."""
    text = config.get("text_config") or config
    h = int(text["hidden_size"])
    heads = int(text.get("num_attention_heads") or max(1, h // 128))
    kv = int(text.get("num_key_value_heads") or heads)
    d = int(text.get("head_dim") or h // heads)
    inter = int(text.get("intermediate_size_mlp") or text.get("intermediate_size") or 4 * h)
    experts = int(text.get("num_local_experts") or text.get("num_experts") or 0)
    if experts > 1:
        top_k = int(text.get("num_experts_per_tok") or 1)
        expert = int(text.get("moe_intermediate_size") or text.get("intermediate_size") or inter)
        inter = max(inter, top_k * expert + int(text.get("shared_expert_intermediate_size") or 0))
    per_gpu = ((heads + 2 * kv) * d + 3 * inter) / tp + 2 * h
    return ACTIVATION_BYTES * per_gpu


def profile_reserve_bytes(config: Mapping, profile_tokens: int, tp: int = 1) -> int:
    """Per-GPU reserve left by a profile run over ``profile_tokens`` tokens."""
    extra = max(0, profile_tokens - BASE_PROFILE_TOKENS)
    return int(DEFAULT_ACTIVATION_RESERVE_BYTES + extra * activation_bytes_per_token(config, tp))
