"""Per-kind cache policies: what a group allocates, frees and accepts as a prefix hit.

Each kind is one class (``POLICIES`` maps spec type to class); a new layer type is a
new class.  The paper's three hooks appear as:

* ``get_possible_prefix`` -> :meth:`Policy.longest_prefix` (the longest valid hit no
  longer than a candidate; the manager iterates over groups to a common fixed point);
* ``update_last_access`` -> which pages keep the request's time: pages a request still
  holds get its last access when it frees them; pages that leave the window or chunk
  earlier are released at that moment, so they are older and go first;
* ``set_prefix_length`` -> the token position of a page's end, the same in every group
  (aligned eviction); all pages of one image share one length (where the image ends), so whole
  images are evicted before another is touched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from jenga.prefix.hashing import ImageRef, image_key
from jenga.request import GroupState, Request
from jenga.specs import (
    ChunkedLocalSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    LayerGroup,
    MambaSpec,
    SlidingWindowSpec,
    VisionEmbeddingSpec,
)
from jenga.tables import ImageTable, StateTable, TokenTable


class PageOps(ABC):
    """What a policy may do to pages; implemented by the manager."""

    now: int
    caching: bool
    out_of_range_age: int = 0

    @abstractmethod
    def take(self, group: int) -> int:
        """A fresh USED page for the request being allocated (inside ``allocate`` only)."""

    def take_run(self, group: int, n: int) -> list[int]:
        """``n`` fresh pages (``take`` repeated)."""
        return [self.take(group) for _ in range(n)]

    def drop_run(self, group: int, pages: list[int | None], start: int, stop: int, last_access: int,
                 tokens_per_page: int) -> None:
        """``drop`` each held page of ``pages[start:stop]`` (page i ends at token
        ``(i+1) * tokens_per_page``) and set it to None."""
        for i in range(start, stop):
            if pages[i] is not None:
                self.drop(group, pages[i], last_access, (i + 1) * tokens_per_page)
                pages[i] = None

    @abstractmethod
    def hold(self, group: int, page: int) -> None:
        """Add a reference to a registered page (a hit); CACHED pages become USED."""

    @abstractmethod
    def drop(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        """Remove a reference; at zero a registered page becomes CACHED with this key,
        an unregistered one FREE."""

    @abstractmethod
    def register(self, group: int, page: int, key: bytes) -> bool:
        """Offer a fully written page to the prefix index; False if the key is taken."""

    @abstractmethod
    def find(self, group: int, key: bytes) -> int | None:
        """The registered page holding ``key``, if any."""

    @abstractmethod
    def index_table(self, group: int) -> dict[bytes, int]:
        """The group's ``key -> page`` index (read only; for scans over many pages)."""


NEVER = 1 << 62
#: Default age of pages released because they left the window / chunk: stamped this much
#: older than "now", they are evicted before any page a request still held when it finished.
OUT_OF_RANGE_AGE = 1 << 40


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Policy(ABC):
    """Behaviour of one group.  ``gi`` is the group index, ``block`` the hash block size."""

    def __init__(self, gi: int, group: LayerGroup, block: int):
        self.gi, self.group, self.block = gi, group, block
        self.tpp = group.tokens_per_page
        self.token_bytes = group.useful_page_bytes // group.tokens_per_page

    @abstractmethod
    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        """Largest valid hit length ``<= cand`` for this group (0 is always valid)."""

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        """Hold the cached pages a hit of ``p`` tokens reuses; record them in ``gs``."""

    @abstractmethod
    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        """New pages needed so the request covers tokens ``[0, end)``.  May hold cached
        pages (recorded by the manager for rollback)."""

    @abstractmethod
    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        """Take the pages ``plan`` counted."""

    @abstractmethod
    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """``req.num_computed`` advanced: register full pages, release what left range."""

    @abstractmethod
    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """Drop every page the request holds, keyed by its last access."""

    @abstractmethod
    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        """Allocations ending strictly below this need no new page in this group."""

    @abstractmethod
    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        """``commit`` has work once ``req.num_computed`` reaches this position."""

    @abstractmethod
    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        """Tokens (or states) of this group the next step really reads."""

    def held_pages(self, gs: GroupState) -> int:
        return len(gs.pages) - gs.released  # pages below ``released`` are None, the rest held

    def needed_bytes(self, req: Request, gs: GroupState) -> int:
        return self.needed_tokens(req, gs) * self.token_bytes

    def stale_pages(self, req: Request, gs: GroupState) -> int:
        """Pages held although no token of the next step reads them."""
        return 0


class FullPolicy(Policy):
    """Every token stays; a hit needs every page before it."""

    def first_needed(self, pos: int) -> int:
        """Lowest token position a token at ``pos`` reads."""
        return 0

    def keep_from(self, pos: int) -> int:
        """Lowest token position a request that computed ``pos`` tokens still holds."""
        return self.first_needed(pos)

    def page_key(self, req: Request, i: int) -> bytes:
        return req.hashes[(i + 1) * (self.tpp // self.block) - 1]

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        tpp = self.tpp
        m = tpp // self.block
        hashes, table = req.hashes, ops.index_table(self.gi)
        j = cand // tpp  # try p = j * tpp: pages [first_needed(p) // tpp, j) must be cached
        while j > 0:
            lo = self.first_needed(j * tpp) // tpp
            i = j - 1
            while i >= lo and hashes[(i + 1) * m - 1] in table:
                i -= 1
            if i < lo:
                return j * tpp
            j = i  # any valid p must end at or below the miss
        return 0

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        n = p // self.tpp
        lo = self.first_needed(p) // self.tpp
        gs.pages = [None] * lo
        for i in range(lo, n):
            page = ops.find(self.gi, self.page_key(req, i))
            assert page is not None, f"group {self.gi}: hit page {i} vanished"
            ops.hold(self.gi, page)
            gs.pages.append(page)
        gs.registered, gs.released = n, lo

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        return max(0, cdiv(end, self.tpp) - len(gs.pages))

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        pages = gs.pages
        n = cdiv(end, self.tpp) - len(pages)
        if n > 0:
            pages.extend(ops.take_run(self.gi, n))
        if gs.table is None:
            gs.table = TokenTable(self.gi, self.tpp, pages)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        tpp, pages, gi = self.tpp, gs.pages, self.gi
        if ops.caching:
            full = min(req.num_computed // tpp, len(req.hashes) * self.block // tpp, len(pages))
            for i in range(gs.registered, full):
                if pages[i] is not None:
                    ops.register(gi, pages[i], self.page_key(req, i))
            gs.registered = max(gs.registered, full)
        lo = self.keep_from(req.num_computed) // tpp
        if lo > gs.released:  # out of window / chunk: the first pages to be evicted
            ops.drop_run(gi, pages, gs.released, min(lo, len(pages)), ops.now - ops.out_of_range_age, tpp)
            gs.released = lo

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        ops.drop_run(self.gi, gs.pages, gs.released, len(gs.pages), req.last_access, self.tpp)
        gs.pages.clear()

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return len(gs.pages) * self.tpp + 1

    def release_point(self, released: int) -> int:
        """Smallest computed length at which page ``released`` is no longer read."""
        return NEVER

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        reg = (gs.registered + 1) * self.tpp if ops.caching else NEVER
        return min(reg, self.release_point(gs.released))

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return req.num_computed - self.first_needed(req.num_computed)

    def stale_pages(self, req: Request, gs: GroupState) -> int:
        lo = min(self.first_needed(req.num_computed) // self.tpp, len(gs.pages))
        return max(0, lo - gs.released)


class SlidingPolicy(FullPolicy):
    """Only the last ``window`` tokens are read: a hit needs just those pages; pages
    leave at commit time (even mid-prefill) and go to the evictor as older entries."""

    def first_needed(self, pos: int) -> int:
        return max(0, pos - self.group.spec.window + 1)

    #: tokens below the window a request keeps holding (set by the manager; vLLM v1 keeps W + 192)
    slack = 0

    def keep_from(self, pos: int) -> int:
        # a band of ``slack`` tokens below the window stays held, so a later prompt that ends
        # a little earlier (another question on the same article) still finds the whole
        # window it needs, with the request's own priority
        return max(0, pos - self.group.spec.window + 1 - self.slack)

    def release_point(self, released: int) -> int:
        # rounded up to a page end, so releases ride on the registration commit
        first = (released + 1) * self.tpp + self.group.spec.window - 1 + self.slack
        return cdiv(first, self.tpp) * self.tpp


class ChunkedPolicy(FullPolicy):
    """Tokens read only their own chunk: earlier chunks are released as soon as done."""

    def first_needed(self, pos: int) -> int:
        return pos - pos % self.group.spec.chunk

    def release_point(self, released: int) -> int:
        return cdiv((released + 1) * self.tpp, self.group.spec.chunk) * self.group.spec.chunk


class MambaPolicy(Policy):
    """One running state plus checkpoints every ``checkpoint_interval`` tokens (hits only
    there).  Checkpoints are cached as soon as written; the request keeps only its work
    page."""

    def __init__(self, gi: int, group: LayerGroup, block: int):
        super().__init__(gi, group, block)
        self.every = group.spec.checkpoint_interval
        assert self.every % block == 0, f"checkpoint interval {self.every} not a multiple of block {block}"
        self.token_bytes = 0

    def key(self, req: Request, pos: int) -> bytes:
        return req.hashes[pos // self.block - 1]

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        p = cand - cand % self.every
        while p > 0 and ops.find(self.gi, self.key(req, p)) is None:
            p -= self.every
        return p

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        if p > 0:
            page = ops.find(self.gi, self.key(req, p))
            assert page is not None, f"group {self.gi}: checkpoint {p} vanished"
            ops.hold(self.gi, page)
            gs.read, gs.read_pos = page, p

    def _new_checkpoints(self, req: Request, end: int) -> range:
        """Checkpoint positions in ``(start, end - lookahead]``."""
        first = req.start // self.every + 1
        return range(first * self.every, end - req.num_lookahead + 1, self.every)

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        n = 1 if gs.work is None else 0
        if ops.caching:
            n += len(self._new_checkpoints(req, end))
        return n

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        if gs.work is None:
            gs.work = ops.take(self.gi)
            gs.table = StateTable(self.gi, gs.work, gs.read, gs.checkpoints)
        if ops.caching:
            for pos in self._new_checkpoints(req, end):
                gs.checkpoints[pos] = ops.take(self.gi)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        done = [pos for pos in gs.checkpoints if pos <= req.num_computed]
        for pos in done:
            page = gs.checkpoints.pop(pos)
            if pos // self.block <= len(req.hashes):
                ops.register(self.gi, page, self.key(req, pos))
            ops.drop(self.gi, page, ops.now, pos)
        if gs.read is not None:
            ops.drop(self.gi, gs.read, ops.now, gs.read_pos)
            gs.read = None
            gs.table.read_page = None

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for pos, page in gs.checkpoints.items():
            ops.drop(self.gi, page, req.last_access, pos)
        gs.checkpoints.clear()
        if gs.read is not None:
            ops.drop(self.gi, gs.read, req.last_access, gs.read_pos)
            gs.read = None
        if gs.work is not None:
            ops.drop(self.gi, gs.work, req.last_access, req.num_computed)
            gs.work = None

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.work is None:
            return 0
        return (req.start // self.every + 1) * self.every if ops.caching else NEVER

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.read is not None:
            return 0
        return min(gs.checkpoints, default=NEVER)

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return 1 if gs.work is not None else 0

    def needed_bytes(self, req: Request, gs: GroupState) -> int:
        return self.group.useful_page_bytes if gs.work is not None else 0

    def held_pages(self, gs: GroupState) -> int:
        return (gs.work is not None) + (gs.read is not None) + len(gs.checkpoints)


class ImagePolicy(Policy):
    """Pages per image (cross-attention KV over encoder tokens): each image's pages are
    shared by every request showing it, whatever the text prefix; all pages of an image
    carry one prefix length, so images are evicted whole."""

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        return cand  # independent of the text prefix

    def image_len(self, img: ImageRef) -> int:
        """One prefix length for every page of an image: the text position where the image
        ends, so images line up with the text around them and leave whole."""
        return img.offset + img.num_tokens

    def wanted(self, req: Request, gs: GroupState, end: int) -> list[int]:
        """Images that must be held for an allocation reaching ``end``."""
        if gs.initialized:
            return []
        return list(range(len(req.images)))

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        need = 0
        for j in self.wanted(req, gs, end):
            img = req.images[j]
            n = cdiv(img.num_tokens, self.tpp)
            found = [ops.find(self.gi, image_key(img, i)) for i in range(n)] if ops.caching else [None]
            if all(p is not None for p in found):
                for p in found:
                    ops.hold(self.gi, p)
                gs.pending[j] = found
            else:
                gs.pending[j] = None
                need += n
        return need

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        for j, pages in gs.pending.items():
            if pages is None:
                pages = [ops.take(self.gi) for _ in range(cdiv(req.images[j].num_tokens, self.tpp))]
                gs.to_fill.add(j)
            gs.image_pages[j] = pages
        gs.pending.clear()
        gs.initialized = True
        if gs.table is None:
            gs.table = ImageTable(self.gi, self.tpp, gs.image_pages, gs.to_fill)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for j in list(gs.to_fill):
            img = req.images[j]
            if ops.caching:
                for i, page in enumerate(gs.image_pages[j]):
                    ops.register(self.gi, page, image_key(img, i))
        gs.to_fill.clear()

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for j, pages in gs.image_pages.items():
            for page in pages:
                ops.drop(self.gi, page, req.last_access, self.image_len(req.images[j]))
        gs.image_pages.clear()

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return NEVER if gs.initialized else 0

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return 0 if gs.to_fill else NEVER

    def needed_tokens(self, req: Request, gs: GroupState) -> int:
        return sum(req.images[j].num_tokens for j in gs.image_pages)

    def held_pages(self, gs: GroupState) -> int:
        return sum(len(p) for p in gs.image_pages.values())


class VisionPolicy(ImagePolicy):
    """Vision embeddings of in-sequence image tokens: an image's pages are taken when
    prefill reaches it and released (cached by image) once all its tokens are consumed."""

    def wanted(self, req: Request, gs: GroupState, end: int) -> list[int]:
        start = req.start
        return [j for j, img in enumerate(req.images)
                if img.offset < end and img.offset + img.num_tokens > start and j not in gs.image_pages]

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        super().commit(req, gs, ops)
        for j in [j for j in gs.image_pages if sum(req.images[j][:2]) <= req.num_computed]:
            for page in gs.image_pages.pop(j):
                ops.drop(self.gi, page, ops.now, self.image_len(req.images[j]))

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        start = req.start
        later = [img.offset for j, img in enumerate(req.images)
                 if j not in gs.image_pages and img.offset + img.num_tokens > start]
        return min(later) + 1 if later else NEVER

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.to_fill:
            return 0
        return min((sum(req.images[j][:2]) for j in gs.image_pages), default=NEVER)


POLICIES: dict[type, Callable[[int, LayerGroup, int], Policy]] = {
    FullAttentionSpec: FullPolicy,
    SlidingWindowSpec: SlidingPolicy,
    ChunkedLocalSpec: ChunkedPolicy,
    MambaSpec: MambaPolicy,
    CrossAttentionSpec: ImagePolicy,
    VisionEmbeddingSpec: VisionPolicy,
}


def policy_for(gi: int, group: LayerGroup, block: int) -> Policy:
    """The policy of ``group``'s spec type (exact type first, then its bases)."""
    for cls in type(group.spec).__mro__:
        if cls in POLICIES:
            return POLICIES[cls](gi, group, block)
    raise TypeError(f"no cache policy for spec type {type(group.spec).__name__}; register one in POLICIES")
