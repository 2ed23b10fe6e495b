"""How jenga's pages map onto vLLM's KV-cache buffer: the two layouts.

* ``pages`` (default): jenga's page-layer layout.  Layers are grouped by jenga (one group
  per cache kind and shape, whatever vLLM's own grouping was), each group gets its own
  page size, and every group's pages are carved from the same LCM large pages of vLLM's
  one buffer.  :func:`rewrite_config` turns vLLM's ``KVCacheConfig`` into that layout:
  one ``KVCacheTensor`` per group over the whole buffer with ``block_stride = u`` (the
  gcd of the groups' page sizes, the exec-id unit) and ``layer_stride`` = the group's
  per-layer page, so page ``p`` of group ``g`` is exec block ``p * P_g / u`` and the
  workers' ``as_strided`` views address it with no change to worker or kernel code.
  ``num_blocks`` covers the highest exec id, so every view stays inside the buffer.  With
  state groups the pages start ``P_max`` bytes in (exec id ``p * P_g / u + P_max / u``):
  vLLM's null block 0, where state kernels write padded rows, then touches no page.
  A state group (Mamba, linear attention) is cut into groups of as many layers as the smallest
  token group has, as vLLM groups them (``state_groups``; ``JENGA_VLLM_STATE_GROUPS=whole`` keeps
  one group per state kind).
* ``uniform`` (``JENGA_VLLM_LAYOUT=uniform``): vLLM's own groups and layout; jenga
  decides blocks, hits and eviction only (page ``p`` is vLLM block ``p + 1``; block 0 is
  vLLM's null block).

Either way jenga's budget is the bytes vLLM gave its KV cache.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import reduce

from vllm.model_executor.models.utils import extract_layer_index
from vllm.v1 import kv_cache_interface as kvi

from jenga.core.pagesize import manager_page_plan, with_base_page
from jenga.core.specs import ModelSpec
from jenga.vllm.specs import UnsupportedInVllm, model_of_groups
from jenga.vllm.switches import switch

LAYOUT_ENV = "JENGA_VLLM_LAYOUT"
LAYOUTS = ("pages", "uniform")
STATE_GROUPS_ENV = "JENGA_VLLM_STATE_GROUPS"
STATE_GROUPS = ("split", "whole")
MAX_LCM_RATIO = 8.0


def layout_name() -> str:
    """The layout ``JENGA_VLLM_LAYOUT`` asks for (default ``pages``)."""
    return switch(LAYOUT_ENV, LAYOUTS, "pages")


def state_groups(groups: list[tuple[list[str], object]]) -> list[tuple[list[str], object]]:
    """``groups`` ((layer names, spec) per jenga group) with each state group cut into groups of
    ``n`` layers, ``n`` the smallest token group's layer count, where ``n`` divides it (vLLM's own
    grouping of a hybrid); ``JENGA_VLLM_STATE_GROUPS=whole`` (or no token group) leaves them whole.

    A state page holding every state layer of a request is a whole large page when the token pages
    are smaller (Qwen3-Next-80B: 36 linear-attention layers, a 38.25 MiB state page, attention pages
    of 12.75 MiB).  A new request then needs a large page free or wholly evictable, while evictable
    attention pages lie in large pages that running requests' pages also hold: at 4 % of four
    H100s' budget its RAG prompts waited with 10-28 such attention pages evictable and no whole
    large page (batch 38.4 against vLLM's 40.1, p99 TTFT 0.79 s against 0.57 s).  Cut as vLLM cuts
    it, every page of that model is one size: nothing is stranded (batch 40.4, p99 0.41 s)."""
    if switch(STATE_GROUPS_ENV, STATE_GROUPS, "split") == "whole":
        return groups
    sizes = [len(names) for names, spec in groups if not isinstance(spec, kvi.MambaSpec)]
    if not sizes:
        return groups
    n = min(sizes)
    out = []
    for names, spec in groups:
        if isinstance(spec, kvi.MambaSpec) and len(names) > n and len(names) % n == 0:
            out += [(names[i:i + n], spec) for i in range(0, len(names), n)]
        else:
            out.append((names, spec))
    return out


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
    tpp = min(s.block_size for _, s in groups)
    _check_state_blocks(groups, tpp)
    model = model_of_groups(groups, name="vllm", max_model_len=max_model_len,
                            checkpoint_interval=no_periodic_checkpoints(max_model_len, tpp))
    padded = []
    for g in model.groups:
        pad = block_bytes - g.useful_page_bytes
        if pad < 0 or pad % g.num_layers:
            raise UnsupportedInVllm(f"jenga.vllm uniform layout: group {g.name} pages of {g.useful_page_bytes} B "
                                    f"do not fill vLLM's {block_bytes} B blocks evenly")
        padded.append(dataclasses.replace(g, pad_bytes=pad))
    model = dataclasses.replace(model, groups=tuple(padded))
    if any(g.tokens_per_page != tpp for g in model.groups if g.spec.per_token):
        raise UnsupportedInVllm("jenga.vllm uniform layout: vLLM groups with different block sizes")
    return VllmPlan("uniform", model, cfg.num_blocks * block_bytes, tpp, False,
                    (1,) * len(model.groups), 1)


def _no_internal_checkpoints(spec):
    """A Mamba spec whose worker writes a state only at a step's end (never an "internal"
    prefill checkpoint into another block-table column, which jenga's pages do not plan)."""
    if isinstance(spec, kvi.MambaSpec) and spec.num_prefill_checkpoint_blocks:
        return dataclasses.replace(spec, num_prefill_checkpoint_blocks=0, prefill_checkpoint_alignment=None)
    return spec


def _normalized(spec, block_size: int):
    """The worker's spec of a jenga group: jenga's tokens per page, no vLLM padding.  A
    state's block size stays vLLM's (its block-table columns are positions / block size)."""
    if isinstance(spec, kvi.MambaSpec):
        return dataclasses.replace(_no_internal_checkpoints(spec), page_size_padded=None)
    return dataclasses.replace(spec, block_size=block_size, page_size_padded=None)


def no_periodic_checkpoints(max_model_len: int, block: int) -> int:
    """jenga's state checkpoint interval inside vLLM: past the longest sequence.  vLLM's worker
    writes a state only where a step ends; its scheduler ends prefill steps at the prompt's
    last block boundary and the shared-prefix junction (jenga's own checkpoint marks), not
    at every interval inside one long chunk."""
    return (max_model_len // block + 1) * block


def _check_state_blocks(groups, base: int, *, sub_block: bool = False) -> None:
    """An align-mode Mamba block must be jenga's token page (``sub_block``: a multiple of it)."""
    for _, spec in groups:
        if isinstance(spec, kvi.MambaSpec) and spec.mamba_cache_mode == "align" and spec.block_size != base \
                and not (sub_block and spec.block_size % base == 0):
            raise UnsupportedInVllm(f"jenga.vllm: Mamba block size {spec.block_size} differs from the attention "
                                    f"block size {base}; jenga's state checkpoints sit on its token pages")


def sub_block_page(layers, hash_block: int | None) -> int | None:
    """jenga's token page when vLLM hashes prompts finer than its align-mode Mamba block
    (``prefix_match_unit``), else None.  vLLM raises a hybrid's attention block to the Mamba
    block (equal page bytes); jenga's groups have their own page sizes, so its attention pages
    can hold one hash block: a prefix hit inside the Mamba block is then whole attention pages,
    and the state resumes from a checkpoint copied in and out of its block-table column
    (:mod:`jenga.vllm.state_copies`)."""
    blocks = {s.block_size for _, s in layers if isinstance(s, kvi.MambaSpec) and s.mamba_cache_mode == "align"}
    base = min(s.block_size for _, s in layers)
    if not hash_block or not blocks or hash_block >= base or any(b % hash_block for b in blocks) \
            or any(s.block_size % hash_block for _, s in layers):
        return None
    return hash_block


def _union_layers(cfgs) -> list[tuple[str, object]]:
    """Every worker's layers once, in stage order (pipeline stages hold different layers; tensor
    parallel ranks the same ones)."""
    seen: dict[str, object] = {}
    for cfg in cfgs:
        for name, s in _layer_specs(cfg):
            seen.setdefault(name, s)
    return list(seen.items())


def page_layer_plan(cfg, max_model_len: int, hash_block: int | None = None) -> tuple[VllmPlan, object]:
    """jenga's grouping and page sizes over vLLM's buffer: the plan and the rewritten config.
    ``hash_block``: vLLM's ``prefix_match_unit`` with prefix caching on (``sub_block_page``)."""
    plan, (new_cfg,) = page_layer_plans([cfg], max_model_len, hash_block)
    return plan, new_cfg


def page_layer_plans(cfgs, max_model_len: int, hash_block: int | None = None) -> tuple[VllmPlan, list]:
    """One plan for every worker's config (the scheduler hands the same block ids to all of them)
    and each worker's rewritten config.

    Groups are formed over the union of the workers' layers.  With pipeline parallelism a stage
    holds only some layers of a group; every stage then cuts the group's pages for the largest
    number of that group's layers any stage holds (the scheduler's one allocator needs the same
    page sizes, hence the same large pages, on every stage), and views only its own layers in
    them: a stage with fewer layers of a group leaves that part of its pages unused."""
    raw = min(_buffer_bytes(cfg) for cfg in cfgs)
    layers = _union_layers(cfgs)
    sub = sub_block_page(layers, hash_block)
    base = sub or min(s.block_size for _, s in layers)
    by_spec: dict[object, list[str]] = {}
    for name, s in layers:
        by_spec.setdefault(_normalized(s, base), []).append(name)
    groups = state_groups([(names, spec) for spec, names in by_spec.items()])
    owned = [set(name for name, _ in _layer_specs(cfg)) for cfg in cfgs]
    per_worker = [[([n for n in names if n in mine], spec) for names, spec in groups] for mine in owned]
    widest = [max((w[i][0] for w in per_worker), key=len) for i in range(len(groups))]
    envelope = [(names, spec) for names, (_, spec) in zip(widest, groups, strict=True)]
    _check_state_blocks(groups, base, sub_block=sub is not None)
    model = model_of_groups(envelope, name="vllm", max_model_len=max_model_len,
                            checkpoint_interval=no_periodic_checkpoints(max_model_len, base))
    fitted = manager_page_plan(with_base_page(model, base), MAX_LCM_RATIO).model
    S = fitted.large_page_bytes
    unit = reduce(math.gcd, (g.page_bytes for g in fitted.groups))
    pages = [g.page_bytes for g in fitted.groups]
    # vLLM's block 0 is its null block: padded rows of a state kernel write their state there.
    # With state groups, jenga's pages start ``sink = P_max`` bytes in, so exec id 0 of every
    # view (bytes [0, P_g)) touches no page; the views of the largest pages then need
    # ``2 P_max - P_min`` bytes past the last large page, which may cost a large page.
    # Without state groups nothing writes block 0: pages start at 0 (the slack page is the headroom).
    sink = max(pages) if any(not g.spec.per_token for g in fitted.groups) else 0
    num_large = min(raw // S - 1, (raw - sink - max(pages) + min(pages)) // S)
    if num_large < 1:
        raise UnsupportedInVllm(f"jenga.vllm: vLLM's KV budget of {raw} B holds no large page of {S} B plus a "
                                "slack page; give the KV cache more memory")
    num_blocks = (num_large * S - min(pages) + sink) // unit + 1  # the highest exec id + 1
    if sub and not all(state_copies_exact(w, fitted.groups, _buffer_bytes(cfg) == num_blocks * unit)
                       for w, cfg in zip(per_worker, cfgs, strict=True)):
        return page_layer_plans(cfgs, max_model_len)  # states inside a block cannot move: vLLM's blocks
    out = []
    for cfg, mine in zip(cfgs, per_worker, strict=True):
        new_groups = [kvi.KVCacheGroupSpec(names, _normalized(spec, g.tokens_per_page))
                      for (names, spec), g in zip(mine, fitted.groups, strict=True)]
        # a stage without layers of a group keeps the group (same block ids), no views
        tensors = [kvi.KVCacheTensor(size=_buffer_bytes(cfg), layers=list(mine[i][0]),
                                     layer_stride=fitted.groups[i].layer_page_bytes, block_stride=unit, offset=0)
                   for i in view_order(fitted.groups) if mine[i][0]]
        out.append(dataclasses.replace(cfg, num_blocks=num_blocks, kv_cache_tensors=tensors,
                                       kv_cache_groups=new_groups))
    plan = VllmPlan("pages", model, (num_large + 1) * S, base, True, tuple(p // unit for p in pages), sink // unit)
    return plan, out


def view_order(fitted) -> list[int]:
    """The order of the groups' ``KVCacheTensor`` entries, hence of the workers' views (vLLM's
    ``allocate_kv_cache`` makes them in that order): state groups first, widest layer view first.
    Layer ``0`` of every group sits at byte offset 0 and vLLM's block copy keeps the first view it
    meets there (``state_copies_exact``); a layer index holding both a state and an attention view
    (Falcon-H1's parallel hybrid layers) then copies the whole state, not one attention page."""
    return sorted(range(len(fitted)), key=lambda i: (fitted[i].spec.per_token,
                                                     -fitted[i].spec.layer_page_bytes(fitted[i].tokens_per_page)))


def state_copies_exact(groups, fitted, whole_storage: bool) -> bool:
    """Whether vLLM's block copy of a state page's exec id copies exactly that page's states.

    ``copy_kv_cache_blocks_inplace`` (vLLM's worker) copies block ``src`` onto ``dst`` in every
    layer's view, on 0.32 / 0.33 skipping a view whose data pointer it has seen (views at the
    same byte offset; 0.34 skips only views of the same geometry too), or copies ``dst`` once
    across the whole storage when the storage is ``num_blocks`` blocks exactly
    (``whole_storage``).  Its views come in layer-index order, ties in ``KVCacheTensor`` order
    (``bind_kv_cache``: the model runner), or in ``KVCacheTensor`` order (the v2 runner:
    ``view_order``).  In the page-layer buffer layer ``j`` of group ``h`` is the view at offset
    ``j * layer page`` whose block holds that layer's useful bytes; exec id ``e`` is ``e * u``
    bytes in.  So the copy is exact for group ``g`` on every version iff every view stays inside
    one page of ``g`` and, in both orders, the views left after skipping same-offset ones cover
    each layer's states."""
    if whole_storage:
        return False
    views = {}
    for i in view_order(fitted):
        (names, _), g = groups[i], fitted[i]
        for j, name in enumerate(names):
            views[name] = (j * g.layer_page_bytes, g.spec.layer_page_bytes(g.tokens_per_page))
    try:
        by_layer = sorted(views, key=extract_layer_index)
    except Exception:  # noqa: BLE001 - a layer name vLLM's order cannot place
        return False
    return all(_copies_cover(views, order, fitted) for order in (by_layer, list(views)))


def _copies_cover(views: dict, order: list[str], fitted) -> bool:
    """``state_copies_exact`` for one order of the views."""
    copied, seen = [], set()
    for name in order:
        off, size = views[name]
        if off not in seen:
            seen.add(off)
            copied.append((off, off + size))
    for g in fitted:
        if g.spec.per_token:
            continue
        if any(off + size > g.page_bytes for off, size in views.values()):
            return False
        need = g.spec.layer_page_bytes(g.tokens_per_page)
        for j in range(g.num_layers):
            lo, hi = j * g.layer_page_bytes, j * g.layer_page_bytes + need
            for a, b in sorted(copied):
                if a <= lo < b:
                    lo = b
            if lo < hi:
                return False
    return True


def rewrite_config(cfg, max_model_len: int, hash_block: int | None = None):
    """The config the workers and the scheduler get, with the plan attached as ``jenga_plan``
    (``hash_block``: see ``page_layer_plan``)."""
    return rewrite_configs([cfg], max_model_len, hash_block)[0]


def rewrite_configs(cfgs, max_model_len: int, hash_block: int | None = None) -> list:
    """Every worker's config (one per worker, as ``get_kv_cache_configs`` returns them), each with
    the one plan attached as ``jenga_plan`` (``hash_block``: see ``page_layer_plan``)."""
    if layout_name() == "uniform":
        out = []
        for cfg in cfgs:
            plan = uniform_plan(cfg, max_model_len)
            groups = [dataclasses.replace(g, kv_cache_spec=_no_internal_checkpoints(g.kv_cache_spec))
                      for g in cfg.kv_cache_groups]
            out.append(dataclasses.replace(cfg, kv_cache_groups=groups))
            out[-1].jenga_plan = plan
        return out
    plan, out = page_layer_plans(cfgs, max_model_len, hash_block)
    for cfg in out:
        cfg.jenga_plan = plan
    return out
