"""The ``uniform`` baseline's policies under vLLM 0.32's rules (``jenga.baselines.uniform``):
out-of-window pages released at the request's next allocate, sliding windows retained at the
prompt's end only, one Mamba checkpoint at the prompt's last block, cross attention uncached."""

from __future__ import annotations

from jenga.core.policy.checkpoints import Checkpoints
from jenga.core.policy.registry import (
    ChunkedPolicy,
    FullPolicy,
    ImagePolicy,
    MambaPolicy,
    PageOps,
    SlidingPolicy,
    cdiv,
)
from jenga.core.request import GroupState, Request
from jenga.core.specs import LayerGroup


def releasing_at_next_allocate(base: type[FullPolicy]) -> type[FullPolicy]:
    """``base`` (a sliding or chunked policy) with v1's release of out-of-window pages at the
    request's next allocate: a subclass of it, so every uniform policy has one base class."""

    class ReleaseAtNextAllocate(base):
        """Out-of-window pages are released when the request next allocates, not at commit."""

        releases_at_next_allocate = True

        def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
            computed = req.num_computed
            self._register(req, gs, ops, computed)

        def register_upto(self, req: Request, gs: GroupState, pos: int, ops: PageOps) -> None:
            """At allocate too (same-step sharing), only the pages ``retains`` keeps get an entry."""
            self._register(req, gs, ops, pos)

        def _register(self, req: Request, gs: GroupState, ops: PageOps, computed: int) -> None:
            if not ops.caching:
                return
            tpp, pages = self.tpp, gs.pages
            full = min(computed // tpp, len(req.hashes) * self.block // tpp, len(pages))
            for i in range(gs.registered, full):
                if pages[i] is not None and self.retains(req, i):
                    ops.register(self.gi, pages[i], self.page_key(req, i))
            gs.registered = max(gs.registered, full)

        def retains(self, req: Request, i: int) -> bool:
            """Whether page ``i`` (full, just computed) gets a prefix-cache entry."""
            return self.retained_from(req) <= i and (i + 1) * self.tpp <= self.retained_to(req)

        def retained_from(self, req: Request) -> int:
            return 0

        def retained_to(self, req: Request) -> int:
            return 1 << 62

        def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
            """Pages past the held ones; those below the window stay held (``skipped``)."""
            return max(0, cdiv(end, self.tpp) - len(gs.pages))

        def skipped(self, req: Request, gs: GroupState) -> range:
            """Page indices that left the window / chunk but are still held (freed at the next allocate)."""
            return range(gs.released, min(self.footprint.first_needed(req.num_computed) // self.tpp, len(gs.pages)))

        def freed_by_release(self, req: Request, gs: GroupState, ops: PageOps) -> int:
            """Pages that ``release_skipped`` gives back to the pool (held by nobody else)."""
            ref, pages = ops.ref[self.gi], gs.pages
            return sum(1 for i in self.skipped(req, gs) if pages[i] is not None and ref[pages[i]] == 1)

        def release_skipped(self, req: Request, gs: GroupState, ops: PageOps) -> None:
            """``remove_skipped_blocks``: drop the pages below the window (no new registration)."""
            super().commit(req, gs, _NoRegister(ops))

        def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
            return (gs.registered + 1) * self.tpp if ops.caching else 1 << 62

        def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
            """Also where a page leaves the window: vLLM releases it at every allocate, one that
            needs no new page included, so that allocate takes the manager's slow path."""
            return min(super().limit(req, gs, ops), self.footprint.release_point(gs.released))

    ReleaseAtNextAllocate.__name__ = ReleaseAtNextAllocate.__qualname__ = f"ReleaseAtNextAllocate{base.__name__}"
    return ReleaseAtNextAllocate


class _NoRegister:
    """PageOps view used to release pages without registering new ones."""

    def __init__(self, ops: PageOps):
        self._ops = ops
        self.caching = False
        self.now = ops.now
        self.out_of_window_age = ops.out_of_window_age

    def drop(self, *args) -> None:
        self._ops.drop(*args)

    def drop_run(self, *args) -> None:
        self._ops.drop_run(*args)


class UniformSlidingPolicy(releasing_at_next_allocate(SlidingPolicy)):
    """v1 sliding window: retention only inside the window that ends at the prompt."""

    def retained_from(self, req: Request) -> int:
        return max(0, req.prompt_len - self.group.spec.window) // self.tpp

    def retained_to(self, req: Request) -> int:
        return req.prompt_len


class UniformChunkedPolicy(releasing_at_next_allocate(ChunkedPolicy)):
    pass


class V1Checkpoints(Checkpoints):
    """v1 "align" mode with retention 0: one state kept, at the prompt's last block end (every
    ``align`` tokens), in a block of its own; the block a step reads stays held until its commit;
    a checkpoint is written whatever another request writes."""

    work_becomes_checkpoint = False
    releases_read_at_allocate = False
    shares_writes = False

    def new_checkpoints(self, req: Request, end: int) -> range:
        pos = req.prompt_len - req.prompt_len % self.every
        ok = req.start < pos <= end - req.num_lookahead
        return range(pos, pos + 1) if ok and pos > 0 else range(0)


class UniformMambaPolicy(MambaPolicy):
    """v1 "align" mode with retention 0 (``V1Checkpoints``, unless ``checkpoints`` gives another
    rule every ``align`` tokens)."""

    recompute_under_shared = False  # v1 recomputes a state hit's gap into fresh attention blocks

    def __init__(self, gi: int, group: LayerGroup, block: int, align: int, checkpoints: Checkpoints | None = None):
        super().__init__(gi, group, block, checkpoints=V1Checkpoints(group, block, align) if checkpoints is None
                         else checkpoints)

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.work is None:
            return 0
        pos = req.prompt_len - req.prompt_len % self.every
        return pos if ops.caching and req.start < pos else 1 << 62


class UncachedImagePolicy(ImagePolicy):
    """Cross-attention KV is never prefix-cached in v1."""

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        if gs.initialized:
            return 0
        for j in range(len(req.images)):
            gs.pending[j] = None
        return sum(cdiv(img.num_tokens, self.tpp) for img in req.images)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        gs.to_fill.clear()
