"""The ``uniform`` baseline's policies under vLLM 0.34's rules (``jenga.baselines.uniform``):
sliding-window and Mamba groups keep prefix-cache entries at semantic checkpoints (the replay
boundary and shared-prefix junctions), every ``retention`` tokens, or densely; Mamba states live
in the block of a step's end; freed pages follow vLLM's free queue order."""

from __future__ import annotations

from collections import Counter

from jenga.baselines.uniform_policies import UniformMambaPolicy, V1Checkpoints, releasing_at_next_allocate
from jenga.baselines.uniform_settings import UniformSettings
from jenga.core.policy.registry import FullPolicy, PageOps, SlidingPolicy, cdiv
from jenga.core.request import GroupState, Request
from jenga.core.specs import LayerGroup


class FreeQueue:
    """vLLM's free queue order as evictor times: a page released during an allocate (out of
    window, a state block left behind) joins the queue then; a request's free joins it when it
    happens (after the step's allocates: a finished request, or a preempted one), its groups one
    after the other, group 0 first, each tail first.  jenga's own order differs: a free takes the
    request's last access, and on equal times the same tokens leave every group."""

    STEP = 1 << 20  # frees one clock tick may hold

    def __init__(self, groups: int):
        self.groups, self.now, self.seq = groups, -1, 0

    def at(self, now: int, gi: int) -> int:
        """The time of a release by group ``gi`` during the allocate at ``now``."""
        return now * self.STEP * self.groups + gi

    def freed(self, now: int, gi: int) -> int:
        """The time of group ``gi``'s free of a request, after everything released before it."""
        if now != self.now:
            self.now, self.seq = now, 0
        self.seq += 1
        return (now * self.STEP + self.seq) * self.groups + gi


class FreeQueueTimes:
    """PageOps view whose released pages all take ``time`` (a ``FreeQueue`` time)."""

    def __init__(self, ops: PageOps, time: int):
        self._ops, self._time = ops, time

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def drop(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        self._ops.drop(group, page, self._time, prefix_len)

    def drop_run(self, group: int, pages: list, start: int, stop: int, last_access: int, tpp: int) -> None:
        self._ops.drop_run(group, pages, start, stop, self._time, tpp)


class FreeQueueFullPolicy(FullPolicy):
    """Full attention whose freed pages follow vLLM's free queue order (``FreeQueueTimes``)."""

    def __init__(self, gi: int, group: LayerGroup, block: int, queue: FreeQueue):
        super().__init__(gi, group, block)
        self.queue = queue

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        super().free(req, gs, FreeQueueTimes(ops, self.queue.freed(ops.now, self.gi)))

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        """Every page from 0: the hit ends at the first miss (``FullPolicy``'s own fast path)."""
        tpp, table = self.tpp, ops.index_table(self.gi)
        m = tpp // self.block
        found = list(map(table.__contains__, req.hashes[m - 1:cand // tpp * m:m]))
        return (found.index(False) if not all(found) else cand // tpp) * tpp


class RetainingSlidingPolicy(releasing_at_next_allocate(SlidingPolicy)):
    """vLLM 0.34's sliding window (``SlidingWindowManager.reachable_block_mask``, no EAGLE): a
    hit at a block boundary needs the ``cdiv(window - 1, block)`` pages before it; a page gets a
    prefix-cache entry when it is in such a tail before a *reachable boundary* (the replay
    boundary ``prompt_len - 1`` and the request's shared-prefix junction, both floored to the
    block), or, with a retention interval ``N > 0``, in the tail before a multiple of ``N``;
    ``retention=None`` keeps every page."""

    def __init__(self, gi: int, group: LayerGroup, block: int, settings: UniformSettings, queue: FreeQueue):
        super().__init__(gi, group, block)
        self.retention, self.queue = settings.retention, queue
        self.need = cdiv(group.spec.window - 1, self.tpp)

    # vLLM's block pool: a page leaving the window joins the free queue's end like any freed
    # page (no aging), a hit ages nothing, a free retimes nothing (jenga's own sliding policy
    # does), in the free queue's order (``FreeQueueTimes``)
    def release_range(self, req: Request, gs: GroupState, stop: int, ops: PageOps) -> None:
        ops.drop_run(self.gi, gs.pages, gs.released, stop, self.queue.at(ops.now, self.gi), self.tpp)

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        FullPolicy.hit(self, req, gs, p, ops)

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        FullPolicy.free(self, req, gs, FreeQueueTimes(ops, self.queue.freed(ops.now, self.gi)))

    def retains(self, req: Request, i: int) -> bool:
        tpp, need, every = self.tpp, self.need, self.retention
        if every is None:
            return True
        if every:
            per = every // tpp
            if need >= per or i % per >= per - need:
                return True
        for boundary in (req.prompt_len - 1, req.junction):
            end = boundary // tpp
            if boundary and end - need <= i < end:
                return True
        return False


class RetainingCheckpoints(V1Checkpoints):
    """vLLM 0.34's "align" checkpoints (``RetainingMambaPolicy``): a step's state lives in the block
    of its end, so no extra checkpoint page; the work page of a step ending on a kept position
    (``retains``) becomes that checkpoint; vLLM ages no state block."""

    work_becomes_checkpoint = True

    def __init__(self, group: LayerGroup, block: int, align: int, retention: int | None):
        super().__init__(group, block, align)
        self.retention = retention

    def retains(self, req: Request, pos: int) -> bool:
        """A reachable boundary (``prompt_len - 1`` or the junction, floored to the block), or a
        multiple of the retention interval ``N > 0``; ``retention=None`` keeps every one."""
        every, interval = self.every, self.retention
        if interval is None or (interval and (interval <= every or pos % interval == 0)):
            return True
        return pos in ((req.prompt_len - 1) // every * every, req.junction // every * every)

    def is_checkpoint(self, req: Request, pos: int) -> bool:
        return pos > 0 and pos % self.every == 0 and self.retains(req, pos)

    def new_checkpoints(self, req: Request, end: int) -> range:
        return range(0)  # the step's own block is its checkpoint

    def aged(self, req: Request, pos: int) -> bool:
        return False


class RetainingMambaPolicy(UniformMambaPolicy):
    """vLLM 0.34's "align" Mamba group (``MambaManager.reachable_block_mask`` and the scheduler's
    ``_mamba_block_aligned_split``, no EAGLE, no sub-block hits).  A step's state lives in the
    block of its end, so a state is kept only at a step's end on a block boundary (``every``):
    prefill steps end on block boundaries, and at the first of: the last block boundary before
    the request's last token, its shared-prefix junction floored to the block.  The work page
    of a step ending on a kept position becomes that checkpoint (the next step copies it into
    a fresh page, both held until its commit).  A position ``p`` is kept when it is a reachable
    boundary (``prompt_len - 1`` or the junction, floored to the block), or a multiple of the
    retention interval ``N > 0``; ``retention=None`` keeps every one (``RetainingCheckpoints``)."""

    def __init__(self, gi: int, group: LayerGroup, block: int, align: int, settings: UniformSettings,
                 queue: FreeQueue):
        super().__init__(gi, group, block, align, RetainingCheckpoints(group, block, align, settings.retention))
        self.queue = queue
        self._pending: dict[object, bytes] = {}  # request -> the state key its running step writes
        self._pending_keys: Counter = Counter()

    def _new_block(self, req: Request, end: int) -> bool:
        """Whether a step ending at ``end`` ends in a later block than the request's state."""
        return cdiv(end - req.num_lookahead, self.every) > cdiv(req.start, self.every)

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        return int(gs.work is None or (ops.caching and self._new_block(req, end)))

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        if gs.work is not None and gs.read is None and ops.caching and self._new_block(req, end):
            # vLLM's state moves to the block of the step's end: a fresh page, the old one held
            # (copied from) until the step's commit
            gs.read, gs.read_pos, gs.work = gs.work, req.start, None
            gs.table.read_page = gs.read
        super().grow(req, gs, end, ops)
        pos = end - req.num_lookahead
        if ops.caching and req.start < pos <= len(req.hashes) * self.block and self.checkpoints.is_checkpoint(req, pos):
            self._untrack_step(req)
            key = self._pending[req.request_id] = self.key(req, pos)
            self._pending_keys[key] += 1

    def _untrack_step(self, req: Request) -> None:
        key = self._pending.pop(req.request_id, None)
        if key is not None:
            self._pending_keys[key] -= 1
            if not self._pending_keys[key]:
                del self._pending_keys[key]

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        self._untrack_step(req)
        super().commit(req, gs, FreeQueueTimes(ops, self.queue.at(ops.now, self.gi)))

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        self._untrack_step(req)
        super().free(req, gs, FreeQueueTimes(ops, self.queue.freed(ops.now, self.gi)))

    def step_end(self, req: Request, stop: int) -> int:
        start, every = req.start, self.every
        known = len(req.tokens)
        prefill_end = max(req.prompt_len, known - 1)
        if start >= prefill_end:
            return stop
        if stop < prefill_end:
            stop = max(start, stop // every * every)  # vLLM: no step at all (0 tokens) when that ends before start
        junction = req.junction
        stops = ((start // every + 1) * every if start % every else 0, (known - 1) // every * every,
                 start + (junction - start) // every * every if start < junction < stop else 0)
        return min((s for s in stops if start < s < stop), default=stop)

    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.work is None:
            return 0
        return cdiv(req.start, self.every) * self.every + 1 if ops.caching else 1 << 62

    def hits_unwritten_state(self, req: Request, ops: PageOps) -> bool:
        """Whether vLLM's lookup would have resumed this admission from a state another request
        writes in this very step (vLLM registers it at that request's allocate): vLLM then
        refuses the admission for this step (``MambaManager.get_num_blocks_to_allocate``).  Here
        such a state joins the index at commit, so the lookup found a shorter hit: below the
        full-attention reach (the junction, else the hit), the last kept state is looked up
        among the states being written."""
        if req.tables is not None or not ops.caching or not self._pending_keys:
            return False
        every, hashes, table = self.every, req.hashes, ops.index_table(self.gi)
        top = min(max(req.hit, req.junction), req.prompt_len - 1, len(hashes) * self.block)
        for pos in range(top // every * every, req.hit, -every):
            key = hashes[pos // self.block - 1]
            if key in self._pending_keys:
                return True
            if key in table:
                return False
        return False
