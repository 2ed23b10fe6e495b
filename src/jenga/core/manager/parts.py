"""The manager's parts, built and wired together in one place.

``build_parts`` makes what :class:`jenga.core.manager.manager.KVCacheManager` owns and calls: the
clock, the pool's per-page arrays, the prefix index, one policy per group, the host tier (when it
has pages: built on the index, the clock and the policies), the evictor (built on the arrays and
the index, the host tier its listener), the allocator (handed the evictor it evicts through), the
ledger (the ``PageOps`` the policies call), admission, the prompt hasher, the prefix lookup, the
step commit, byte accounting, hit counts and the request intake.  Each part is handed the others
it calls as constructor arguments; nothing is set after construction and no part wires itself
into another (the host tier is handed the device ledger by the calls that move device pages).
``check_choices`` validates the named choices before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from jenga.core.alloc.allocator import LargePageAllocator, PageViews
from jenga.core.clock import Clock
from jenga.core.evict.evictor import PrefixEvictor, ReuseEvictor
from jenga.core.evict.predicted import PredictedEvictor
from jenga.core.manager.accounting import ByteAccounting
from jenga.core.manager.admission import Admission, HitCounts
from jenga.core.manager.commit import StepCommit
from jenga.core.manager.intake import RequestIntake
from jenga.core.manager.ledger import PageLedger
from jenga.core.manager.lookup import PrefixLookup
from jenga.core.manager.pool import large_page_count
from jenga.core.manager.rules import ManagerRules
from jenga.core.policy.registry import Policy
from jenga.core.prefix.index import PrefixIndex, PromptHasher
from jenga.core.specs import ModelSpec
from jenga.core.tier.host_tier import HOST_POLICIES, HostTier, host_page_count
from jenga.errors import InvalidArgumentError

#: eviction orders: plain LRU by (release time, -prefix length), use-count classes, or the classes
#: of a next-use predictor (:mod:`jenga.core.evict.predicted`); each class names the options it
#: takes (``options_class``)
EVICTORS = {"lru": PrefixEvictor, "reuse": ReuseEvictor, "predict": PredictedEvictor}


def check_choices(eviction: str, host_policy: str, eviction_options: object = None) -> None:
    """Raise ``InvalidArgumentError`` on an unknown eviction order or host policy, or on
    ``eviction_options`` that are not the options that order takes (``None``: its defaults)."""
    if host_policy not in HOST_POLICIES:
        raise InvalidArgumentError(f"unknown host_policy {host_policy!r}; choose one of {list(HOST_POLICIES)}")
    if eviction not in EVICTORS:
        raise InvalidArgumentError(f"unknown eviction policy {eviction!r}; choose one of {sorted(EVICTORS)}")
    wanted = EVICTORS[eviction].options_class
    if eviction_options is not None and type(eviction_options) is not wanted:
        takes = "no options" if wanted is None else f"{wanted.__name__} options"
        raise InvalidArgumentError(f"eviction {eviction!r} takes {takes}, got {type(eviction_options).__name__}")


@dataclass(frozen=True)
class ManagerParts:
    """What a manager owns (module doc)."""

    alloc: LargePageAllocator
    index: PrefixIndex
    evictor: PrefixEvictor
    ledger: PageLedger
    clock: Clock
    policies: list[Policy]
    admission: Admission
    hasher: PromptHasher
    host: HostTier | None
    lookup: PrefixLookup
    commit: StepCommit
    accounting: ByteAccounting
    hits: HitCounts
    intake: RequestIntake


def build_parts(model: ModelSpec, source_model: ModelSpec, memory_bytes: int, host_memory_bytes: int | None, *,
                block: int, caching: bool, eviction: str, out_of_window_age: int, window_slack: int | None,
                host_policy: str, rules: ManagerRules, eviction_options: object = None) -> ManagerParts:
    """Build and wire the parts of a manager of ``model`` (the groups it allocates; ``source_model``:
    the one it was given) over the large pages ``memory_bytes`` holds (and ``host_memory_bytes`` on the
    host; ``None``: no host tier; raises when a budget holds no large page).  ``rules`` make each
    group's policy, the admission rule and the per-group caps (baselines bring their own);
    ``eviction_options`` (checked by :func:`check_choices`) go to the evictor's constructor."""
    num_large = large_page_count(memory_bytes, model.large_page_bytes)
    num_host_large = 0 if host_memory_bytes is None else host_page_count(host_memory_bytes, model.large_page_bytes)
    pages = PageViews.of([g.page_bytes for g in model.groups], num_large)  # the pool's per-page arrays
    index = PrefixIndex(len(model.groups))
    sizes = [num_large * k for k in pages.small_per_large]
    index.track_pages(sizes)  # registered flags for bulk frees
    if EVICTORS[eviction].counts_uses:
        index.track_uses(sizes)
    clock = Clock()  # one tick per allocate: the ledger's time, and the host tier's
    policies = [rules.policy(i, g, block, window_slack) for i, g in enumerate(model.groups)]
    host = None  # the host tier (:mod:`jenga.core.tier.host_tier`): told of every eviction
    if num_host_large:
        host = HostTier([g.page_bytes for g in model.groups], num_host_large, index, clock, policies,
                        out_of_window_age=out_of_window_age, policy=host_policy)
    # reads the pages; the allocator owns it and evicts through it
    order = EVICTORS[eviction]
    evictor = order(pages, index, host) if eviction_options is None else order(pages, index, host, eviction_options)
    alloc = LargePageAllocator(pages, evictor, caps=rules.caps(model, num_large))
    ledger = PageLedger(alloc, index, evictor, caching=caching, out_of_window_age=out_of_window_age, clock=clock)
    admission = rules.admission_class(policies, alloc, index, evictor, ledger, block)
    hasher = PromptHasher(policies, block)  # bounds how far a lookup hashes
    # a lookup's promotion of host pages follows admission's rule for the requests admitted now
    lookup = PrefixLookup(policies, block, caching, hasher, ledger, index, host,
                          lambda need: admission.promotion_quota(need, admission.admitted))
    commit = StepCommit(policies, ledger, hasher, index, block, caching)
    accounting = ByteAccounting(policies, ledger, model)
    hits = HitCounts()  # prompt tokens looked up / found cached
    # images are text spans (must lie inside the prompt) when some group embeds them in-sequence
    in_sequence = any(g.kind == "vision" for g in source_model.groups)
    intake = RequestIntake(policies, block, caching, model.max_model_len, in_sequence, hasher, hits)
    return ManagerParts(alloc, index, evictor, ledger, clock, policies, admission, hasher, host, lookup, commit, accounting,
                        hits, intake)
