"""``uniform``: vLLM v1's hybrid KV-cache manager (see shared/reference/peers.md §1).

What it models, rule by rule:

* **One page size.** Layers of each kind are split into groups of ``min(count per kind)``
  layers (or the max count when ``max < 1.5 min``); short groups get *padding layers*.
  Groups whose page divides the largest page scale their tokens per block.  With state
  layers the attention block grows until a block is at least one state, by vLLM's own
  formula (``hybrid_block``), and the state is padded to match (Nemotron-H: thousands of
  tokens per block).  If pages still differ,
  v1 falls back to storing sliding and chunked layers as full attention.
* **One pool, no large pages**: ``S = P`` so any free page serves any group.
* **Out-of-window blocks are freed at the request's next allocate** (``remove_skipped_blocks``),
  so a just-computed chunk's out-of-window pages stay held until then.  vLLM frees them before
  its fit check; here they count as supply in the check (``can_allocate`` too) and are freed
  only once the allocation is certain, so ``can_allocate`` and an ``allocate`` returning
  ``None`` change nothing, as for every manager.
* **Retention** (``UniformSettings``, vLLM 0.34's ``prefix_cache_retention_interval``,
  default 0): sliding-window and state groups keep prefix-cache entries at *semantic
  checkpoints*, the replay boundary (``prompt_len - 1``) and the request's shared-prefix
  junction (where the full-attention hit exceeded its own), plus every N tokens with N > 0,
  or every block (``None``); blocks not retained are never hashed.  A Mamba state lives in
  the block of its step's end, so prefill steps end on block boundaries, at the replay
  boundary and at the junction (``uniform_retention``).  ``uniform-0.32``: 0.32's rules,
  the window before the prompt's end and one state at its last block (``uniform_policies``).
* **Cross-attention is never prefix-cached; vision embeddings live outside the pool.**
* **Eviction**: one LRU over freed pages, tail first (the same ``(time, -length)`` key,
  with every page one large page, so no request-aware placement); under 0.34's rules in vLLM's
  free queue order (a request's groups one after the other).
* **Not modelled**: ``prefix_match_unit`` finer than the block (vLLM's copy-on-write
  sub-block hits) is refused (``check_settings``).
"""

from __future__ import annotations

import math

from jenga.baselines.common import TrueNeedsManager, TrueNeedsRules, stored_as
from jenga.baselines.uniform_policies import (
    UncachedImagePolicy,
    UniformChunkedPolicy,
    UniformMambaPolicy,
    UniformSlidingPolicy,
)
from jenga.baselines.uniform_retention import (
    FreeQueue,
    FreeQueueFullPolicy,
    RetainingMambaPolicy,
    RetainingSlidingPolicy,
)
from jenga.baselines.uniform_settings import VLLM_032, UniformSettings
from jenga.core.alloc.page_states import Supply
from jenga.core.manager.admission import Admission
from jenga.core.policy.registry import (
    FullPolicy,
    Policy,
    cdiv,
)
from jenga.core.request import GroupState, Request
from jenga.core.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    ModelSpec,
    SlidingWindowSpec,
)
from jenga.errors import InvalidArgumentError, UnsupportedFeatureError


def hybrid_block(model: ModelSpec, block: int, kernel_block: int = 16) -> int:
    """vLLM's attention block on a model with state layers (``Platform._align_hybrid_block_size``,
    0.34; ``block`` when it has none): ``k = max(kernel_block, block)`` (the attention kernel's
    smallest block, FlashAttention 16), then the smallest multiple of ``k`` whose one-layer
    attention page (the model's attention: its first full-attention group, else its first
    attention group; K and V of one token times the block) holds the largest one-layer state."""
    states = [g.spec for g in model.groups if stored_as(g.spec) == "state"]
    attn = [g.spec for g in model.groups if stored_as(g.spec) == "tokens"]
    if not states or not attn:
        return block
    main = next((s for s in attn if type(s) is FullAttentionSpec), attn[0])
    per_tok = main.layer_page_bytes(1)
    state = max(s.layer_page_bytes(block) for s in states)
    k = max(kernel_block, block)
    return max(block, k * cdiv(state, k * per_tok))


def uniform_model(model: ModelSpec, block: int, kernel_block: int = 16) -> ModelSpec:
    """The groups vLLM v1 would build (see the module docstring)."""
    kept = [g for g in model.groups if stored_as(g.spec) is not None]  # vision embeddings: outside the pool
    counts = [g.num_layers for g in kept]
    lo, hi = min(counts), max(counts)
    size = hi if hi < 1.5 * lo else lo
    split: list[LayerGroup] = []
    for g in kept:
        for n, start in enumerate(range(0, g.num_layers, size)):
            layers = g.layers[start:start + size]
            pad_layers = size - len(layers)
            per_layer = g.spec.layer_page_bytes(block)
            split.append(LayerGroup(f"{g.name}.{n}", g.spec, layers, block, pad_layers * per_layer))
    attn = [g for g in split if stored_as(g.spec) in ("tokens", "images")]
    states = [g for g in split if stored_as(g.spec) == "state"]
    if states and attn:
        tpp = hybrid_block(model, block, kernel_block)
        attn = [_retoken(g, tpp) for g in attn]
        target = max(g.page_bytes for g in attn)
        states = [_pad_to(g, target) for g in states]
    pages = {g.page_bytes for g in attn}
    top = max(pages, default=0)
    if any(top % p for p in pages):
        return _fallback_full(model, block)
    attn = [_retoken(g, g.tokens_per_page * top // g.page_bytes) for g in attn]
    groups = tuple(attn + states)
    if len({g.page_bytes for g in groups}) != 1:
        return _fallback_full(model, block)
    return ModelSpec(f"{model.name}[uniform]", groups, model.max_model_len, model.num_layers, model.hf_config)


def _retoken(g: LayerGroup, tpp: int) -> LayerGroup:
    per_layer = g.spec.layer_page_bytes(1)
    pad_layers = (g.pad_bytes // (g.spec.layer_page_bytes(g.tokens_per_page) or 1))
    return LayerGroup(g.name, g.spec, g.layers, tpp, pad_layers * per_layer * tpp)


def _pad_to(g: LayerGroup, target: int) -> LayerGroup:
    extra = target - g.useful_page_bytes
    assert extra >= 0 and extra % g.num_layers == 0, f"cannot pad {g.name} to {target}"
    return LayerGroup(g.name, g.spec, g.layers, g.tokens_per_page, extra)


def _fallback_full(model: ModelSpec, block: int) -> ModelSpec:
    """``--disable-hybrid-kv-cache-manager``: sliding / chunked layers stored as full."""
    from jenga.baselines.paged import paged_model
    return paged_model(model, block)


def _releasing(policies: list[Policy], req: Request) -> list[tuple[FullPolicy, GroupState]]:
    """The groups whose out-of-window pages wait for the request's next allocate."""
    return [(pol, gs) for pol, gs in zip(policies, req.groups, strict=True)
            if pol.releases_at_next_allocate]


class UniformAdmission(Admission):
    """v1's fit check: the pages this allocate's ``remove_skipped_blocks`` frees count as
    whole large pages (one page = one large page here), before any of them is freed."""

    def quota_of(self, req: Request, need: list[int], end: int, allocated: int) -> list[int] | None:
        credit = sum(pol.freed_by_release(req, gs, self.ledger) for pol, gs in _releasing(self.policies, req))
        if not credit or not any(need):
            return super().quota_of(req, need, end, allocated)
        sup = self.alloc.supply()
        return self.quota_for(need, Supply(sup.free_small, sup.cached_small, sup.whole_large + credit))


def check_settings(settings: UniformSettings, model: ModelSpec) -> None:
    """Refuse, before any state exists, settings vLLM refuses (a retention interval that is not a
    multiple of the scheduler block, a match unit dividing no block) and sub-block hits
    (``prefix_match_unit`` finer than a block: vLLM's copy-on-write partial blocks and sub-block
    Mamba states, which ``uniform`` does not model)."""
    blocks = sorted({g.tokens_per_page for g in model.groups if g.spec.per_token})
    block = blocks[-1] if blocks else 0
    if settings.retention and block and settings.retention % block:
        raise InvalidArgumentError(f"uniform: retention interval {settings.retention} is not a multiple of the "
                                   f"scheduler block {block} (vLLM refuses it too)")
    unit = settings.match_unit
    if unit is None or not blocks:
        return
    if any(b % unit for b in blocks):
        raise InvalidArgumentError(f"uniform: prefix_match_unit {unit} does not divide the blocks {blocks}")
    if unit < blocks[0]:
        raise UnsupportedFeatureError(f"uniform: prefix_match_unit {unit} is finer than the {blocks[0]}-token block: "
                                      "vLLM's sub-block hits (copy-on-write partial blocks, sub-block Mamba states) "
                                      "are not modelled; use a unit of whole blocks or none")


class UniformRules(TrueNeedsRules):
    """vLLM v1's rules: its model (``uniform_model``), its policies, its fit check, and the
    skipped blocks freed before an allocation that is sure to succeed."""

    admission_class = UniformAdmission

    def __init__(self, settings: UniformSettings | None = None):
        super().__init__()
        self.settings = UniformSettings() if settings is None else settings
        self.state_policies: list[RetainingMambaPolicy] = []  # their admissions may wait a step

    def prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        self.remember_true_model(model, tokens_per_page)
        um = uniform_model(model, tokens_per_page, self.settings.kernel_block)
        self.free_queue = FreeQueue(len(um.groups))
        check_settings(self.settings, um)
        self.align = math.lcm(*(g.tokens_per_page for g in um.groups if g.spec.per_token)) \
            if any(g.spec.per_token for g in um.groups) else tokens_per_page
        return um

    def policy(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None) -> Policy:
        table = UNIFORM_POLICIES if self.settings.junctions else UNIFORM_032_POLICIES
        for cls in type(group.spec).__mro__:  # exact type first, then its bases (as ``policy_for``)
            if cls in table:
                return table[cls](gi, group, block, self, window_slack)
        raise AssertionError(f"uniform: no rule for {type(group.spec).__name__}")

    def waits_on(self, pol: RetainingMambaPolicy) -> RetainingMambaPolicy:
        """``pol``'s admissions may wait a step (``before_allocate``)."""
        self.state_policies.append(pol)
        return pol

    def before_allocate(self, mgr: TrueNeedsManager, req: Request, n: int, lookahead: int) -> bool:
        """Refuse an admission that would resume a state written in this step (0.34's rules); free
        the skipped blocks only once the allocation is sure to succeed (count first)."""
        if any(pol.hits_unwritten_state(req, mgr.ledger) for pol in self.state_policies):
            return False
        releasing = [(pol, gs) for pol, gs in _releasing(mgr.policies, req) if pol.skipped(req, gs)]
        if releasing:
            if not mgr.can_allocate(req.request_id, n, num_lookahead=lookahead):
                return False
            for pol, gs in releasing:
                pol.release_skipped(req, gs, mgr.ledger)
        return True


class UniformManager(TrueNeedsManager):
    """vLLM v1's hybrid allocator behind the ``KVCacheManager`` API; ``settings``: which of
    vLLM's prefix-cache rules it follows (:class:`UniformSettings`, 0.34's defaults)."""

    name = "uniform"
    rules_class = UniformRules
    #: the settings when none are given
    default_settings = UniformSettings()

    def __init__(self, model: ModelSpec, memory_bytes: int | str, *, settings: UniformSettings | None = None, **kwargs):
        if settings is not None and not isinstance(settings, UniformSettings):
            raise InvalidArgumentError(f"uniform: settings must be a UniformSettings, not {type(settings).__name__}")
        super().__init__(model, memory_bytes, rules=UniformRules(settings or self.default_settings), **kwargs)


class Uniform032Manager(UniformManager):
    """``uniform`` with vLLM 0.32's rules (``VLLM_032``: before retention intervals and junctions)."""

    name = "uniform-0.32"
    default_settings = VLLM_032


#: spec type -> the uniform manager's policy under vLLM 0.32's rules (``rules``: the ``UniformRules``,
#: its ``align`` the Mamba checkpoint alignment; ``slack``: the manager's ``window_slack``)
UNIFORM_032_POLICIES = {
    SlidingWindowSpec: lambda gi, group, block, rules, slack: UniformSlidingPolicy(gi, group, block, slack),
    ChunkedLocalSpec: lambda gi, group, block, rules, slack: UniformChunkedPolicy(gi, group, block),
    MambaSpec: lambda gi, group, block, rules, slack: UniformMambaPolicy(gi, group, block, rules.align),
    CrossAttentionSpec: lambda gi, group, block, rules, slack: UncachedImagePolicy(gi, group, block),
    FullAttentionSpec: lambda gi, group, block, rules, slack: FullPolicy(gi, group, block),
}
#: the same under vLLM 0.34's rules (``rules.settings``: retention interval, junctions)
UNIFORM_POLICIES = {
    **UNIFORM_032_POLICIES,
    SlidingWindowSpec: lambda gi, group, block, rules, slack: RetainingSlidingPolicy(gi, group, block, rules.settings,
                                                                              rules.free_queue),
    MambaSpec: lambda gi, group, block, rules, slack: rules.waits_on(RetainingMambaPolicy(gi, group, block, rules.align,
                                                                               rules.settings, rules.free_queue)),
    FullAttentionSpec: lambda gi, group, block, rules, slack: FreeQueueFullPolicy(gi, group, block, rules.free_queue),
}
