"""What a kind keeps and reads: the window rule and the page counts built on it.

A group's :class:`Footprint` answers read-only questions about a length or a request's record:
which tokens a step reads (``first_needed``, ``release_point``), how many pages a request of a
length holds (``context_pages``, ``peak_pages``) and how many a record holds, needs or holds in
vain (``held_pages``, ``needed_tokens``, ``stale_pages``, ``duplicate_pages``).  Accounting,
capacity planning, admission's floors and the simulator's costing (``first_needed_array``) ask it; the group's policy
asks it too (it owns one, chosen by ``FOOTPRINTS`` from the spec type) and never the other way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from math import lcm

import numpy as np

from jenga.core.flat_arrays import BULK, int64s, view
from jenga.core.request import GroupState, Request
from jenga.core.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)

NEVER = 1 << 62


class Footprint(ABC):
    """One group's sizes (module doc).  ``gi`` is the group index, ``block`` the hash block size;
    ``token_bytes`` the bytes one token of the group needs (0 for a state kind)."""

    def __init__(self, gi: int, group: LayerGroup, block: int):
        self.gi, self.group, self.block = gi, group, block
        self.tpp = group.tokens_per_page
        self.token_bytes = group.useful_page_bytes // group.tokens_per_page

    def first_needed(self, pos: int) -> int | None:
        """Token kinds: the lowest token position a token at ``pos`` reads (a window's or chunk's
        start).  Other kinds (state, image): ``None``."""
        return None

    def plan_key(self, gs) -> object:
        """Everything of group state ``gs`` that the kind's ``Policy.plan`` and ``peak_plan`` read,
        as one value, where they read nothing else but their ``end`` and ``step`` (nothing of the
        request, of other requests or of the pool): equal values, equal answers (a memo's key,
        ``Admission.hit_cannot_fit``).  Default ``None``: they read more (no memo)."""
        return None

    def context_pages(self, length: int) -> int:
        """Small pages this group holds for one text-only request of ``length`` tokens that is
        about to compute its next token (``jenga.capacity``).  Image kinds: 0."""
        return 0

    def peak_pages(self, length: int, step: int = 1) -> int:
        """Most small pages this group holds at any step of a request computing its tokens
        ``0 .. length`` in steps of at most ``step`` tokens (one token a step: ``context_pages``
        of each length up to ``length``)."""
        return self.context_pages(length)

    @abstractmethod
    def held_pages(self, gs: GroupState) -> int:
        """Pages the record holds (one per reference)."""

    @abstractmethod
    def references(self, gs: GroupState, images: bool = True) -> list[int]:
        """Every page the record holds a reference to, once per reference (``check_integrity``);
        ``images=False`` leaves out per-image pages (a request showing an image twice holds its
        cached pages once per occurrence)."""

    @abstractmethod
    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        """Tokens (or states) of this group the next step really reads."""

    def needed_bytes(self, req: Request, gs: GroupState) -> int:
        """Bytes of this group the next step really reads."""
        return self.needed_tokens(req, gs) * self.token_bytes

    def stale_pages(self, req: Request, gs: GroupState) -> int:
        """Pages held although no token of the next step reads them."""
        return 0

    def duplicate_pages(self, req: Request, gs: GroupState, ops) -> int:
        """Held pages of ``req`` whose content another held page has (duplicate prefix copies)."""
        return 0


class TokenFootprint(Footprint):
    """Full attention: every token stays, a token reads every one before it."""

    def first_needed(self, pos: int) -> int:
        return 0

    def first_needed_array(self, pos: np.ndarray) -> np.ndarray:
        """``first_needed`` of each position of an int array (the simulator's batch of requests)."""
        return np.zeros_like(pos)

    def release_point(self, released: int) -> int:
        """Smallest computed length at which page ``released`` is no longer read."""
        return NEVER

    def plan_key(self, gs) -> object:
        # ``plan``: the held pages' count; ``peak_plan``: that and ``held_pages`` (the released ones)
        return len(gs.pages), gs.released

    def step_pages(self, start: int, stop: int) -> int:
        """Pages a request holds while one step computes its tokens ``[start, stop)``
        (``stop > start``): from the page of the first position ``start`` reads to the page of
        ``stop - 1`` (pages below left at the commit before the step)."""
        return (stop - 1) // self.tpp - self.first_needed(start) // self.tpp + 1

    def context_pages(self, length: int) -> int:
        return self.step_pages(length, length + 1)  # up to the next token's page

    def peak_pages(self, length: int, step: int = 1) -> int:
        """Over the steps of at most ``step`` tokens (``step_pages``), the count at a step
        starting at ``l + P`` is at least the count at ``l`` (``P``: the page for a full or
        sliding group, ``lcm(chunk, page)`` for a chunked one) while a whole step fits before
        ``length + 1``, and past the last such start ``last`` only the start moves up (the count
        only falls): so ``last`` and the starts ``peak_candidates(last, step)`` names hold the peak."""
        last = max(0, length + 1 - step)
        out = self.step_pages(last, min(last + step, length + 1))
        for n in self.peak_candidates(last, step):
            out = max(out, self.step_pages(n, n + step))
        return out

    def peak_candidates(self, length: int, step: int) -> range | list[int]:
        """Step starts below ``length`` where a step of ``step`` tokens may hold more pages than
        the step starting at ``length`` (every token stays: none)."""
        return range(0)

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return req.num_computed - self.first_needed(req.num_computed)

    def held_pages(self, gs: GroupState) -> int:
        return len(gs.pages) - gs.released  # pages below ``released`` are None, the rest held

    def references(self, gs: GroupState, images: bool = True) -> list[int]:
        return [p for p in gs.pages if p is not None]

    def stale_pages(self, req: Request, gs: GroupState) -> int:
        lo = min(self.first_needed(req.num_computed) // self.tpp, len(gs.pages))
        return max(0, lo - gs.released)

    def duplicate_pages(self, req: Request, gs: GroupState, ops) -> int:
        """Held pages that are a second copy of a prefix page another live request holds
        (the request recomputed a prefix whose cached copy it could not use)."""
        if not gs.pages:
            return 0
        gi, pages, m = self.gi, gs.pages, self.tpp // self.block
        table, registered, ref = ops.index_table(gi), ops.index.flags[gi], ops.ref[gi]
        hashes, n = req.hashes, 0
        lo, hi = gs.released, min(len(pages), len(hashes) // m, req.num_computed // self.tpp)
        if hi - lo > BULK and None not in pages[lo:hi]:  # one gather finds the unregistered pages
            unregistered = (lo + j for j in np.flatnonzero(view(registered)[int64s(pages[lo:hi])] == 0).tolist())
        else:
            unregistered = (i for i in range(lo, hi) if pages[i] is not None and not registered[pages[i]])
        for i in unregistered:
            other = table.get(hashes[(i + 1) * m - 1])
            if other is not None and other != pages[i] and ref[other] > 0:
                n += 1
        return n


class WindowFootprint(TokenFootprint):
    """Sliding window: a token reads the last ``window`` tokens."""

    def first_needed(self, pos: int) -> int:
        return max(0, pos - self.group.spec.window + 1)

    def first_needed_array(self, pos: np.ndarray) -> np.ndarray:
        return np.maximum(pos - (self.group.spec.window - 1), 0)

    def release_point(self, released: int) -> int:
        # rounded up to a page end, so releases ride on the registration commit
        first = (released + 1) * self.tpp + self.group.spec.window - 1
        return -(-first // self.tpp) * self.tpp

    def peak_candidates(self, length: int, step: int) -> list[int]:
        """Among the last page's lengths below ``length`` (fewer than a page of starts), a step's
        last page ``(n + step - 1) // tpp`` rises at most once and its first page never falls: the
        count peaks at the first start or where the last page rises."""
        lo = max(0, length - self.tpp + 1)
        rise = lo + -(lo + step - 1) % self.tpp  # the first start >= lo whose step ends a page later
        return [lo, rise] if rise < length else [lo] if lo < length else []


class ChunkFootprint(TokenFootprint):
    """Chunked local attention: a token reads its own chunk."""

    def first_needed(self, pos: int) -> int:
        return pos - pos % self.group.spec.chunk

    def first_needed_array(self, pos: np.ndarray) -> np.ndarray:
        return self.first_needed(pos)  # the same arithmetic on an array

    def release_point(self, released: int) -> int:
        return -(-((released + 1) * self.tpp) // self.group.spec.chunk) * self.group.spec.chunk

    def peak_candidates(self, length: int, step: int) -> range:
        """Within one chunk a step's count only grows with its start: the peak is at ``length``
        or a chunk's last token."""
        chunk = self.group.spec.chunk
        return range(length - length % chunk - 1, max(-1, length - lcm(chunk, self.tpp)), -chunk)


class StateFootprint(Footprint):
    """A running state (plus checkpoints): one state read a step, whatever the length."""

    def __init__(self, gi: int, group: LayerGroup, block: int):
        super().__init__(gi, group, block)
        self.token_bytes = 0

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return 1 if gs.work is not None or gs.read is not None else 0

    def needed_bytes(self, req: Request, gs: GroupState) -> int:
        return self.group.useful_page_bytes * self.needed_tokens(req, gs)

    def held_pages(self, gs: GroupState) -> int:
        return (gs.work is not None) + (gs.read is not None) + len(gs.checkpoints)

    def references(self, gs: GroupState, images: bool = True) -> list[int]:
        return [p for p in (gs.work, gs.read) if p is not None] + list(gs.checkpoints.values())

    def context_pages(self, length: int) -> int:
        return 1  # the running state


class ImageFootprint(Footprint):
    """Pages per image: a request reads the tokens of the images it holds."""

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return sum(req.images[j].num_tokens for j in gs.image_pages)

    def held_pages(self, gs: GroupState) -> int:
        return sum(len(p) for p in gs.image_pages.values())

    def references(self, gs: GroupState, images: bool = True) -> list[int]:
        if not images:
            return []
        out = [p for pages in gs.image_pages.values() for p in pages]
        out.extend(p for pages in gs.pending.values() for p in pages or ())
        return out


#: spec type -> the footprint of a group of it (exact type first, then its bases)
FOOTPRINTS: dict[type, Callable[[int, LayerGroup, int], Footprint]] = {
    FullAttentionSpec: TokenFootprint,
    SlidingWindowSpec: WindowFootprint,
    ChunkedLocalSpec: ChunkFootprint,
    MambaSpec: StateFootprint,
    CrossAttentionSpec: ImageFootprint,
    VisionEmbeddingSpec: ImageFootprint,
}


def footprint_for(gi: int, group: LayerGroup, block: int) -> Footprint:
    """``FOOTPRINTS``'s footprint for group ``gi`` (exact spec type first, then its bases)."""
    for cls in type(group.spec).__mro__:
        if cls in FOOTPRINTS:
            return FOOTPRINTS[cls](gi, group, block)
    raise TypeError(f"no footprint for spec type {type(group.spec).__name__}; register one in FOOTPRINTS")
