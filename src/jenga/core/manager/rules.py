"""``ManagerRules``: what a manager variant changes, handed to ``KVCacheManager`` whole.

jenga's own rules by default; a baseline (:mod:`jenga.baselines`) brings its own: the groups it
allocates (a transform of the model), each group's policy, its admission rule and eviction order,
per-group caps on large pages, and a step run before an allocation.  The manager calls them
where it builds its parts and in ``allocate``; no rule reaches into the manager's private state.
One instance per manager (a transform may keep what it derived, e.g. the page plan).
"""

from __future__ import annotations

from jenga.core.manager.admission import Admission
from jenga.core.pagesize import PagePlan, manager_page_plan, with_base_page
from jenga.core.policy.registry import Policy, policy_for
from jenga.core.specs import LayerGroup, ModelSpec


class ManagerRules:
    """jenga's rules (module doc).  ``page_plan``: the plan ``prepare_model`` followed (``None``
    when the pages were not fitted, or a variant transforms the model its own way)."""

    #: the admission rule (need, quota, fit) the manager builds
    admission_class: type[Admission] = Admission
    #: the eviction order when the caller names none
    default_eviction = "reuse"
    #: ``before_allocate(manager, req, num_new_tokens, num_lookahead) -> bool``, run before an
    #: ``allocate`` that needs new pages (``False``: that allocate returns ``None``, nothing
    #: changed); ``None``: nothing to run
    before_allocate = None

    def __init__(self):
        self.page_plan: PagePlan | None = None

    def prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        """The groups the manager really allocates: ``model`` on the base page, its pages fitted so
        the LCM large page stays within ``max_ratio`` x the largest page (``None``: not fitted)."""
        model = with_base_page(model, tokens_per_page)
        if max_ratio is None:
            return model
        self.page_plan = manager_page_plan(model, max_ratio)
        return self.page_plan.model

    def policy(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None) -> Policy:
        """The cache policy of group ``gi`` (``block``: the hash block; ``window_slack``: see
        :class:`jenga.core.policy.base.Policy`)."""
        return policy_for(gi, group, block, window_slack)

    def caps(self, model: ModelSpec, num_large: int) -> list[int] | None:
        """Per-group caps on the large pages a group may own at once (``None``: none)."""
        return None
