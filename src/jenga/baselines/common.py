"""What baselines share: measuring waste against the real model's needs.

A baseline keeps more than the model reads (every token of a sliding layer, a padded state) or
pads more; its waste is the bytes it holds minus what the *real* model needs.  The real model's
record of a request is built per spec type (``TRUE_RECORD``): token kinds hold the tokens their
policy says the next step reads (the rest of the computed tokens are stale), a state kind one
state once started, cross attention every image once started; vision embeddings are outside
the KV pool in these baselines.
"""

from __future__ import annotations

from collections.abc import Callable

from jenga.core.manager.accounting import RealGroup
from jenga.core.manager.manager import KVCacheManager
from jenga.core.manager.rules import ManagerRules
from jenga.core.pagesize import with_base_page
from jenga.core.policy.registry import Policy, policy_for
from jenga.core.request import CheckpointState, GroupState, ImageState, Request, TokenState
from jenga.core.specs import AttentionSpec, CrossAttentionSpec, MambaSpec, ModelSpec, VisionEmbeddingSpec

#: spec type -> (the real model's record of a request, started or not; whether the group keeps
#: tokens, so computed tokens it does not need are stale), or None: not in the KV pool here
TRUE_RECORD: dict[type, tuple[Callable[[Request, bool], GroupState], bool] | None] = {
    AttentionSpec: (lambda req, started: TokenState(), True),
    CrossAttentionSpec: (lambda req, started: ImageState(
        image_pages={j: [] for j in range(len(req.images))} if started else {}), False),
    MambaSpec: (lambda req, started: CheckpointState(work=0 if started else None), False),
    VisionEmbeddingSpec: None,
}


#: spec type -> how the baselines' model transforms (paged, uniform) store a group of it: "tokens"
#: (attention: pages of tokens), "images" (cross attention: pages of image tokens, also attention),
#: "state" (one state per request), or None (vision embeddings: outside the KV pool)
STORED_AS: dict[type, str | None] = {
    AttentionSpec: "tokens",
    CrossAttentionSpec: "images",
    MambaSpec: "state",
    VisionEmbeddingSpec: None,
}


def by_spec_type(table: dict[type, object], spec: object):
    """``table``'s entry for the spec's type: the exact type first, then its bases."""
    for cls in type(spec).__mro__:
        if cls in table:
            return table[cls]
    raise TypeError(f"no entry for spec type {type(spec).__name__}")


def true_record(spec: object) -> tuple[Callable[[Request, bool], GroupState], bool] | None:
    """``TRUE_RECORD``'s entry for the spec's type (its nearest registered base)."""
    return by_spec_type(TRUE_RECORD, spec)


def stored_as(spec: object) -> str | None:
    """``STORED_AS``'s entry for the spec's type (its nearest registered base)."""
    return by_spec_type(STORED_AS, spec)


class TrueNeedsRules(ManagerRules):
    """A baseline's rules that transform the model: they keep the real model's policies and
    records too (``remember_true_model``, from their ``prepare_model``), which measure its needs."""

    default_eviction = "lru"  # the systems these baselines stand for evict LRU

    def remember_true_model(self, model: ModelSpec, tokens_per_page: int) -> None:
        self.true_model = with_base_page(model, tokens_per_page)
        self.true_policies: list[Policy] = [policy_for(i, g, tokens_per_page)
                                            for i, g in enumerate(self.true_model.groups)]
        self.true_records = [true_record(pol.group.spec) for pol in self.true_policies]


class TrueNeedsManager(KVCacheManager):
    """Waste of a baseline = bytes it holds - bytes the *real* model needs (every
    baseline keeps more, or pads more, than the model reads)."""

    rules_class = TrueNeedsRules

    def real_groups(self) -> list[RealGroup]:
        """The real model's groups, each token group stored in this manager's token groups that
        hold its layers (its tokens in the baseline's page tables, a shared page counted once);
        the rest, or a group whose layers this layout renumbered, counted per request."""
        rules, out = self.rules, []
        stored = [(gi, set(g.layers)) for gi, g in enumerate(self.model.groups) if stored_as(g.spec) == "tokens"]
        for pol, record in zip(rules.true_policies, rules.true_records, strict=True):
            if record is None:
                continue  # outside the KV pool in these baselines
            make, keeps_tokens = record
            parts: tuple[tuple[int, int], ...] = ()
            if keeps_tokens and stored_as(pol.group.spec) == "tokens":
                mine = set(pol.group.layers)
                parts = tuple((gi, len(mine & layers)) for gi, layers in stored if mine & layers)
                if sum(n for _, n in parts) != len(mine):
                    parts = ()
            out.append(RealGroup(pol, lambda req, make=make: make(req, req.tables is not None), parts))
        return out

    def request_accounting(self, req: Request) -> tuple[int, int, int, int]:
        held, _, _, padding = super().request_accounting(req)
        needed = stale = 0
        started = req.tables is not None
        rules = self.rules
        for pol, record in zip(rules.true_policies, rules.true_records, strict=True):
            if record is None:
                continue  # outside the KV pool in these baselines
            make, keeps_tokens = record
            gs = make(req, started)
            needed += pol.footprint.needed_bytes(req, gs)
            if keeps_tokens:
                stale += (req.num_computed - pol.footprint.needed_tokens(req, gs)) * pol.footprint.token_bytes
        stale = min(stale, max(0, held - needed - padding))
        return held, needed, stale, padding
