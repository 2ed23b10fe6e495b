"""Real model layouts inside vLLM's own scheduler, without a GPU or weights (``vs_vllm_sched.py``).

A catalog model (``jenga.core.specs.ModelSpec``: layer kinds, KV heads, head size, Mamba state
shapes) becomes vLLM's per-layer KV specs, planned by vLLM's own planner
(``jenga.vllm.compat.kv_cache_configs``: ``kv_cache_utils`` on 0.32, ``kv_cache_planning`` on
0.33+) for a byte budget, and both schedulers are built on it: vLLM's ``Scheduler`` with its own
``KVCacheManager``, and ``JengaScheduler`` on the config jenga's plugin rewrites in the engine
core (``jenga.vllm.plan.rewrite_config``).

vLLM's engine config comes from a stand-in folder holding only a tiny Llama ``config.json`` (the
scheduler reads no weight; the KV specs are the real model's, made here).  A hybrid's attention
block follows vLLM's ``Platform._align_hybrid_block_size``: the smallest multiple of the
attention kernel's block (16 on an H100's FlashAttention) whose attention page (one layer, one
token's K and V times the block) holds a Mamba state; the Mamba page is padded to it and
``mamba_cache_mode="align"`` (vLLM's mode with prefix caching), ``mamba_block_size`` = block.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

#: the attention kernel's block alignment on the target GPU (FlashAttention: multiples of 16)
KERNEL_BLOCK = 16


@dataclass(frozen=True)
class VllmSettings:
    """One point of vLLM's settings sweep."""

    retention: int | None = 0  # prefix_cache_retention_interval (None: dense)
    match_unit: int | None = None  # prefix_match_unit (hybrids: finer than the inflated block)
    admission_window: int = 0  # cache_aware_admission_window (0.34; 0: FCFS)
    admission_threshold: float = 0.0

    def name(self) -> str:
        parts = ["dense" if self.retention is None else f"retention {self.retention}"]
        if self.match_unit:
            parts.append(f"match unit {self.match_unit}")
        if self.admission_window:
            parts.append(f"cache-aware {self.admission_window}/{self.admission_threshold:g}")
        return ", ".join(parts)


def _dtypes():
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _attn_spec(kvi, s, block: int):
    kw = dict(block_size=block, num_kv_heads=s.num_kv_heads, head_size=s.head_dim, dtype=_dtypes()[s.dtype])
    if s.kind == "sliding":
        return kvi.SlidingWindowSpec(sliding_window=s.window, **kw)
    if s.kind == "chunked":
        return kvi.ChunkedLocalAttentionSpec(attention_chunk_size=s.chunk, **kw)
    if s.kind != "full":
        raise SystemExit(f"vllm_layouts: no vLLM spec mapping for {s.kind!r} layers")
    return kvi.FullAttentionSpec(**kw)


def hybrid_block(model, block: int = 16) -> int:
    """vLLM's attention block for ``model`` (``block`` when it has no Mamba state; module doc)."""
    from vllm.v1 import kv_cache_interface as kvi
    states = [g.spec for g in model.groups if g.kind == "mamba"]
    if not states:
        return block
    dt = _dtypes()
    page = max(kvi.MambaSpec(block_size=-1, shapes=tuple(s.shapes), dtypes=tuple(dt[d] for d in s.dtypes))
               .page_size_bytes for s in states)
    per_tok = max(_attn_spec(kvi, g.spec, 1).page_size_bytes for g in model.groups if g.kind != "mamba")
    align = max(KERNEL_BLOCK, block)
    return max(block, align * math.ceil(page / (align * per_tok)))


def layer_specs(model, caching: bool = True) -> tuple[dict, int]:
    """vLLM's per-layer specs of ``model`` (names ``model.layers.{i}...``) and the block size."""
    from vllm.v1 import kv_cache_interface as kvi
    block = hybrid_block(model)
    dt = _dtypes()
    per_tok = max(_attn_spec(kvi, g.spec, 1).page_size_bytes for g in model.groups if g.kind != "mamba")
    specs = {}
    for g in model.groups:
        for i in g.layers:
            s = g.spec
            if g.kind == "mamba":
                ms = kvi.MambaSpec(block_size=block, shapes=tuple(s.shapes), dtypes=tuple(dt[d] for d in s.dtypes),
                                   mamba_cache_mode="align" if caching else "none")
                if ms.page_size_bytes != block * per_tok:
                    ms = kvi.MambaSpec(block_size=block, shapes=ms.shapes, dtypes=ms.dtypes,
                                       mamba_cache_mode=ms.mamba_cache_mode, page_size_padded=block * per_tok)
                specs[f"model.layers.{i}.mixer"] = ms
            else:
                specs[f"model.layers.{i}.self_attn.attn"] = _attn_spec(kvi, s, block)
    return dict(sorted(specs.items(), key=lambda kv: int(kv[0].split(".")[2]))), block


_BASE: dict[int, object] = {}


def base_config(max_model_len: int):
    """vLLM's engine config of the stand-in folder (made once per process: ~20 s of imports)."""
    if max_model_len in _BASE:
        return _BASE[max_model_len]
    import vllm.triton_utils
    from vllm.engine.arg_utils import EngineArgs

    from jenga.vllm.compat import MINOR
    folder = Path(tempfile.mkdtemp(prefix="jenga-vllm-layout-"))
    (folder / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32000, hidden_size=128,
        intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_hidden_layers=2,
        max_position_embeddings=max_model_len, torch_dtype="bfloat16")))
    with contextlib.ExitStack() as stack:
        if MINOR >= (0, 34):  # 0.34's CPU platform wants triton-cpu for its kernels; none runs here
            stack.enter_context(mock.patch.object(vllm.triton_utils, "HAS_TRITON", True))
        cfg = EngineArgs(model=str(folder), skip_tokenizer_init=True, max_model_len=max_model_len,
                         enable_prefix_caching=True, block_size=16, enforce_eager=True).create_engine_config()
    cfg.scheduler_config.async_scheduling = False
    _BASE[max_model_len] = cfg
    return cfg


def engine_config(model, settings: VllmSettings, *, max_model_len: int, batched_tokens: int, max_seqs: int):
    """A fresh vLLM config for ``model`` with ``settings`` and the server limits; returns
    (config, per-layer specs)."""
    from jenga.vllm.compat import MINOR
    specs, block = layer_specs(model)
    cfg = copy.deepcopy(base_config(max_model_len))
    cc, sc = cfg.cache_config, cfg.scheduler_config
    cc.block_size = block
    cc.prefix_cache_retention_interval = settings.retention
    cc.prefix_match_unit = settings.match_unit
    if hasattr(cc, "enable_mamba_shared_prefix_checkpoint"):
        cc.enable_mamba_shared_prefix_checkpoint = settings.match_unit is not None
    if any(g.kind == "mamba" for g in model.groups):
        cc.mamba_cache_mode, cc.mamba_block_size = "align", block
    sc.max_num_batched_tokens, sc.max_num_seqs = batched_tokens, max_seqs
    if hasattr(sc, "max_num_scheduled_tokens"):
        sc.max_num_scheduled_tokens = batched_tokens
    if MINOR >= (0, 34):
        sc.cache_aware_admission_window = settings.admission_window
        sc.cache_aware_admission_threshold = settings.admission_threshold
    elif settings.admission_window:
        raise SystemExit("vllm_layouts: cache-aware admission needs vLLM 0.34")
    return cfg, specs


#: how vLLM's planner starts its refusal of a budget that cannot hold one ``max_model_len`` request
#: (``_check_enough_kv_cache_memory``, a ``ValueError``; the same words in 0.32-0.34): the engine
#: would not start
TOO_SMALL = ("To serve at least one request with the model's max seq len", "No available memory for the cache blocks")


class BudgetRefused(ValueError):
    """vLLM refuses to start on this budget (``TOO_SMALL``); ``reason``: its message's first
    sentence, and its estimate of the longest ``max_model_len`` that fits where it gives one."""

    def __init__(self, message: str):
        first = message.split(". ")[0]
        est = re.search(r"the estimated maximum model length is \d+", message)
        self.reason = first + (f"; {est.group(0)}" if est else "")
        super().__init__(message)


def planned(cfg, specs: dict, memory: int):
    """vLLM's own KV-cache config for ``specs`` in ``memory`` bytes (its planner, its grouping);
    ``BudgetRefused`` where the planner refuses the budget."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

    from jenga.vllm.compat import kv_cache_configs
    resolve_kv_cache_layout(cfg, [["LBNHC"]], specs.values())
    try:
        kv = kv_cache_configs(cfg, [specs], [memory])[0]
    except ValueError as e:
        if not str(e).startswith(TOO_SMALL):
            raise
        raise BudgetRefused(str(e)) from e
    cfg.cache_config.num_gpu_blocks = kv.num_blocks
    return kv


def scheduler(side: str, model, settings: VllmSettings, memory: int, **limits):
    """vLLM's ``Scheduler`` (``side="vllm"``) or ``JengaScheduler`` (``"jenga"``) for ``model`` in
    ``memory`` bytes; returns (scheduler, hash block size)."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cfg, specs = engine_config(model, settings, **limits)
    kv = planned(cfg, specs, memory)
    cls = Scheduler
    if side == "jenga":
        from jenga.vllm import JengaScheduler
        from jenga.vllm.plan import rewrite_config
        kv = rewrite_config(kv, cfg.model_config.max_model_len, settings.match_unit)
        cls = JengaScheduler
    block, hash_block = resolve_kv_cache_block_sizes(kv, cfg)
    sched = cls(vllm_config=cfg, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(cfg),
                block_size=block, hash_block_size=hash_block)
    return sched, hash_block
