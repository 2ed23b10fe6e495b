"""What a host tier may keep and promote of a kind's pages.

A group's :class:`TierRules` answers the host tier's two questions (:mod:`jenga.core.tier`):
which evicted pages are worth demoting to host memory (``demotable``), and which keys a request
may hit outside its text prefix, to promote at lookup (``side_keys``).  The group's policy owns
one, chosen by ``TIER_RULES`` from the spec type.
"""

from __future__ import annotations

from collections.abc import Callable

from jenga.core.prefix.index import image_key
from jenga.core.request import Request
from jenga.core.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)


class TierRules:
    """Every evicted page can serve a hit; no key outside the text prefix (a state checkpoint:
    only pages that serve a hit are ever registered)."""

    def __init__(self, group: LayerGroup):
        self.tpp = group.tokens_per_page

    def demotable(self, release_times, aged_below: int):
        """Which of this group's evicted cached pages (released at ``release_times``, an int
        array) can still serve a hit, so a host tier keeps them (a bool array).  Pages released
        before ``aged_below`` left a window or chunk while their request ran on (no hit reads them
        except one ending right there).  Default: every page."""
        return release_times == release_times

    def side_keys(self, req: Request) -> list[bytes]:
        """Keys a request may hit outside its text prefix, found at allocate rather than by
        ``lookup`` (an image's pages); a host tier promotes them at lookup.  Default: none."""
        return []


class TokenTierRules(TierRules):
    """Token kinds: pages released while their request still ran (a window before a branch point,
    every full-attention page) serve hits; pages aged out of a window or chunk do not."""

    def demotable(self, release_times, aged_below: int):
        return release_times >= aged_below


class ImageTierRules(TierRules):
    """Image kinds: every page of an image; its keys are hit at allocate, whatever the text."""

    def side_keys(self, req: Request) -> list[bytes]:
        """Every page key of every image of the request."""
        tpp = self.tpp
        return [image_key(req.salt_root, img, i) for img in req.images for i in range(-(-img.num_tokens // tpp))]


#: spec type -> the tier rules of a group of it (exact type first, then its bases)
TIER_RULES: dict[type, Callable[[LayerGroup], TierRules]] = {
    FullAttentionSpec: TokenTierRules,
    SlidingWindowSpec: TokenTierRules,
    ChunkedLocalSpec: TokenTierRules,
    MambaSpec: TierRules,
    CrossAttentionSpec: ImageTierRules,
    VisionEmbeddingSpec: ImageTierRules,
}


def tier_rules_for(group: LayerGroup) -> TierRules:
    """``TIER_RULES``'s rules for ``group`` (exact spec type first, then its bases)."""
    for cls in type(group.spec).__mro__:
        if cls in TIER_RULES:
            return TIER_RULES[cls](group)
    raise TypeError(f"no tier rules for spec type {type(group.spec).__name__}; register them in TIER_RULES")
