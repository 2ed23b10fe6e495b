"""vLLM's per-layer KV-cache specs in jenga's vocabulary (and back).

``jenga_spec`` maps one ``vllm.v1.kv_cache_interface`` spec to a ``jenga.core.specs`` spec;
a kind jenga cannot run inside vLLM raises :class:`UnsupportedInVllm` naming it, at
engine start.  ``model_of_groups`` builds the jenga ``ModelSpec`` for a list of
``(layer names, vLLM spec)`` groups.

``JENGA_VLLM_STEP_CHECKPOINTS``: ``value`` (the default) or ``off``: an align-mode state also
keeps the state a prefill step ends on inside a long prompt (a chunk end) as a checkpoint, where
it saves more recompute than it holds bytes (``step_end_from``): a prompt that shares the first
``t`` tokens of an earlier one resumes at its last chunk end below ``t`` instead of recomputing
the whole prefix (vLLM keeps every one with ``prefix_cache_retention_interval=None``).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from vllm.v1 import kv_cache_interface as kvi

from jenga.core import specs as js
from jenga.errors import JengaError
from jenga.vllm.switches import switch

TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "fp8",
                torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8", torch.int8: "int8"}


class UnsupportedInVllm(JengaError, NotImplementedError):
    """A vLLM feature or layer kind that jenga's scheduler cannot serve (raised at engine start)."""


def dtype_name(dtype) -> str:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise UnsupportedInVllm(f"jenga.vllm: KV-cache dtype {dtype} has no jenga equivalent") from None


#: vLLM spec classes jenga refuses (subclasses of the ones it maps), with the reason
REFUSED = {
    "MLAAttentionSpec": "multi-head latent attention (DeepSeek MLA) pages",
    "CrossAttentionSpec": "encoder-decoder cross-attention (vLLM's cross-attention path)",
    "EncoderOnlyAttentionSpec": "encoder-only attention",
    "SinkFullAttentionSpec": "sink-token full attention",
    "RSWASpec": "restricted sliding window attention",
    "CircularBufferSpec": "circular-buffer attention",
    "SlidingWindowMLASpec": "sliding-window MLA",
}


def jenga_spec(spec, model: str, *, checkpoint_interval: int) -> js.CacheSpec:
    """The jenga spec of one vLLM layer spec (``UnsupportedInVllm`` when there is none)."""
    name = type(spec).__name__
    if name in REFUSED:
        raise UnsupportedInVllm(f"jenga.vllm does not support {REFUSED[name]} ({name}) yet")
    if isinstance(spec, kvi.AttentionSpec):
        if spec.head_size_v != spec.head_size or spec.num_head_slots is not None or spec.tokens_per_state != 1 \
                or spec.state_content_bytes is not None:
            raise UnsupportedInVllm(f"jenga.vllm: packed or asymmetric attention pages ({name}) are not supported")
        kw = dict(model=model, dtype=dtype_name(spec.dtype), num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size)
        if isinstance(spec, kvi.SlidingWindowSpec):
            if spec.extra_retained_tokens:
                raise UnsupportedInVllm("jenga.vllm: sliding windows with extra retained tokens (multi-module "
                                        "speculative decoding) are not supported")
            return js.SlidingWindowSpec(window=spec.sliding_window, **kw)
        if isinstance(spec, kvi.ChunkedLocalAttentionSpec):
            return js.ChunkedLocalSpec(chunk=spec.attention_chunk_size, **kw)
        if type(spec) is kvi.FullAttentionSpec:
            return js.FullAttentionSpec(**kw)  # also vLLM's "sliding stored as full" when HMA is off
    if isinstance(spec, kvi.MambaSpec):
        return state_spec(spec, model, checkpoint_interval=checkpoint_interval)
    raise UnsupportedInVllm(f"jenga.vllm: no jenga cache kind for vLLM's {name}")


#: vLLM's ``mamba_cache_mode`` -> the jenga state spec whose page rules match its worker:
#: "align" (prefix caching on) copies the state reached by a step forward at the next step;
#: "none" (prefix caching off) keeps one state slot per request, updated in place
STATE_SPECS = {"align": js.CopyForwardMambaSpec, "none": js.MambaSpec}


def state_spec(spec, model: str, *, checkpoint_interval: int) -> js.MambaSpec:
    """A vLLM ``MambaSpec`` (Mamba-1/2, Gated DeltaNet, short conv) as a jenga state spec."""
    if spec.mamba_cache_mode not in STATE_SPECS:
        raise UnsupportedInVllm(f"jenga.vllm: mamba_cache_mode={spec.mamba_cache_mode!r} has no jenga state "
                                f"protocol; use one of {sorted(STATE_SPECS)}")
    if spec.num_speculative_blocks:
        raise UnsupportedInVllm(
            f"jenga.vllm: speculative Mamba blocks (speculative decoding on a hybrid, any method, n-gram "
            f"included: vLLM keeps 1 + {spec.num_speculative_blocks} state blocks per request, jenga's state pages one) are not supported; "
            "with prefix caching on, stock vLLM 0.32's CPU build has no reference either (its align-mode "
            "state pre-copy for drafts is a Triton kernel)")
    if spec.num_heads != 1 or spec.tokens_per_state != -1:
        raise UnsupportedInVllm(f"jenga.vllm: per-head or token-sized state pages ({spec.mamba_type}) are not "
                                "supported")
    dtypes = tuple(dtype_name(d) for d in spec.dtypes)
    return STATE_SPECS[spec.mamba_cache_mode](model, dtype=dtypes[0], shapes=tuple(tuple(s) for s in spec.shapes),
                                              dtypes=dtypes, checkpoint_interval=checkpoint_interval)


def model_of_groups(groups: list[tuple[list[str], object]], *, name: str, max_model_len: int,
                    checkpoint_interval: int = 512) -> js.ModelSpec:
    """One jenga ``LayerGroup`` per ``(layer names, vLLM spec)``, numbered in order of layers;
    ``tokens_per_page`` is the vLLM spec's block size."""
    out, first = [], 0
    for i, (layers, spec) in enumerate(groups):
        jspec = jenga_spec(spec, name, checkpoint_interval=checkpoint_interval)
        out.append(js.LayerGroup(f"g{i}.{jspec.kind}", jspec, tuple(range(first, first + len(layers))),
                                 spec.block_size))
        first += len(layers)
    return js.ModelSpec(name, tuple(_with_step_ends(out)), max_model_len=max_model_len, num_layers=first)


STEP_CHECKPOINTS_ENV = "JENGA_VLLM_STEP_CHECKPOINTS"
STEP_CHECKPOINTS = ("off", "value")


def step_end_from(groups: list[js.LayerGroup]) -> int:
    """Where a step-end state starts paying for its page (module doc): the tokens whose K/V in the
    model's token groups take the bytes of one state page of the largest state group (a hit at
    ``t`` saves recomputing ``t`` tokens; the checkpoint holds one page).  0 without state groups
    or token groups."""
    per_token = sum(g.spec.bytes_per_token() * g.num_layers for g in groups if g.spec.per_token)
    states = [g.spec.state_bytes() * g.num_layers for g in groups if isinstance(g.spec, js.CopyForwardMambaSpec)]
    if not per_token or not states:
        return 0
    return math.ceil(max(states) / per_token)


def _with_step_ends(groups: list[js.LayerGroup]) -> list[js.LayerGroup]:
    name = switch(STEP_CHECKPOINTS_ENV, STEP_CHECKPOINTS, "value", UnsupportedInVllm)
    first = step_end_from(groups) if name == "value" else 0
    if not first:
        return groups
    return [dataclasses.replace(g, spec=dataclasses.replace(g.spec, step_end_from=first))
            if isinstance(g.spec, js.CopyForwardMambaSpec) else g for g in groups]
