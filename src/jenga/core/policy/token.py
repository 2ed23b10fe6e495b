"""Token kinds: full attention, sliding window, chunked local attention."""

from __future__ import annotations

from jenga.core.policy.base import NEVER, UNTIL_FREE, PageOps, Policy
from jenga.core.request import GroupState, Request, TokenState
from jenga.core.specs import LayerGroup
from jenga.core.tables import TokenTable


class FullPolicy(Policy):
    """Every token stays; a hit needs every page before it."""

    state_type = TokenState

    bounds_hit = True

    def page_key(self, req: Request, i: int) -> bytes:
        return req.hashes[(i + 1) * (self.tpp // self.block) - 1]

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        tpp = self.tpp
        m = tpp // self.block
        hashes, table = req.hashes, ops.index_table(self.gi)
        j = cand // tpp  # try p = j * tpp: pages [first_needed(p) // tpp, j) must be cached
        if type(self) is FullPolicy:  # every page from 0: the hit ends at the first miss
            found = list(map(table.__contains__, hashes[m - 1:j * m:m]))
            return (found.index(False) if not all(found) else j) * tpp
        while j > 0:
            lo = self.footprint.first_needed(j * tpp) // tpp
            i = j - 1
            while i >= lo and hashes[(i + 1) * m - 1] in table:
                i -= 1
            if i < lo:
                return j * tpp
            j = i  # any valid p must end at or below the miss
        return 0

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        n = p // self.tpp
        lo = self.footprint.first_needed(p) // self.tpp
        table, m, hashes = ops.index_table(self.gi), self.tpp // self.block, req.hashes
        found = list(map(table.get, hashes[lo * m + m - 1:n * m:m]))
        assert None not in found, f"group {self.gi}: a hit page vanished"
        ops.hold_run(self.gi, found)
        gs.pages = [None] * lo + found
        gs.registered, gs.released = n, lo

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        return max(0, -(-end // self.tpp) - len(gs.pages))

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        pages = gs.pages
        if gs.table is None:  # the hit's pages (shared, maybe past req.hit) are never written
            gs.table = TokenTable(self.gi, self.tpp, pages, len(pages) * self.tpp)
        n = -(-end // self.tpp) - len(pages)
        if n > 0:
            pages.extend(ops.take_run(self.gi, n))
        if ops.caching:  # findable from allocation on: a request admitted later in this step shares them
            self.register_upto(req, gs, end - req.num_lookahead, ops)

    def register_upto(self, req: Request, gs: GroupState, pos: int, ops: PageOps) -> None:
        """Offer the index every held page of a full block of known tokens below ``pos``.

        Called at allocate with the step's end (the engine writes the whole batch's K/V
        before attention in each layer, so a page filled in this step may serve another
        request of the same step) and at commit; ``unfilled`` undoes it when the fill is
        aborted."""
        tpp, pages, gi = self.tpp, gs.pages, self.gi
        full = min(pos // tpp, len(req.hashes) * self.block // tpp, len(pages))
        lo, m = gs.registered, tpp // self.block
        if full > lo:  # page i's key is page_key(req, i)
            ops.register_run(gi, pages[lo:full], req.hashes[(lo + 1) * m - 1:full * m:m])
        gs.registered = max(gs.registered, full)

    def unfilled(self, req: Request, gs: GroupState, computed: int, ops: PageOps) -> list[int]:
        """Pages this request registered whose tokens are not all computed: ``computed`` is
        where the committed tokens end after a fill was aborted (a free or a rejection
        before the step's commit).  ``rewind`` then forgets them."""
        table, pages, out = ops.index_table(self.gi), gs.pages, []
        lo = max(computed, gs.table.write_from if gs.table is not None else 0) // self.tpp
        for i in range(max(lo, gs.released), min(gs.registered, len(pages))):
            page = pages[i]
            if page is not None and table.get(self.page_key(req, i)) == page:
                out.append(page)
        return out

    def rewind(self, req: Request, gs: GroupState, computed: int) -> None:
        shared = gs.table.write_from if gs.table is not None else 0  # cached pages of the hit stay
        gs.registered = min(gs.registered, max(computed, shared) // self.tpp)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        tpp, pages = self.tpp, gs.pages
        if ops.caching:
            self.register_upto(req, gs, req.num_computed, ops)
        lo = self.footprint.first_needed(req.num_computed) // tpp
        if lo > gs.released:  # out of window / chunk: the first pages to be evicted
            self.release_range(req, gs, min(lo, len(pages)), ops)
            gs.released = lo

    def release_range(self, req: Request, gs: GroupState, stop: int, ops: PageOps) -> None:
        """Drop pages ``[released, stop)`` that left the range, aged to go first."""
        ops.drop_run(self.gi, gs.pages, gs.released, stop, ops.now - ops.out_of_window_age, self.tpp)

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        ops.drop_run(self.gi, gs.pages, gs.released, len(gs.pages), req.last_access, self.tpp)
        gs.pages.clear()

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        return len(gs.pages) * self.tpp + 1

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        reg = (gs.registered + 1) * self.tpp if ops.caching else NEVER
        return min(reg, self.footprint.release_point(gs.released))

    def peak_plan(self, req: Request, gs: GroupState, end: int, step: int, ops: PageOps) -> int:
        """``plan`` capped by the most pages the request holds at once over steps of at most
        ``step`` tokens (``peak_pages``) less those it holds now (a hit's pages: they stay held
        or, once out of the window or chunk, go back to the pool before the peak needs them)."""
        need = self.plan(req, gs, end, ops)
        fp = self.footprint
        return min(need, max(0, fp.peak_pages(end - 1, step) - fp.held_pages(gs))) if need else 0



class SlidingPolicy(FullPolicy):
    """Only the last ``window`` tokens are read: a hit needs just those pages; pages
    leave at commit time (even mid-prefill) and go to the evictor, aged to go first unless
    they form the window before a branch point (see ``release_range``)."""

    #: tokens below the prompt end's window that are released like that window (``window_slack``,
    #: given by the manager): another question on the same article, whose prompt ends a little earlier,
    #: still finds the whole window it needs
    slack = 0
    bounds_hit = False
    needs_junction = True
    slides = True

    def __init__(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None):
        super().__init__(gi, group, block, window_slack)
        self.slack = group.spec.window // 2 if window_slack is None else window_slack

    def retained_spans(self, req: Request) -> list[tuple[int, int]]:
        """Page ranges ``[lo, hi)`` that form the window before a branch point of this request:
        its hit, its junction (where the full-attention prefix in the index ends) and its
        prompt end (with ``slack`` tokens more below it), sorted."""
        tpp, w = self.tpp, self.group.spec.window
        return sorted((max(0, m - band - w + 1) // tpp, m // tpp)
                      for m, band in ((req.hit, 0), (req.junction, 0), (req.prompt_len, self.slack)) if m > 0)

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        """The base class's hit; then the cached pages of this prefix below the hit's window
        age like pages that left the window (``age_keys``: never newer than they were).

        They are the windows before the prefix's earlier branch points, kept by the requests
        that stopped there (``release_range``, ``free``).  A hit past them continues the
        prefix (a conversation's next turn): the next continuation needs the window before
        this request's end, which is released at its free as a one-off page, while those
        earlier windows, reused once, would else stay in the reuse order's class of reused
        pages and outlive it (six growing chats in ``benchmarks/vllm_side_by_side.py``
        evicted every chat's newest tail first and computed 1.4x the prompt tokens of stock
        vLLM).  A request that branches at the same point as others (another question on the
        same article) hits at that point and ages nothing it needs.

        Except a window that many requests hit (``SHARED_BRANCH_USES`` uses: its compute and
        seven hits, where use counts are kept): a branch point many prompts leave at, not a
        chain's passed turn (a RAG system prompt before the retrieved chunks, where every prompt
        whose first chunk is new branches off: aged on each deeper hit, gpt-oss-120b RAG prompts at a
        quarter of the H100 budget hit 37.0 % of their tokens against vLLM-best's 38.5 %, the
        system prompt's window evicted while its full-attention pages stayed).  Not from three uses:
        an article asked a few questions is no such point, and keeping its window held back newer
        ones (Ministral-8B, ``jenga simulate --workload arxiv-multiq``: 0.183 req/s against 0.197)."""
        super().hit(req, gs, p, ops)
        lo = self.footprint.first_needed(p) // self.tpp
        if ops.caching and lo:
            m, tpp = self.tpp // self.block, self.tpp
            ops.age_keys(self.gi, req.hashes[m - 1:lo * m:m], range(tpp, (lo + 1) * tpp, tpp),
                         ops.now - ops.out_of_window_age, self.SHARED_BRANCH_USES)

    #: uses (compute and hits) from which a window below a hit is a shared branch point (``hit``)
    SHARED_BRANCH_USES = 8

    def release_range(self, req: Request, gs: GroupState, stop: int, ops: PageOps) -> None:
        """Like the base class, except the window before a branch point (``retained_spans``):
        a later request with that prefix needs exactly those pages, whose value is that of
        the full-attention prefix they complete, which this request still holds.  They are
        released at ``UNTIL_FREE + now``: the time they leave, except that the reuse order
        keeps them after every other page reused before (its newest-first class would else take
        them first, though their prefix is still held); ``free`` gives them its last access,
        as it does the prefix."""
        start, tpp = gs.released, self.tpp
        for lo, hi in self.retained_spans(req):
            lo, hi = max(start, lo), min(stop, hi)
            if lo >= hi:
                continue
            super().release_range(req, gs, lo, ops)
            ops.drop_run(self.gi, gs.pages, lo, hi, UNTIL_FREE + ops.now, tpp)
            gs.released = start = hi
        if start < stop:
            super().release_range(req, gs, stop, ops)

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """Drop the held pages; the branch-point window pages this request released earlier,
        if nobody holds them, take its last access too, so they age together with its
        full-attention pages (aligned: a prefix and the window that makes it a hit leave
        together)."""
        released = gs.released
        super().free(req, gs, ops)
        if not ops.caching or not released:
            return
        m, hashes, tpp = self.tpp // self.block, req.hashes, self.tpp
        stop, done = min(released, len(hashes) // m), 0
        keys: list[bytes] = []
        ends: list[int] = []
        for lo, hi in self.retained_spans(req):  # sorted: each page once, in order
            lo, hi = max(lo, done), min(hi, stop)
            if lo < hi:
                done = hi
                keys += hashes[(lo + 1) * m - 1:hi * m:m]  # page i's key (``page_key``), ending at (i+1) * tpp
                ends += range((lo + 1) * tpp, (hi + 1) * tpp, tpp)
        if keys:
            ops.retime_keys(self.gi, keys, ends, req.last_access)


class ChunkedPolicy(FullPolicy):
    """Tokens read only their own chunk: earlier chunks are released as soon as done
    (``ChunkFootprint``'s rule)."""

    bounds_hit = False
