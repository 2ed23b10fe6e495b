"""``uniform``: vLLM v1's hybrid KV-cache manager (see shared/reference/peers.md §1).

What it models, rule by rule:

* **One page size.** Layers of each kind are split into groups of ``min(count per kind)``
  layers (or the max count when ``max < 1.5 min``); short groups get *padding layers*.
  Groups whose page divides the largest page scale their tokens per block.  With state
  layers the attention block grows until a block is at least one state, and the state is
  padded to match (Nemotron-H: thousands of tokens per block).  If pages still differ,
  v1 falls back to storing sliding and chunked layers as full attention.
* **One pool, no large pages**: ``S = P`` so any free page serves any group.
* **Out-of-window blocks are freed at the request's next allocate** (``remove_skipped_blocks``),
  so a just-computed chunk's out-of-window pages stay held until then.  vLLM frees them before
  its fit check; here they count as supply in the check (``can_allocate`` too) and are freed
  only once the allocation is certain, so ``can_allocate`` and an ``allocate`` returning
  ``None`` change nothing, as for every manager.
* **Sparse retention (default 0)**: sliding-window and state groups keep prefix-cache
  entries only at the prompt boundary; blocks not retained are never hashed.
* **Cross-attention is never prefix-cached; vision embeddings live outside the pool.**
* **Eviction**: one LRU over freed pages, tail first (the same ``(time, -length)`` key,
  with every page one large page, so no request-aware placement).
"""

from __future__ import annotations

import math

from jenga.baselines.common import TrueNeedsManager, TrueNeedsRules, stored_as
from jenga.core.alloc.page_states import Supply
from jenga.core.manager.admission import Admission
from jenga.core.policy.registry import (
    ChunkedPolicy,
    FullPolicy,
    ImagePolicy,
    MambaPolicy,
    PageOps,
    Policy,
    SlidingPolicy,
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


def uniform_model(model: ModelSpec, block: int) -> ModelSpec:
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
        state = max(g.page_bytes for g in states)
        per_tok = max(g.page_bytes for g in attn) // block
        tpp = block * cdiv(state, block * per_tok)
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


def releasing_at_next_allocate(base: type[FullPolicy]) -> type[FullPolicy]:
    """``base`` (a sliding or chunked policy) with v1's release of out-of-window pages at the
    request's next allocate: a subclass of it, so every uniform policy has one base class."""

    class ReleaseAtNextAllocate(base):
        """Out-of-window pages are released when the request next allocates, not at commit."""

        releases_at_next_allocate = True

        def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
            computed = req.num_computed
            self._register(req, gs, ops, computed)

        def _register(self, req: Request, gs: GroupState, ops: PageOps, computed: int) -> None:
            if not ops.caching:
                return
            tpp, pages = self.tpp, gs.pages
            full = min(computed // tpp, len(req.hashes) * self.block // tpp, len(pages))
            keep_from = self.retained_from(req)
            for i in range(max(gs.registered, keep_from), full):
                if pages[i] is not None and (i + 1) * tpp <= self.retained_to(req):
                    ops.register(self.gi, pages[i], self.page_key(req, i))
            gs.registered = max(gs.registered, full)

        def retained_from(self, req: Request) -> int:
            return 0

        def retained_to(self, req: Request) -> int:
            return 1 << 62

        def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
            """Pages past the held ones; those below the window stay held (``skipped``)."""
            return max(0, cdiv(end, self.tpp) - len(gs.pages))

        def skipped(self, req: Request, gs: GroupState) -> range:
            """Page indices that left the window / chunk but are still held (freed at the next allocate)."""
            return range(gs.released, min(self.keep_from(req.num_computed) // self.tpp, len(gs.pages)))

        def freed_by_release(self, req: Request, gs: GroupState, ops: PageOps) -> int:
            """Pages that ``release_skipped`` gives back to the pool (held by nobody else)."""
            ref, pages = ops.ref[self.gi], gs.pages
            return sum(1 for i in self.skipped(req, gs) if pages[i] is not None and ref[pages[i]] == 1)

        def release_skipped(self, req: Request, gs: GroupState, ops: PageOps) -> None:
            """``remove_skipped_blocks``: drop the pages below the window (no new registration)."""
            super().commit(req, gs, _NoRegister(ops))

        def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
            return (gs.registered + 1) * self.tpp if ops.caching else 1 << 62

    ReleaseAtNextAllocate.__name__ = ReleaseAtNextAllocate.__qualname__ = f"ReleaseAtNextAllocate{base.__name__}"
    return ReleaseAtNextAllocate


class _NoRegister:
    """PageOps view used to release pages without registering new ones."""

    def __init__(self, ops: PageOps):
        self._ops = ops
        self.caching = False
        self.now = ops.now
        self.out_of_window_age = ops.out_of_window_age

    def drop(self, *args) -> None:
        self._ops.drop(*args)

    def drop_run(self, *args) -> None:
        self._ops.drop_run(*args)


class UniformSlidingPolicy(releasing_at_next_allocate(SlidingPolicy)):
    """v1 sliding window: retention only inside the window that ends at the prompt."""

    def retained_from(self, req: Request) -> int:
        return max(0, req.prompt_len - self.group.spec.window) // self.tpp

    def retained_to(self, req: Request) -> int:
        return req.prompt_len


class UniformChunkedPolicy(releasing_at_next_allocate(ChunkedPolicy)):
    pass


class UniformMambaPolicy(MambaPolicy):
    """v1 "align" mode with retention 0: one state kept, at the prompt's last block end."""

    recompute_under_shared = False  # v1 recomputes a state hit's gap into fresh attention blocks

    def __init__(self, gi: int, group: LayerGroup, block: int, align: int):
        super().__init__(gi, group, block)
        self.every = align

    def _release_read(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        pass  # held until the step's commit, as v1 holds the block it reads

    def _take_work_as_checkpoint(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        pass  # v1 writes its one checkpoint into a block of its own

    def _new_checkpoints(self, req: Request, end: int) -> range:
        pos = req.prompt_len - req.prompt_len % self.every
        ok = req.start < pos <= end - req.num_lookahead
        return range(pos, pos + 1) if ok and pos > 0 else range(0)

    def _fresh_checkpoints(self, req: Request, end: int) -> range:
        return self._new_checkpoints(req, end)  # v1 writes its checkpoint whatever another request writes

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.work is None:
            return 0
        pos = req.prompt_len - req.prompt_len % self.every
        return pos if ops.caching and req.start < pos else 1 << 62


class UncachedImagePolicy(ImagePolicy):
    """Cross-attention KV is never prefix-cached in v1."""

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        if gs.initialized:
            return 0
        for j in range(len(req.images)):
            gs.pending[j] = None
        return sum(cdiv(img.num_tokens, self.tpp) for img in req.images)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        gs.to_fill.clear()


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


class UniformRules(TrueNeedsRules):
    """vLLM v1's rules: its model (``uniform_model``), its policies, its fit check, and the
    skipped blocks freed before an allocation that is sure to succeed."""

    admission_class = UniformAdmission

    def prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        self.remember_true_model(model, tokens_per_page)
        um = uniform_model(model, tokens_per_page)
        self.align = math.lcm(*(g.tokens_per_page for g in um.groups if g.spec.per_token)) \
            if any(g.spec.per_token for g in um.groups) else tokens_per_page
        return um

    def policy(self, gi: int, group: LayerGroup, block: int) -> Policy:
        for cls in type(group.spec).__mro__:  # exact type first, then its bases (as ``policy_for``)
            if cls in UNIFORM_POLICIES:
                return UNIFORM_POLICIES[cls](gi, group, block, self.align)
        raise AssertionError(f"uniform: no rule for {type(group.spec).__name__}")

    def before_allocate(self, mgr: TrueNeedsManager, req: Request, n: int, lookahead: int) -> bool:
        """Free the skipped blocks only once the allocation is sure to succeed (count first)."""
        releasing = [(pol, gs) for pol, gs in _releasing(mgr.policies, req) if pol.skipped(req, gs)]
        if releasing:
            if not mgr.can_allocate(req.request_id, n, num_lookahead=lookahead):
                return False
            for pol, gs in releasing:
                pol.release_skipped(req, gs, mgr.ledger)
        return True


class UniformManager(TrueNeedsManager):
    """vLLM v1's hybrid allocator behind the ``KVCacheManager`` API."""

    name = "uniform"
    rules_class = UniformRules


#: spec type -> the uniform manager's policy (``align``: the Mamba checkpoint alignment)
UNIFORM_POLICIES = {
    SlidingWindowSpec: lambda gi, group, block, align: UniformSlidingPolicy(gi, group, block),
    ChunkedLocalSpec: lambda gi, group, block, align: UniformChunkedPolicy(gi, group, block),
    MambaSpec: UniformMambaPolicy,
    CrossAttentionSpec: lambda gi, group, block, align: UncachedImagePolicy(gi, group, block),
    FullAttentionSpec: lambda gi, group, block, align: FullPolicy(gi, group, block),
}
