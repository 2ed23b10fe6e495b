"""``MultiModelManager``: several independent models in one jenga pool.

The models' layer groups form one composite :class:`~jenga.core.specs.ModelSpec` (group names
``"<model>/<group>"``) and one LCM large page, so a large page freed by one model can be carved
by any other: memory follows the load, with no static split.  Each request names its model at
``add_request``; it only ever touches that model's groups (:mod:`jenga.core.manager.model_scope`)
and hashes its blocks under a root that names the model, so prefix caches and eviction stay per
model (a page of one model is never a hit for another, whatever the tier).  Per-model floors
(:mod:`jenga.core.manager.model_floors`) keep a flood at one model from starving another; by
default a model's floor is what its longest admitted request needs (``max_model_lens``).

Refused at start, before anything is built: the same model named twice, a budget whose large
pages cannot hold every floor, and models whose small pages make the LCM page unbounded
(:class:`~jenga.core.pagesize.PageSizeError` naming the page sizes and the bound).  A host tier is
not supported with several models yet (refused).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from functools import reduce

from jenga.core.manager.manager import KVCacheManager
from jenga.core.manager.model_floors import FloorAdmission
from jenga.core.manager.model_scope import ModelScopes, ScopedPolicy, scoped_salt
from jenga.core.manager.rules import ManagerRules
from jenga.core.pagesize import PagePlan, PageSizeError, with_base_page
from jenga.core.policy.registry import cdiv
from jenga.core.specs import LayerGroup, ModelSpec
from jenga.core.tables import PageTables
from jenga.core.validation import checked_int
from jenga.errors import InsufficientMemoryError, InvalidArgumentError, UnknownRequestError
from jenga.units import fmt_bytes, parse_bytes


def composite_spec(models: Sequence[ModelSpec]) -> ModelSpec:
    """One spec with every model's groups, named ``"<model>/<group>"``; each group's spec keeps
    its model's name (``CacheSpec.model``: what a model runner binds its layers to)."""
    groups = tuple(LayerGroup(f"{m.name}/{g.name}", g.spec, g.layers, g.tokens_per_page, g.pad_bytes)
                   for m in models for g in m.groups)
    return ModelSpec("+".join(m.name for m in models), groups, max(m.max_model_len for m in models),
                     sum(m.num_layers for m in models))


def check_models(models: Sequence[ModelSpec]) -> None:
    """Typed errors for a model list no pool can serve: none, a name twice, a group spec naming
    another model than its own."""
    if not models:
        raise InvalidArgumentError("a multi-model pool needs at least one model")
    names = [m.name for m in models]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidArgumentError(f"model {dup[0]!r} is named twice; serve each model once (models: {names})")
    for m in models:
        other = {g.spec.model for g in m.groups} - {m.name}
        if other:
            raise InvalidArgumentError(f"model {m.name!r}: its cache specs name model {sorted(other)[0]!r}; build "
                                       f"each spec with name={m.name!r}")


#: State pads tried when the groups are split (the plan with the smallest large page wins): a state
#: page is held once per request, a large page partly carved once per group.
SPLIT_PAD_FRACS = (0.01, 0.02, 0.05)


class ModelScopeRules(ManagerRules):
    """jenga's rules with every group's policy scoped to its model and the floors' admission."""

    def __init__(self, scopes: ModelScopes, plan: PagePlan | None = None):
        super().__init__()
        self.scopes = scopes
        self.admission_class = functools.partial(FloorAdmission, scopes=scopes)
        self._plan = plan

    def prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        """The plan the pool was fitted with at start (``plan``), else jenga's own fitting."""
        if self._plan is None or max_ratio is None or \
                [g.name for g in model.groups] != [g.name for g in self._plan.model.groups]:
            return super().prepare_model(model, tokens_per_page, max_ratio)
        self.page_plan = self._plan
        return self._plan.model

    def policy(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None):
        return ScopedPolicy(super().policy(gi, group, block, window_slack), self.scopes.group_scope[gi], self.scopes)


class MultiModelManager(KVCacheManager):
    """One pool for ``models`` (``ModelSpec``s with distinct names).  ``floors``: per model name, the
    bytes reserved for it (rounded up to large pages); models left out get what one request of their
    ``max_model_lens`` entry (default: the model's own maximum) needs at its peak.  ``split_groups``:
    split every group into power-of-two layer counts (:func:`~jenga.core.pagesize.split_layer_groups`)
    always (True), never (False), or only when the models' page plan cannot bound the LCM page
    otherwise (None, the default).  Other keyword arguments are ``KVCacheManager``'s (no host tier)."""

    name = "jenga"

    def __init__(self, models: Sequence[ModelSpec], memory_bytes: int | str, *,
                 floors: Mapping[str, int | str] | None = None, max_model_lens: Mapping[str, int] | None = None,
                 tokens_per_page: int = 16, max_lcm_ratio: float = 8.0, split_groups: bool | None = None,
                 **kwargs):
        models = list(models)
        check_models(models)
        if kwargs.get("host_memory_bytes") is not None:
            raise InvalidArgumentError("a host KV tier is not supported with several models in one pool")
        names = [m.name for m in models]
        for label, given in (("floors", floors), ("max_model_lens", max_model_lens)):
            unknown = sorted(set(given or {}) - set(names))
            if unknown:
                raise InvalidArgumentError(f"{label} names {unknown[0]!r}, not a served model ({', '.join(names)})")
        floors = {n: parse_bytes(v) for n, v in (floors or {}).items()}
        lens = {m.name: min(m.max_model_len, int((max_model_lens or {}).get(m.name, m.max_model_len)))
                for m in models}
        models, plan = self._fitting(models, tokens_per_page, max_lcm_ratio, split_groups)
        spec = composite_spec(models)
        self.scopes = ModelScopes(names, [i for i, m in enumerate(models) for _ in m.groups])
        self.rules_class = functools.partial(ModelScopeRules, self.scopes, plan)
        super().__init__(spec, memory_bytes, tokens_per_page=tokens_per_page, max_lcm_ratio=max_lcm_ratio,
                         **kwargs)
        # no single full-attention group bounds every request's lookup: each hashes up to its own hit
        self.hasher.bound = None
        self.junction.bound = None
        self.model_lens, self.floor_pages = self._floors(floors, lens)
        self.admission.floors = list(self.floor_pages)
        self.admission.live = self.requests

    # ------------------------------------------------------------------ start
    @staticmethod
    def _fitting(models: list[ModelSpec], tokens_per_page: int, ratio: float,
                 split: bool | None) -> tuple[list[ModelSpec], PagePlan]:
        """``(models, plan)``: ``models`` if their composite page plan fits; else the models with their
        groups split into power-of-two layer counts (:func:`~jenga.core.pagesize.split_layer_groups`),
        planned with the smallest large page any state pad in :data:`SPLIT_PAD_FRACS` reaches (the
        split brings more groups, each holding at most one partly carved large page); else
        :class:`PageSizeError` naming the page sizes and the bound.  ``split``: True / False tries only
        the split / unsplit models."""
        from jenga.core.pagesize import fit_page_sizes, manager_page_plan, split_layer_groups

        first = None
        if split is not True:
            try:
                return models, manager_page_plan(with_base_page(composite_spec(models), tokens_per_page), ratio)
            except PageSizeError as e:
                first = e
        if split is not False:
            parts = [split_layer_groups(m) for m in models]
            base, plans = with_base_page(composite_spec(parts), tokens_per_page), []
            for frac in SPLIT_PAD_FRACS:
                try:
                    plans.append(fit_page_sizes(base, max_ratio=ratio, max_pad_frac=frac, widen=True))
                except PageSizeError as e:
                    first = first or e
            if plans:
                return parts, min(plans, key=lambda p: (p.large_page_bytes, p.pad_frac))
        base = with_base_page(composite_spec(models), tokens_per_page)
        sizes = "; ".join(f"{m.name}: " + ", ".join(f"{g.name.split('/', 1)[1]} {fmt_bytes(g.page_bytes)}"
                                                    for g in base.groups if g.spec.model == m.name)
                          for m in models)
        lcm = reduce(math.lcm, (g.page_bytes for g in base.groups))
        raise PageSizeError(f"the models' small pages ({sizes}) give an LCM page of {fmt_bytes(lcm)}; the bound is "
                            f"{ratio:g} x the largest small page ({fmt_bytes(base.max_small_page_bytes)}) = "
                            f"{fmt_bytes(int(ratio * base.max_small_page_bytes))} and no page plan meets it"
                            + ("" if split is not None else ", with the groups split into power-of-two layer counts "
                               "or not") + f" ({first})")

    def _floors(self, given: dict[str, int], lens: dict[str, int]) -> tuple[dict[str, int], list[int]]:
        """(longest admitted request per model, floor in large pages per model); raises when the
        pool cannot hold every floor."""
        pool, names = self.pool, self.scopes.names
        floors, out_lens = [], {}
        for m, name in enumerate(names):
            if name in given:
                pages = cdiv(given[name], pool.large_page_bytes)
                out_lens[name] = self._longest_within(m, pages, lens[name])
                if out_lens[name] < 2:
                    raise InsufficientMemoryError(f"the floor of {name} ({fmt_bytes(given[name])}) holds no request "
                                                  f"of two tokens; give it at least "
                                                  f"{fmt_bytes(self.peak_large_pages(m, 2) * pool.large_page_bytes)}")
            else:
                pages = self.peak_large_pages(m, lens[name])
                out_lens[name] = lens[name]
            floors.append(pages)
        if sum(floors) > pool.num_large_pages:
            parts = ", ".join(f"{n} {f} ({fmt_bytes(f * pool.large_page_bytes)}, "
                              f"{out_lens[n]} tokens)" for n, f in zip(names, floors, strict=True))
            raise InsufficientMemoryError(
                f"the KV budget holds {pool.num_large_pages} large pages of {fmt_bytes(pool.large_page_bytes)}; the "
                f"models' floors need {sum(floors)}: {parts}; raise the budget, or lower max_model_len or the floors")
        return out_lens, floors

    def peak_large_pages(self, scope: int, length: int) -> int:
        """Large pages one request of model ``scope`` holds at its peak over ``length`` tokens."""
        k = self.pool.small_per_large
        return sum(cdiv(self.policies[g].footprint.peak_pages(length), k[g]) for g in self.scopes.groups[scope])

    def _longest_within(self, scope: int, pages: int, cap: int) -> int:
        """The longest request (<= ``cap``) of model ``scope`` whose peak fits ``pages`` large pages."""
        lo, hi = 0, cap + 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.peak_large_pages(scope, mid) <= pages else (lo, mid)
        return lo

    # -------------------------------------------------------------------- API
    @property
    def model_names(self) -> list[str]:
        return list(self.scopes.names)

    def add_request(self, request_id: object, prompt_token_ids: Sequence[int], *, model: str | None = None,
                    cache_salt: str | None = None, **kwargs) -> None:
        """``KVCacheManager.add_request`` for a request of ``model`` (a served model's name)."""
        if model not in self.scopes.names:
            raise InvalidArgumentError(f"unknown model {model!r}; this pool serves {', '.join(self.scopes.names)}")
        if kwargs.get("block_hashes") is not None:
            raise InvalidArgumentError("caller block hashes are not supported with several models in one pool")
        if cache_salt is not None and not isinstance(cache_salt, str):
            super().add_request(request_id, prompt_token_ids, cache_salt=cache_salt, **kwargs)  # its typed error
        super().add_request(request_id, prompt_token_ids, cache_salt=scoped_salt(model, cache_salt), **kwargs)
        self.scopes.of[request_id] = self.scopes.index(model)

    def note_waiting(self, model: str, count: int) -> None:
        """Tell the pool how many requests of ``model`` wait for admission (its scheduler's queue):
        while another model has some, an admission stays within its even share (``FloorAdmission``)."""
        if model not in self.scopes.names:
            raise InvalidArgumentError(f"unknown model {model!r}; this pool serves {', '.join(self.scopes.names)}")
        self.scopes.waiting[self.scopes.index(model)] = checked_int(count, "count", minimum=0)

    def lookup(self, request_id: object, *, max_tokens: int | None = None) -> int:
        """``KVCacheManager.lookup``; the prompt tokens looked up and found count for the request's model."""
        hit = self._hit_within_floors(request_id, super().lookup(request_id, max_tokens=max_tokens))
        scope = self.scopes.of[request_id]
        self.scopes.query_tokens[scope] += len(self.requests[request_id].tokens)
        self.scopes.hit_tokens[scope] += hit
        return hit

    def _hit_within_floors(self, request_id: object, hit: int) -> int:
        """``hit`` shortened until the floors hold.  A hit holds its pages until the request's first
        allocate, and pages in fully evictable large pages then count for its model (``H_m``): a
        long hit could lift ``sum_m max(H_m, F_m)`` past the pool, so another model could no longer
        reach its floor while this request waits.  A shorter hit holds fewer pages; none holds none.
        (``cached_tokens``, read only, does not shorten: it may answer more than ``lookup`` finds.)"""
        adm = self.admission
        while hit:
            adm.ledger.settle()
            held = adm.held_large()
            if sum(max(h, f) for h, f in zip(held, self.floor_pages, strict=True)) <= self.pool.num_large_pages:
                break
            hit = super().lookup(request_id, max_tokens=hit - 1)
        return hit

    def model_of(self, request_id: object) -> str:
        """The model a live request belongs to."""
        scope = self.scopes.of.get(request_id)
        if scope is None:
            raise UnknownRequestError(f"unknown request id {request_id!r} (never added, or already freed)")
        return self.scopes.names[scope]

    def _allocate_slow(self, req, n: int, lookahead: int, end: int) -> PageTables | None:
        first = req.tables is None
        tables = super()._allocate_slow(req, n, lookahead, end)
        if first and tables is not None:
            self.scopes.allocated[self.scopes.of[req.request_id]] += 1
        return tables

    def _active(self, req):
        scope = self.scopes.of[req.request_id]
        return [(p, g) for p, g in super()._active(req) if p.scope == scope]

    def free(self, request_id: object) -> None:
        req = self._req(request_id)
        allocated = req.tables is not None
        super().free(request_id)
        scope = self.scopes.of.pop(request_id)
        if allocated:
            self.scopes.allocated[scope] -= 1

    # -------------------------------------------------------------- reporting
    def model_used_bytes(self, name: str) -> int:
        """Bytes of the pages live requests of ``name`` hold (its groups' USED pages)."""
        self._settle()
        alloc = self._alloc
        return sum(alloc.used_pages(g) * alloc.page_bytes[g] for g in self.scopes.groups[self.scopes.index(name)])

    def model_floor_bytes(self, name: str) -> int:
        return self.floor_pages[self.scopes.index(name)] * self.pool.large_page_bytes

    def model_needed_bytes(self, name: str) -> tuple[int, int]:
        """(held, needed) bytes of ``name``'s live requests (their waste is held - needed)."""
        scope = self.scopes.index(name)
        self._settle()
        held = needed = 0
        for rid, req in self.requests.items():
            if self.scopes.of.get(rid) == scope:
                h, n, _, _ = self.accounting.request(req)
                held, needed = held + h, needed + n
        return held, needed

    def check_integrity(self) -> None:
        """``KVCacheManager.check_integrity``, plus: every page of a model's group is held only by
        that model's requests, and the floor invariant holds."""
        super().check_integrity()
        for rid, req in self.requests.items():
            scope = self.scopes.of[rid]
            for pol, gs in zip(self.policies, req.groups, strict=True):
                assert pol.scope == scope or not pol.footprint.references(gs), \
                    f"request {rid!r} of {self.scopes.names[scope]} holds pages of group {pol.group.name}"
        held = self.admission.held_large()
        assert sum(max(h, f) for h, f in zip(held, self.floor_pages, strict=True)) <= self.pool.num_large_pages, \
            f"floors broken: held {held} large pages, floors {self.floor_pages}"
        assert sum(self.scopes.allocated) == self.num_allocated

