"""Hugging Face ``config.json`` -> :class:`~jenga.specs.ModelSpec` (layer groups).

Contract of :func:`model_spec_from_hf_config`:

* The source is a catalog name (``jenga/catalog/<name>.json``, see :data:`CATALOG_NAMES`), a local
  directory holding ``config.json``, a path to a json file, or a dict.  Dicts and files are parsed by
  transformers' own config classes (``AutoConfig.for_model`` / ``AutoConfig.from_pretrained`` with
  ``local_files_only=True``), so defaults and derived fields (``layer_types``, Llama 4 ``no_rope_layers``,
  Nemotron-H ``hybrid_override_pattern`` ...) are exactly what transformers reads.  Nothing touches the hub.
* Every decoder layer is mapped to zero, one or two cache specs (Falcon-H1 layers keep attention KV *and*
  a Mamba-2 state; Nemotron-H MLP/MoE layers keep nothing).  ``layer_types`` is authoritative when present;
  otherwise the family rule of ``models.md`` applies (Mistral: every layer sliding when ``sliding_window``).
* Layers with equal specs (kind + parameters, hence equal page size) form one :class:`LayerGroup`, named by
  kind: ``full``, ``sliding``, ``chunked``, ``cross``, ``mamba`` (Mamba-1, Mamba-2 and Gated DeltaNet
  states alike), ``vision``; ``mamba.conv`` / ``mamba.ssm`` when ``split_mamba_state=True``.  When several
  groups share a kind a parameter suffix is added (``sliding_1024``, ``chunked_8192``, ``full_8x128``).
* Gemma-3 (multimodal ``gemma3`` configs) gets one extra ``vision`` group caching the projected image
  embeddings (``hidden_size`` of the text model per image token).  It is not a decoder layer: its single
  layer index is ``num_layers`` (one past the last decoder layer).  Pass ``vision=False`` to leave it out.
* Tensor parallelism ``tp`` gives the per-rank shapes: KV heads are divided (replicated to one per rank
  when ``H_kv < tp``), Mamba heads / inner widths are divided, Mamba-2 groups are divided or replicated.
  Vision embeddings are replicated.  An indivisible size raises ``ValueError``.
* Mamba conv states use ``dtype``; SSM states use ``mamba_ssm_dtype`` when given, else ``dtype``.  Dtype
  fields in the config itself (e.g. Nemotron-H's ``mamba_ssm_cache_dtype``) are deliberately ignored so
  the cache dtype is the caller's choice.
* ``max_model_len`` = text ``max_position_embeddings``; ``num_layers`` = decoder layers; ``hf_config`` =
  the raw dict as read (before transformers' defaults).

Catalog values come from ``shared/reference/models.md``; fields marked "unverified" there (e.g. the
Falcon-H1-7B sizes, Llama-3.2-90B-Vision) are best-known values, not checked against a real config.json.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError

from jenga.errors import JengaError
from jenga.specs import (
    CacheSpec,
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
    dtype_bytes,
)

__all__ = [
    "CATALOG_NAMES",
    "SUPPORTED_MODEL_TYPES",
    "UnsupportedModelError",
    "list_catalog",
    "load_hf_config",
    "model_spec_from_hf_config",
]

#: Top-level ``model_type`` values this module understands.
SUPPORTED_MODEL_TYPES: tuple[str, ...] = (
    "falcon_h1", "gemma2", "gemma3", "gemma3_text", "gpt_oss", "jamba", "llama", "llama4", "llama4_text",
    "ministral", "mistral", "mllama", "nemotron_h", "qwen3_next",
)

_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                  "float": "fp32", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


def _catalog_dir():
    return resources.files("jenga").joinpath("catalog")


def list_catalog() -> list[str]:
    """Sorted names of the bundled model configs (``jenga/catalog/<name>.json``)."""
    return sorted(p.name[:-len(".json")] for p in _catalog_dir().iterdir() if p.name.endswith(".json"))


#: Names accepted by :func:`model_spec_from_hf_config` besides paths and dicts.
CATALOG_NAMES: tuple[str, ...] = tuple(list_catalog())


class UnsupportedModelError(JengaError, ValueError):
    """The config's architecture (or the named model) is not one jenga can map to cache groups."""

    def __init__(self, what: str):
        super().__init__(f"{what}. Supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}. "
                         f"Catalog names: {', '.join(CATALOG_NAMES)}.")


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' advisory warnings (e.g. Mistral + ``layer_types``) while parsing."""
    log = logging.getLogger("transformers")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(old)


#: What transformers raises on a malformed config (strict-dataclass errors are not ValueErrors).
_PARSE_ERRORS = (TypeError, ValueError, StrictDataclassError)


def _check_type(raw: Mapping[str, Any], where: str) -> str:
    mt = raw.get("model_type")
    if not mt:
        raise UnsupportedModelError(f"{where}: config has no 'model_type'")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(f"{where}: model_type {mt!r} is not supported")
    return mt


def _config_from_dict(raw: Mapping[str, Any], where: str):
    from transformers import AutoConfig

    mt = _check_type(raw, where)
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        with _quiet_transformers():
            return AutoConfig.for_model(mt, **kwargs)
    except _PARSE_ERRORS as e:
        raise ValueError(f"{where}: transformers rejected the {mt!r} config: {e}") from e


def load_hf_config(source: str | os.PathLike | Mapping[str, Any]) -> tuple[dict, Any, str]:
    """Resolve ``source`` to ``(raw dict, transformers config, default model name)``.

    Raises ``UnsupportedModelError`` for an unknown name or architecture, ``FileNotFoundError`` for a
    directory without ``config.json``, ``TypeError`` for other source types.
    """
    if isinstance(source, Mapping):
        raw = dict(source)
        name = str(raw.get("_name_or_path") or raw.get("model_type") or "model").rstrip("/").split("/")[-1]
        return raw, _config_from_dict(raw, "config dict"), name
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"expected a catalog name, path or dict, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{path} has no config.json")
        raw = json.loads(cfg_file.read_text())
        _check_type(raw, str(cfg_file))
        from transformers import AutoConfig

        try:
            with _quiet_transformers():
                cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except _PARSE_ERRORS as e:
            raise ValueError(f"{cfg_file}: transformers rejected the config: {e}") from e
        return raw, cfg, path.resolve().name
    if path.is_file():
        raw = json.loads(path.read_text())
        name = path.resolve().parent.name if path.stem == "config" else path.stem
        return raw, _config_from_dict(raw, str(path)), name
    if str(source) in CATALOG_NAMES:
        raw = json.loads(_catalog_dir().joinpath(f"{source}.json").read_text())
        return raw, _config_from_dict(raw, f"catalog {source!r}"), str(source)
    raise UnsupportedModelError(f"{str(source)!r} is neither a catalog name nor an existing path")


def _norm_dtype(dtype: Any) -> str:
    s = str(dtype).removeprefix("torch.")
    s = _DTYPE_ALIASES.get(s, s)
    dtype_bytes(s)  # raises ValueError naming the choices
    return s


def _div(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise ValueError(f"{what} = {n} is not divisible by tp = {tp}")
    return n // tp


def _split_or_replicate(n: int, tp: int, what: str) -> int:
    """Per-rank count of heads/groups: divided when possible, one replicated copy when ``n`` divides tp."""
    if n % tp == 0:
        return n // tp
    if tp % n == 0:
        return 1
    raise ValueError(f"{what} = {n} can be neither split nor replicated across tp = {tp}")


class _Builder:
    """Maps one text config to ``(layer, base group name, spec)`` entries."""

    def __init__(self, tc: Any, name: str, dtype: str, ssm_dtype: str, tp: int, ckpt: int, split: bool):
        self.tc, self.name, self.dtype, self.ssm_dtype = tc, name, dtype, ssm_dtype
        self.tp, self.ckpt, self.split = tp, ckpt, split

    # -- attention -------------------------------------------------------------------------------
    def _attn_dims(self) -> dict[str, Any]:
        tc = self.tc
        heads = tc.num_attention_heads
        head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
        kv = getattr(tc, "num_key_value_heads", None) or heads
        return dict(model=self.name, dtype=self.dtype, head_dim=head_dim,
                    num_kv_heads=_split_or_replicate(kv, self.tp, "num_key_value_heads"))

    def attention(self, layer_type: str) -> list[tuple[str, CacheSpec]]:
        dims = self._attn_dims()
        window = getattr(self.tc, "sliding_window", None)
        chunk = getattr(self.tc, "attention_chunk_size", None)
        if layer_type == "sliding_attention" and window:
            return [("sliding", SlidingWindowSpec(window=int(window), **dims))]
        if layer_type == "chunked_attention" and chunk:
            return [("chunked", ChunkedLocalSpec(chunk=int(chunk), **dims))]
        if layer_type == "cross_attention":
            return [("cross", CrossAttentionSpec(**dims))]
        # full_attention, or a sliding/chunked type whose window/chunk is unset (= global attention)
        return [("full", FullAttentionSpec(**dims))]

    # -- recurrent state ---------------------------------------------------------------------------
    def _state(self, conv: tuple[int, ...], ssm: tuple[int, ...]) -> list[tuple[str, CacheSpec]]:
        common = dict(model=self.name, dtype=self.dtype, checkpoint_interval=self.ckpt)
        if self.split:
            return [("mamba.conv", MambaSpec(shapes=(conv,), dtypes=(self.dtype,), **common)),
                    ("mamba.ssm", MambaSpec(shapes=(ssm,), dtypes=(self.ssm_dtype,), **common))]
        return [("mamba", MambaSpec(shapes=(conv, ssm), dtypes=(self.dtype, self.ssm_dtype), **common))]

    def mamba1(self) -> list[tuple[str, CacheSpec]]:
        """Jamba: conv ``d_inner x (d_conv-1)``, SSM ``d_inner x d_state``."""
        tc = self.tc
        d_inner = _div(tc.mamba_expand * tc.hidden_size, self.tp, "mamba d_inner")
        return self._state((d_inner, tc.mamba_d_conv - 1), (d_inner, tc.mamba_d_state))

    def mamba2(self, heads: int, head_dim: int, groups: int, d_state: int, d_conv: int):
        """Conv ``(d_inner + 2 n_groups d_state) x (d_conv-1)``, SSM ``heads x head_dim x d_state``."""
        h = _div(heads, self.tp, "mamba heads")
        g = _split_or_replicate(groups, self.tp, "mamba n_groups")
        return self._state((h * head_dim + 2 * g * d_state, d_conv - 1), (h, head_dim, d_state))

    def nemotron_h(self):
        tc = self.tc
        return self.mamba2(tc.mamba_num_heads, tc.mamba_head_dim, tc.n_groups, tc.ssm_state_size,
                           tc.conv_kernel)

    def falcon_h1(self):
        tc = self.tc
        return self.mamba2(tc.mamba_n_heads, tc.mamba_d_head, tc.mamba_n_groups, tc.mamba_d_state,
                           tc.mamba_d_conv)

    def gated_deltanet(self):
        """Qwen3-Next: conv ``(2 H_k d_k + H_v d_v) x (K-1)``, SSM ``H_v x d_k x d_v``."""
        tc = self.tc
        hk = _div(tc.linear_num_key_heads, self.tp, "linear_num_key_heads")
        hv = _div(tc.linear_num_value_heads, self.tp, "linear_num_value_heads")
        dk, dv = tc.linear_key_head_dim, tc.linear_value_head_dim
        return self._state((2 * hk * dk + hv * dv, tc.linear_conv_kernel_dim - 1), (hv, dk, dv))


#: Text model_type -> builder method for ``linear_attention`` layers.
_LINEAR: dict[str, Callable[[_Builder], list[tuple[str, CacheSpec]]]] = {
    "jamba": _Builder.mamba1, "nemotron_h": _Builder.nemotron_h, "qwen3_next": _Builder.gated_deltanet,
}


def _layer_types(tc: Any) -> list[str]:
    """Per-layer type strings, from ``layer_types`` when present, else the family rule."""
    n = tc.num_hidden_layers
    mt = tc.model_type
    if mt == "mllama_text_model":
        cross = set(tc.cross_attention_layers)
        return ["cross_attention" if i in cross else "full_attention" for i in range(n)]
    if mt == "falcon_h1":
        return ["hybrid"] * n
    types = getattr(tc, "layer_types", None)
    if types is None:
        sliding = mt in ("mistral", "ministral") and getattr(tc, "sliding_window", None)
        types = ["sliding_attention" if sliding else "full_attention"] * n
    types = list(types)
    if len(types) != n:
        raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers = {n}")
    return types


def _entries(tc: Any, b: _Builder) -> list[tuple[int, str, CacheSpec]]:
    out: list[tuple[int, str, CacheSpec]] = []
    for i, lt in enumerate(_layer_types(tc)):
        if lt in ("full_attention", "sliding_attention", "chunked_attention", "cross_attention"):
            specs = b.attention(lt)
        elif lt == "hybrid":  # Falcon-H1: attention and Mamba-2 side by side in every layer
            specs = b.attention("full_attention") + b.falcon_h1()
        elif lt == "linear_attention" and tc.model_type in _LINEAR:
            specs = _LINEAR[tc.model_type](b)
        elif lt in ("mlp", "moe"):
            specs = []
        else:
            raise UnsupportedModelError(f"layer {i}: layer type {lt!r} is not supported for {tc.model_type!r}")
        out.extend((i, base, spec) for base, spec in specs)
    return out


def _suffix(spec: CacheSpec) -> str:
    if isinstance(spec, SlidingWindowSpec):
        return str(spec.window)
    if isinstance(spec, ChunkedLocalSpec):
        return str(spec.chunk)
    if isinstance(spec, MambaSpec):
        return str(spec.state_bytes())
    if isinstance(spec, VisionEmbeddingSpec):
        return str(spec.hidden_size)
    return f"{spec.num_kv_heads}x{spec.head_dim}"  # type: ignore[attr-defined]


def _group(entries: list[tuple[int, str, CacheSpec]], tokens_per_page: int) -> tuple[LayerGroup, ...]:
    """One group per distinct spec, in order of first appearance; names from kinds (+ suffixes)."""
    by_spec: dict[CacheSpec, tuple[str, list[int]]] = {}
    for layer, base, spec in entries:
        by_spec.setdefault(spec, (base, []))[1].append(layer)
    bases = [base for base, _ in by_spec.values()]
    names: list[str] = []
    for spec, (base, _) in by_spec.items():
        name = base if bases.count(base) == 1 else f"{base}_{_suffix(spec)}"
        names.append(name if name not in names else f"{name}_{len(names)}")
    return tuple(LayerGroup(name, spec, tuple(layers), tokens_per_page)
                 for name, (spec, (_, layers)) in zip(names, by_spec.items(), strict=True))


def model_spec_from_hf_config(source: str | os.PathLike | Mapping[str, Any], *, dtype: str = "bf16",
                              tokens_per_page: int = 16, mamba_checkpoint_interval: int = 512, tp: int = 1,
                              name: str | None = None, mamba_ssm_dtype: str | None = None,
                              split_mamba_state: bool = False, vision: bool = True) -> ModelSpec:
    """Build the layer-group :class:`ModelSpec` of a Hugging Face model config (see module docstring).

    ``source``: catalog name, directory with ``config.json``, json file path, or config dict.
    ``dtype``: KV / embedding / conv-state dtype (``bf16``, ``fp16``, ``fp32``, ``fp8``, or torch names).
    ``mamba_ssm_dtype``: SSM-state dtype (default ``dtype``).  ``split_mamba_state``: conv and SSM states
    as separate groups (the paper's Jamba 84x example).  ``vision``: add Gemma-3's vision-embedding group.
    Raises ``UnsupportedModelError`` (a ``ValueError``) for unknown names/architectures and ``ValueError``
    for bad arguments (non-positive sizes, sizes not divisible by ``tp``).
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive int, got {tp!r}")
    if not isinstance(tokens_per_page, int) or tokens_per_page < 1:
        raise ValueError(f"tokens_per_page must be a positive int, got {tokens_per_page!r}")
    dtype = _norm_dtype(dtype)
    ssm_dtype = _norm_dtype(mamba_ssm_dtype) if mamba_ssm_dtype is not None else dtype
    raw, cfg, default_name = load_hf_config(source)
    model_name = name or default_name
    tc = cfg.get_text_config()
    b = _Builder(tc, model_name, dtype, ssm_dtype, tp, mamba_checkpoint_interval, split_mamba_state)
    entries = _entries(tc, b)
    n_layers = int(tc.num_hidden_layers)
    if vision and cfg.model_type == "gemma3":
        entries.append((n_layers, "vision",
                        VisionEmbeddingSpec(model=model_name, dtype=dtype, hidden_size=tc.hidden_size)))
    if not entries:
        raise UnsupportedModelError(f"{model_name}: no layer keeps a cache")
    return ModelSpec(model_name, _group(entries, tokens_per_page),
                     max_model_len=int(tc.max_position_embeddings), num_layers=n_layers, hf_config=raw)
