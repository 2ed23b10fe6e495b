"""Per-kind cache policies, chosen by spec type (``POLICIES``); a new layer type is a new
class registered here, with its footprint (``jenga.core.policy.footprint.FOOTPRINTS``) and tier
rules (``jenga.core.policy.tier_rules.TIER_RULES``).  The base class and its hooks are in
``jenga.core.policy.base``."""

from __future__ import annotations

from collections.abc import Callable

from jenga.core.policy.base import NEVER, OUT_OF_WINDOW_AGE, PageOps, Policy, cdiv
from jenga.core.policy.image import ImagePolicy, VisionPolicy
from jenga.core.policy.state import CopyForwardMambaPolicy, MambaPolicy
from jenga.core.policy.token import ChunkedPolicy, FullPolicy, SlidingPolicy
from jenga.core.specs import (
    ChunkedLocalSpec,
    CopyForwardMambaSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)

__all__ = ["NEVER", "OUT_OF_WINDOW_AGE", "POLICIES", "ChunkedPolicy", "CopyForwardMambaPolicy", "FullPolicy", "ImagePolicy", "MambaPolicy",
           "PageOps", "Policy", "SlidingPolicy", "VisionPolicy", "cdiv", "policy_for"]

#: spec type -> the policy class of a group of it; each is built as ``cls(gi, group, block, window_slack)``
POLICIES: dict[type, Callable[[int, LayerGroup, int, int | None], Policy]] = {
    FullAttentionSpec: FullPolicy,
    SlidingWindowSpec: SlidingPolicy,
    ChunkedLocalSpec: ChunkedPolicy,
    MambaSpec: MambaPolicy,
    CopyForwardMambaSpec: CopyForwardMambaPolicy,
    CrossAttentionSpec: ImagePolicy,
    VisionEmbeddingSpec: VisionPolicy,
}


def policy_for(gi: int, group: LayerGroup, block: int, window_slack: int | None = None) -> Policy:
    """The policy of ``group``'s spec type (exact type first, then its bases); ``window_slack``:
    see :class:`Policy`."""
    for cls in type(group.spec).__mro__:
        if cls in POLICIES:
            return POLICIES[cls](gi, group, block, window_slack)
    raise TypeError(f"no cache policy for spec type {type(group.spec).__name__}; register one in POLICIES")
