"""How jenga's pages map onto vLLM's KV-cache buffer: the two layouts.

* ``pages`` (default): jenga's page-layer layout.  Layers are grouped by jenga (one group
  per cache kind and shape, whatever vLLM's own grouping was), each group gets its own
  page size, and every group's pages are carved from the same LCM large pages of vLLM's
  one buffer.  :func:`rewrite_config` turns vLLM's ``KVCacheConfig`` into that layout:
  one ``KVCacheTensor`` per group over the whole buffer with ``block_stride = u`` (the
  gcd of the groups' page sizes, the exec-id unit) and ``layer_stride`` = the group's
  per-layer page, so page ``p`` of group ``g`` is exec block ``p * P_g / u`` and the
  workers' ``as_strided`` views address it with no change to worker or kernel code.
  ``num_blocks`` is the number of units the large pages cover, so every view stays
  inside the buffer (jenga's slack large page is the headroom).
* ``uniform`` (``JENGA_VLLM_LAYOUT=uniform``): vLLM's own groups and layout; jenga
  decides blocks, hits and eviction only (page ``p`` is vLLM block ``p + 1``; block 0 is
  vLLM's null block).

Either way jenga's budget is the bytes vLLM gave its KV cache.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import reduce

from vllm.v1 import kv_cache_interface as kvi

from jenga.errors import InvalidArgumentError
from jenga.pagesize import fit_page_sizes, with_base_page
from jenga.specs import ModelSpec
from jenga.vllm.specs import UnsupportedInVllm, model_of_groups

LAYOUT_ENV = "JENGA_VLLM_LAYOUT"
LAYOUTS = ("pages", "uniform")
MAX_LCM_RATIO = 8.0


def layout_name() -> str:
    """The layout ``JENGA_VLLM_LAYOUT`` asks for (default ``pages``)."""
    name = os.environ.get(LAYOUT_ENV, "pages") or "pages"
    if name not in LAYOUTS:
        raise InvalidArgumentError(f"{LAYOUT_ENV}={name!r}; choose one of {', '.join(LAYOUTS)}")
    return name


@dataclass(frozen=True)
class VllmPlan:
    """What the scheduler's manager needs: the model, the budget, and exec block ids.

    Exec id of page ``p`` of group ``g``: ``p * exec_scale[g] + exec_offset``.
    """

    layout: str
    model: ModelSpec  # before page fitting (the manager fits it the same way)
    memory_bytes: int
    tokens_per_page: int
    fit_pages: bool
    exec_scale: tuple[int, ...]
    exec_offset: int


def _buffer_bytes(cfg) -> int:
    sizes = {t.size for t in cfg.kv_cache_tensors}
    if len(sizes) != 1:
        raise UnsupportedInVllm(f"jenga.vllm: KV-cache tensors of several sizes {sorted(sizes)}")
    return sizes.pop()


def _layer_specs(cfg) -> list[tuple[str, object]]:
    out = []
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        for name in group.layer_names:
            s = spec.kv_cache_specs[name] if isinstance(spec, kvi.UniformTypeKVCacheSpecs) else spec
            out.append((name, s))
    return out


def uniform_plan(cfg, max_model_len: int) -> VllmPlan:
    """vLLM's groups as they are; each jenga page is one vLLM block (padded to its bytes)."""
    raw = _buffer_bytes(cfg)
    block_bytes = raw // cfg.num_blocks
    groups = []
    for g in cfg.kv_cache_groups:
        spec = g.kv_cache_spec
        if isinstance(spec, kvi.UniformTypeKVCacheSpecs):
            spec = next(iter(spec.kv_cache_specs.values()))
        groups.append((g.layer_names, spec))
    model = model_of_groups(groups, name="vllm", max_model_len=max_model_len)
    padded = []
    for g in model.groups:
        pad = block_bytes - g.useful_page_bytes
        if pad < 0 or pad % g.num_layers:
            raise UnsupportedInVllm(f"jenga.vllm uniform layout: group {g.name} pages of {g.useful_page_bytes} B "
                                    f"do not fill vLLM's {block_bytes} B blocks evenly")
        padded.append(dataclasses.replace(g, pad_bytes=pad))
    model = dataclasses.replace(model, groups=tuple(padded))
    tpp = model.groups[0].tokens_per_page
    if any(g.tokens_per_page != tpp for g in model.groups):
        raise UnsupportedInVllm("jenga.vllm uniform layout: vLLM groups with different block sizes")
    return VllmPlan("uniform", model, cfg.num_blocks * block_bytes, tpp, False,
                    (1,) * len(model.groups), 1)


def _normalized(spec, block_size: int):
    return dataclasses.replace(spec, block_size=block_size, page_size_padded=None)


def page_layer_plan(cfg, max_model_len: int) -> tuple[VllmPlan, object]:
    """jenga's grouping and page sizes over vLLM's buffer: the plan and the rewritten config."""
    raw = _buffer_bytes(cfg)
    layers = _layer_specs(cfg)
    base = min(s.block_size for _, s in layers)
    by_spec: dict[object, list[str]] = {}
    for name, s in layers:
        by_spec.setdefault(_normalized(s, base), []).append(name)
    groups = [(names, spec) for spec, names in by_spec.items()]
    model = model_of_groups(groups, name="vllm", max_model_len=max_model_len)
    fitted = fit_page_sizes(with_base_page(model, base), max_ratio=MAX_LCM_RATIO).model
    S = fitted.lcm_page_bytes
    num_large = raw // S - 1
    if num_large < 1:
        raise UnsupportedInVllm(f"jenga.vllm: vLLM's KV budget of {raw} B holds no large page of {S} B plus a "
                                "slack page; give the KV cache more memory")
    unit = reduce(math.gcd, (g.page_bytes for g in fitted.groups))
    new_groups, tensors = [], []
    for (names, spec), g in zip(groups, fitted.groups, strict=True):
        new_groups.append(kvi.KVCacheGroupSpec(names, _normalized(spec, g.tokens_per_page)))
        tensors.append(kvi.KVCacheTensor(size=raw, layers=list(names), layer_stride=g.layer_page_bytes,
                                         block_stride=unit, offset=0))
    new_cfg = dataclasses.replace(cfg, num_blocks=num_large * S // unit, kv_cache_tensors=tensors,
                                  kv_cache_groups=new_groups)
    plan = VllmPlan("pages", model, raw, base, True, tuple(g.page_bytes // unit for g in fitted.groups), 0)
    return plan, new_cfg


def rewrite_config(cfg, max_model_len: int):
    """The config the workers and the scheduler get, with the plan attached as ``jenga_plan``."""
    if layout_name() == "uniform":
        plan = uniform_plan(cfg, max_model_len)
    else:
        plan, cfg = page_layer_plan(cfg, max_model_len)
    cfg.jenga_plan = plan
    return cfg
