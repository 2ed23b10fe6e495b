"""State kinds (Mamba-1/2, Gated DeltaNet): a running state plus checkpoints."""

from __future__ import annotations

from jenga.errors import InvalidArgumentError
from jenga.prefix.policy import NEVER, PageOps, Policy
from jenga.request import GroupState, Request
from jenga.specs import LayerGroup
from jenga.tables import StateTable


class MambaPolicy(Policy):
    """One running state plus checkpoints every ``checkpoint_interval`` tokens (hits only
    there).  Checkpoints are cached as soon as written; the request keeps only its work
    page."""

    def __init__(self, gi: int, group: LayerGroup, block: int):
        super().__init__(gi, group, block)
        self.every = group.spec.checkpoint_interval
        if self.every % block:
            raise InvalidArgumentError(f"group {group.name!r}: state checkpoint interval {self.every} is not a "
                                       f"multiple of tokens_per_page {block}; use a tokens_per_page dividing it")
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
