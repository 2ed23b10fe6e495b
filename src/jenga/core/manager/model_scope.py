"""Model scopes: one pool, several models; a request touches only its own model's groups.

A :class:`~jenga.core.manager.multi_model.MultiModelManager` holds the layer groups of several
independent models in one LCM pool.  Every request belongs to one model (its *scope*, an index
into the models); ``ModelScopes`` records which, and :class:`ScopedPolicy` wraps each group's
policy so that a request of another model sees the group as absent: it accepts any prefix, needs
and holds no page, limits nothing and has nothing to commit.  Every per-request loop of the
manager (lookup, admission, grow, commit, free, accounting, integrity) goes through these
answers, so no part of the manager needs to know about models.

Keys stay apart on top of that: a model's requests hash under a root that names the model
(``scoped_salt``), so a page of one model never answers a lookup of another, in any tier.
"""

from __future__ import annotations

from jenga.core.policy.base import NEVER, PageOps, Policy
from jenga.core.policy.footprint import Footprint
from jenga.core.request import GroupState, Request


def scoped_salt(model: str, cache_salt: str | None) -> str:
    """The salt a request of ``model`` hashes under: the model's name, then the caller's salt
    (length-prefixed, so no two (model, salt) pairs give the same string; ``None`` and ``""``
    stay distinct tenants)."""
    tail = "-" if cache_salt is None else "+" + cache_salt
    return f"model:{len(model)}:{model}{tail}"


class ModelScopes:
    """The models of one pool: their names, each group's model, each live request's model, and
    per model the requests past their first ``allocate`` (admission's per-model count) and the
    prompt tokens its lookups asked for and found."""

    def __init__(self, names: list[str], group_scope: list[int]):
        self.names = list(names)
        self.group_scope = list(group_scope)
        self.groups = [[g for g, s in enumerate(group_scope) if s == m] for m in range(len(names))]
        self.of: dict[object, int] = {}  # live request id -> its model's index
        self.allocated = [0] * len(names)
        self.waiting = [0] * len(names)  # per model: requests queued, as its scheduler last said
        self.query_tokens = [0] * len(names)  # per model: prompt tokens looked up, and found cached
        self.hit_tokens = [0] * len(names)

    def index(self, name: str) -> int:
        return self.names.index(name)


class ScopedPolicy:
    """``inner`` (the policy of a group of model ``scope``) for requests of that model; for any
    other request the group does not exist (module doc).  Everything that takes no request (page
    counts of a length, a record's pages, the group's facts) is ``inner``'s."""

    def __init__(self, inner: Policy, scope: int, scopes: ModelScopes):
        # tier_rules stay inner's: a pool of several models has no host tier
        self.inner, self.scope, self._of = inner, scope, scopes.of
        self.gi, self.group, self.block, self.tpp = inner.gi, inner.group, inner.block, inner.tpp
        self.footprint, self.tier_rules = ScopedFootprint(inner.footprint, self.mine), inner.tier_rules
        for flag in ("recompute_under_shared", "bounds_hit", "miss_reason", "needs_junction", "per_image",
                     "releases_at_next_allocate", "state_type"):
            setattr(self, flag, getattr(inner, flag))

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def mine(self, req: Request) -> bool:
        return self._of.get(req.request_id) == self.scope

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        return self.inner.longest_prefix(req, cand, ops) if self.mine(req) else cand

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        if self.mine(req):
            self.inner.hit(req, gs, p, ops)

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        return self.inner.plan(req, gs, end, ops) if self.mine(req) else 0

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        if self.mine(req):
            self.inner.grow(req, gs, end, ops)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        if self.mine(req):
            self.inner.commit(req, gs, ops)

    def step_end(self, req: Request, stop: int) -> int:
        return self.inner.step_end(req, stop) if self.mine(req) else stop

    def unfilled(self, req: Request, gs: GroupState, computed: int, ops: PageOps) -> list[int]:
        return self.inner.unfilled(req, gs, computed, ops) if self.mine(req) else []

    def rewind(self, req: Request, gs: GroupState, computed: int) -> None:
        if self.mine(req):
            self.inner.rewind(req, gs, computed)

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        if self.mine(req):
            self.inner.free(req, gs, ops)

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return self.inner.limit(req, gs, ops) if self.mine(req) else NEVER

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return self.inner.next_event(req, gs, ops) if self.mine(req) else NEVER

    def check(self, requests) -> None:
        self.inner.check([r for r in requests if self.mine(r)])


class ScopedFootprint:
    """``inner`` (a group's footprint) for the requests ``mine`` accepts; another model's request
    needs and holds nothing in vain there.  Questions about a length or a record are ``inner``'s."""

    def __init__(self, inner: Footprint, mine):
        self.inner, self.mine = inner, mine

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return self.inner.needed_tokens(req, gs) if self.mine(req) else 0

    def needed_bytes(self, req: Request, gs: GroupState) -> int:
        return self.inner.needed_bytes(req, gs) if self.mine(req) else 0

    def stale_pages(self, req: Request, gs: GroupState) -> int:
        return self.inner.stale_pages(req, gs) if self.mine(req) else 0

    def duplicate_pages(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return self.inner.duplicate_pages(req, gs, ops) if self.mine(req) else 0
