"""Recurrent-state sizes read from the model's own modules, built on the ``meta`` device (torch).

Imported lazily, only when a layer keeps a state (config fields name state sizes differently in every
family; the modules transformers builds from them do not).  ``with torch.device("meta")`` the text model is
built from its config (``AutoModelForCausalLM``, else ``AutoModel``): parameters get shapes but no memory.
The decoder stack is the ``ModuleList`` with one entry per layer; in each state layer the mixer is found by
what it holds, not by its class name:

* ``A_log`` of two or more dims ``(..., d_state)`` covering the ``conv1d`` channels: Mamba-1 (Zamba's
  multi-head Mamba-1 included);
* ``A_log`` of one dim ``(heads,)`` + ``conv1d`` + ``ssm_state_size`` / ``head_dim``: Mamba-2
  (B/C groups from the conv width: ``(conv - heads * head_dim) / (2 d_state)``);
* ``conv1d`` + ``head_k_dim`` / ``head_v_dim`` / ``num_k_heads`` / ``num_v_heads``: Gated DeltaNet;
* ``conv1d`` of ``3 x qkv_dim`` channels + ``num_heads`` / ``head_dim`` (``qkv_dim = heads x head_dim``):
  Kimi delta attention (KDA; GLM-5-Next's linear attention is the same shape);
* ``qkv_proj`` + ``block_size`` + ``num_attention_heads`` / ``head_dim``, no conv: lightning attention (MiniMax);
* a depthwise ``conv`` + ``conv_kernel_size`` and nothing recurrent: a short convolution (LFM2);
* ``conv_1d`` + an ``rg_lru`` with ``recurrent_param (width,)``: RG-LRU (RecurrentGemma);
* failing all of these, a layer whose convolutions are all depthwise ``Conv1d`` of one kernel (Inkling's
  K/V and residual short convolutions): their conv states, summed.

A state layer with none of these raises ``UnsupportedModelError`` naming the layer.

Since the model is built anyway, attention sizes of its layers are read from the modules too (config fields
can hide per-layer sizes: Inkling's sliding layers use ``swa_num_key_value_heads``): a submodule with an
integer ``head_dim`` and a ``k_proj`` (or ``num_key_value_heads``) gives ``(K/V heads, head_dim)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jenga.structure.facts import State
from jenga.structure.source import UnsupportedModelError, quiet_transformers

__all__ = ["probe_states"]


def _conv(m: Any, name: str = "conv1d") -> tuple[int, int] | None:
    """(channels, kernel) of a depthwise Conv1d child ``name``."""
    conv = getattr(m, name, None)
    w = getattr(conv, "weight", None)
    if w is None or w.dim() != 3 or w.shape[1] != 1:
        return None
    return int(w.shape[0]), int(w.shape[-1])


def _int(m: Any, *names: str) -> int | None:
    for n in names:
        v = getattr(m, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _gated_deltanet(m: Any) -> State | None:
    conv = _conv(m)
    dk, dv = _int(m, "head_k_dim"), _int(m, "head_v_dim")
    hk, hv = _int(m, "num_k_heads"), _int(m, "num_v_heads")
    if conv is None or None in (dk, dv, hk, hv) or conv[0] != 2 * hk * dk + hv * dv:  # type: ignore[operator]
        return None
    return State("gated_deltanet", (("d_conv", conv[1]), ("k_dim", dk), ("k_heads", hk), ("v_dim", dv),
                                    ("v_heads", hv)))


def _kimi_delta(m: Any) -> State | None:
    conv, heads, hd, qkv = _conv(m), _int(m, "num_heads"), _int(m, "head_dim"), _int(m, "qkv_dim")
    if conv is None or None in (heads, hd, qkv) or qkv != heads * hd or conv[0] != 3 * qkv:  # type: ignore[operator]
        return None
    return State("kimi_delta", (("d_conv", conv[1]), ("k_dim", hd), ("k_heads", heads), ("v_dim", hd),
                                ("v_heads", heads)))


def _lightning(m: Any) -> State | None:
    heads, hd = _int(m, "num_attention_heads"), _int(m, "head_dim")
    if None in (heads, hd) or _int(m, "block_size") is None or not hasattr(m, "qkv_proj") or _conv(m):
        return None
    return State("lightning", (("head_dim", hd), ("heads", heads)))


def _short_conv(m: Any) -> State | None:
    conv = _conv(m, "conv")
    if conv is None or _int(m, "conv_kernel_size") != conv[1] or hasattr(m, "A_log"):
        return None
    return State("short_conv", (("channels", conv[0]), ("d_conv", conv[1])))


def _rg_lru(m: Any) -> State | None:
    conv, lru = _conv(m, "conv_1d"), getattr(m, "rg_lru", None)
    rec = getattr(lru, "recurrent_param", None)
    if conv is None or rec is None or rec.dim() != 1 or int(rec.shape[0]) != conv[0]:
        return None
    return State("rg_lru", (("d_conv", conv[1]), ("width", conv[0])))


def _mamba(m: Any) -> State | None:
    conv, a = _conv(m), getattr(m, "A_log", None)
    if conv is None or a is None:
        return None
    if a.dim() >= 2 and a.shape[:-1].numel() == conv[0]:
        return State("mamba1", (("d_conv", conv[1]), ("d_inner", conv[0]), ("d_state", int(a.shape[-1]))))
    ds, hd = _int(m, "ssm_state_size"), _int(m, "head_dim")
    if a.dim() != 1 or ds is None or hd is None:
        return None
    heads = int(a.shape[0])
    groups, rest = divmod(conv[0] - heads * hd, 2 * ds)
    if rest or groups <= 0:
        return None
    return State("mamba2", (("d_conv", conv[1]), ("d_state", ds), ("groups", groups), ("head_dim", hd),
                            ("heads", heads)))


_RECOGNISERS: tuple[Callable[[Any], State | None], ...] = (_gated_deltanet, _mamba, _kimi_delta, _lightning,
                                                          _short_conv, _rg_lru)


def _build(tc: Any) -> Any:
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with quiet_transformers(), no_init_weights(), torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(tc)
        except ValueError:  # the text config has no causal-LM class of its own
            return AutoModel.from_config(tc)


def _decoder_layers(model: Any, n: int) -> Any:
    import torch

    stacks = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    if not stacks:
        raise UnsupportedModelError(f"no module list of {n} decoder layers in {type(model).__name__}")
    return stacks[0]


def _depthwise_convs(layer: Any) -> State | None:
    import torch

    convs = [m for m in layer.modules() if isinstance(m, torch.nn.Conv1d)]
    kernels = {int(m.kernel_size[0]) for m in convs}
    if not convs or len(kernels) != 1 or any(not m.groups == m.in_channels == m.out_channels for m in convs):
        return None  # a grouped (not depthwise) conv keeps a state this rule cannot size
    return State("short_conv", (("channels", sum(int(m.in_channels) for m in convs)), ("d_conv", kernels.pop())))


def _attention_dims(layer: Any) -> tuple[int, int] | None:
    for m in layer.modules():
        hd = _int(m, "head_dim")
        if hd is None:
            continue
        kv = _int(m, "num_key_value_heads")
        k_proj = getattr(m, "k_proj", None)
        if kv is None and getattr(k_proj, "out_features", 0) and k_proj.out_features % hd == 0:
            kv = k_proj.out_features // hd
        if kv:
            return kv, hd
    return None


def probe_attention(tc: Any, layer_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(K/V heads, head_dim) of the attention module of each layer in ``layer_ids`` where one is found."""
    stack = _decoder_layers(_built(tc), tc.num_hidden_layers)
    return {i: dims for i in layer_ids if (dims := _attention_dims(stack[i])) is not None}


_CACHE: dict[int, Any] = {}


def _built(tc: Any) -> Any:
    """The meta-device model of ``tc``, built once per config object (states and attention share it)."""
    key = id(tc)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = (tc, _build(tc))  # keep tc alive so its id is not reused
    return _CACHE[key][1]


def probe_states(tc: Any, layer_ids: list[int], where: str) -> dict[int, State]:
    """The mixer state of each layer in ``layer_ids`` (layers transformers caches a linear-attention state for)."""
    try:
        model = _built(tc)
    except Exception as e:  # noqa: BLE001 - any failure to build is a fact we cannot read
        raise UnsupportedModelError(f"{where}: building the model on the meta device to read its state sizes "
                                    f"failed: {type(e).__name__}: {e}") from e
    stack = _decoder_layers(model, tc.num_hidden_layers)
    out: dict[int, State] = {}
    for i in layer_ids:
        found = {s for _, sub in stack[i].named_modules() for rec in _RECOGNISERS if (s := rec(sub))}
        if not found and (convs := _depthwise_convs(stack[i])) is not None:
            found = {convs}
        if len(found) != 1:
            what = "without a recognisable mixer" if not found else f"with {len(found)} different mixers"
            raise UnsupportedModelError(f"{where}: layer {i}: state layer {what} "
                                        f"({type(stack[i]).__name__})")
        out[i] = found.pop()
    return out
