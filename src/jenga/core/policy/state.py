"""State kinds (Mamba-1/2, Gated DeltaNet): a running state plus checkpoints."""

from __future__ import annotations

from collections import Counter

from jenga.core.policy.base import NEVER, PageOps, Policy
from jenga.core.policy.checkpoints import Checkpoints, CopyForwardCheckpoints
from jenga.core.request import CheckpointState, GroupState, Request
from jenga.core.specs import LayerGroup
from jenga.core.tables import StateTable
from jenga.errors import InvalidArgumentError


class MambaPolicy(Policy):
    """One running state plus checkpoints; a hit resumes from a cached checkpoint.

    Checkpoints are taken every ``checkpoint_interval`` tokens, at the end of the prompt's
    last full block (a later turn or a preempted request resumes there), and at the
    request's *junction*: where its prompt leaves the token prefix the index already holds
    (the branch point of a shared prefix, found by ``lookup``), so the next request with
    that prefix resumes exactly there.  Checkpoints are cached as soon as written; the
    request keeps only its work page.

    Rules that keep a step to one state page per request (jenga's engine copies every read
    page into its work page before any layer of the step writes, ``engine/state.py``):

    * a hit's checkpoint is let go of once the step that copies it is allocated (it stays
      cached; a later allocate in the same step may even reuse it, after the copy);
    * a checkpoint at the step's last token needs no page: at the commit the work page
      *becomes* that checkpoint (registered) and the next step copies it into a fresh work
      page (``_take_work_as_checkpoint``); a step ends on the prompt-end checkpoint, and on
      the junction after a state hit below it (``step_end``);
    * periodic checkpoints where they can still pay: a long prompt (8+ intervals; tail
      checkpoints where its uncached part is that long too, ``Checkpoints.marks``) gets only the last
      periodic position of each step, a short prompt that
      continues a cached prefix (a hit or a junction) none (its junction and prompt end
      are the branch points), a short prompt of which nothing was cached every one (where
      a later request leaves it is not known yet).

    Where checkpoints lie and how a step treats its state pages is the ``checkpoints`` rule
    (:mod:`jenga.core.policy.checkpoints`), handed in at construction (``checkpoint_rule`` builds
    one when none is given); ``window_slack`` is ignored."""

    needs_junction = True
    state_type = CheckpointState
    miss_reason = "no_checkpoint"

    #: jenga's engine writes no K/V below ``TokenTable.write_from`` (``jenga.core.manager.junction``)
    recompute_under_shared = True

    #: the checkpoint rule built when none is given
    checkpoint_rule: type[Checkpoints] = Checkpoints

    def __init__(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None,
                 checkpoints: Checkpoints | None = None):
        super().__init__(gi, group, block, window_slack)
        interval = group.spec.checkpoint_interval
        if interval % block:
            raise InvalidArgumentError(f"group {group.name!r}: state checkpoint interval {interval} is not a "
                                       f"multiple of tokens_per_page {block}; use a tokens_per_page dividing it")
        self.checkpoints = self.checkpoint_rule(group, block) if checkpoints is None else checkpoints
        self.every = self.checkpoints.every
        # checkpoint pages taken and not committed yet (live requests' steps write them): page ->
        # its key (None while the key's tokens are unknown), and how many pages write each key
        self._writing: dict[int, bytes | None] = {}
        self._writers: Counter = Counter()

    def key(self, req: Request, pos: int) -> bytes:
        return req.hashes[pos // self.block - 1]

    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        table, hashes = ops.index_table(self.gi), req.hashes
        for j in range(min(cand // self.block, len(hashes)), 0, -1):
            if hashes[j - 1] in table:
                return j * self.block
        return 0

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        if p > 0:
            page = ops.find(self.gi, self.key(req, p))
            assert page is not None, f"group {self.gi}: checkpoint {p} vanished"
            ops.hold(self.gi, page)
            gs.read, gs.read_pos = page, p

    def step_end(self, req: Request, stop: int) -> int:
        """A step crossing the prompt-end checkpoint ends on it (vLLM's scheduler does the
        same, ``_mamba_block_aligned_split``): its work page then *is* that checkpoint
        (``_take_work_as_checkpoint``) instead of a second state page live in the step.
        So does the step of a request that resumes a cached state below its junction
        (``_junction_end``)."""
        end = self.checkpoints.prompt_end(req)
        stop = end if req.start < end < stop else stop
        j = self._junction_end(req)
        return j if req.start < j < stop else stop

    def _junction_end(self, req: Request) -> int:
        """Where the step of a request resuming a cached state (``hit > 0``) below its junction
        ends: the junction, so its work page becomes the junction checkpoint (the state layers
        recompute ``[hit, junction)`` under shared attention pages, ``jenga.core.manager.junction``).
        A request resuming no state keeps its full step: its junction typically comes from a
        prefix computed in this step or the one before, and the budget a shorter step leaves
        goes to admissions that cannot hit that prefix yet (measured: hits -1.2 points on
        jamba hybrid-short, -2.1 on mamba-prefix); so does a long prompt (-0.6 on articles16)."""
        if req.hit and self.recompute_under_shared and req.prompt_len < self.checkpoints.TAIL_FROM * self.every:
            return req.junction
        return 0

    def _fresh_checkpoints(self, req: Request, end: int) -> list[int] | range:
        """The rule's ``new_checkpoints``, less (where it ``shares_writes``) the positions whose
        state another live request's step already writes into a page of its own (same key, not
        committed yet): one copy of a state is enough (several requests of a step continuing the
        same new prefix each had a junction checkpoint there).  If that step is dropped the state
        is simply not cached (a later request recomputes it).  A state the index holds is not
        skipped: this very allocate may evict its page."""
        pos = self.checkpoints.new_checkpoints(req, end)
        if not pos or not self._writers or not self.checkpoints.shares_writes:
            return pos
        n, hashes, writers = len(req.hashes), req.hashes, self._writers
        return [p for p in pos if p // self.block > n or hashes[p // self.block - 1] not in writers]

    def writing_keys(self):
        """The keys of the checkpoint pages live steps are writing (registered at their commit).
        Not a step's end state that its work page becomes at the commit (``Checkpoints.work_becomes_checkpoint``)."""
        return self._writers

    def _track(self, req: Request, pos: int, page: int) -> None:
        key = self.key(req, pos) if pos // self.block <= len(req.hashes) else None
        self._writing[page] = key
        if key is not None:
            self._writers[key] += 1

    def _untrack(self, page: int) -> None:
        key = self._writing.pop(page)
        if key is not None:
            if self._writers[key] == 1:
                del self._writers[key]
            else:
                self._writers[key] -= 1

    def check(self, requests) -> None:
        """The tracked checkpoint pages are exactly the live requests' ones, with their keys."""
        seen = {}
        for req in requests:
            for pos, page in req.groups[self.gi].checkpoints.items():
                key = self._writing.get(page, 0)
                assert key == 0 or key is None or key == self.key(req, pos), f"group {self.gi}: checkpoint page {page} key"
                seen[page] = key
        assert seen.keys() == self._writing.keys(), f"group {self.gi}: tracked checkpoint pages differ"
        assert self._writers == Counter(k for k in self._writing.values() if k is not None), "writers count"

    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        n = 1 if gs.work is None else 0
        if ops.caching:
            n += len(self._fresh_checkpoints(req, end))
        return n

    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        if gs.work is None:
            gs.work = ops.take(self.gi)
            if gs.table is None:
                gs.table = StateTable(self.gi, gs.work, gs.read, gs.checkpoints)
            else:  # after _take_work_as_checkpoint: the same table object, a fresh work page
                gs.table.work_page, gs.table.read_page = gs.work, gs.read
        if ops.caching:
            for pos in self._fresh_checkpoints(req, end):
                page = gs.checkpoints[pos] = ops.take(self.gi)
                self._track(req, pos, page)
        if gs.read is not None and self.checkpoints.releases_read_at_allocate:
            self._release_read(req, gs, ops)

    def _release_read(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """The step just allocated copies ``gs.read`` into the work page before it writes
        anything, so the request lets go of it now (the table still names it for the copy)."""
        pos = gs.read_pos  # a hit's checkpoint was just used: not aged like an unused periodic one
        ops.drop(self.gi, gs.read, self._stamp(req, pos, ops) if pos > req.hit else ops.now, pos)
        gs.read = None

    def _stamp(self, req: Request, pos: int, ops: PageOps) -> int:
        """Last access of a checkpoint at ``pos`` let go of now: older where the rule ages it."""
        return ops.now - ops.out_of_window_age if self.checkpoints.aged(req, pos) else ops.now

    def _take_work_as_checkpoint(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """The step ended on a checkpoint position: the work page holds exactly that state, so
        it is registered as the checkpoint and becomes the read page of the next step (which
        copies it into a fresh work page).  Not when the key is taken or not hashed yet."""
        pos = req.num_computed
        if not self.checkpoints.work_becomes_checkpoint or gs.work is None or not ops.caching \
                or not self.checkpoints.is_checkpoint(req, pos) \
                or pos // self.block > len(req.hashes) or not ops.register(self.gi, gs.work, self.key(req, pos)):
            return
        gs.read, gs.read_pos, gs.work = gs.work, pos, None
        gs.table.read_page = gs.read
        req.limit = 0  # the next allocate takes a work page (the slow path)

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        done = [pos for pos in gs.checkpoints if pos <= req.num_computed]
        for pos in done:
            page = gs.checkpoints.pop(pos)
            self._untrack(page)
            if pos // self.block <= len(req.hashes):
                ops.register(self.gi, page, self.key(req, pos))
            ops.drop(self.gi, page, self._stamp(req, pos, ops), pos)
        if gs.read is not None:  # a subclass that keeps the read page until the commit
            ops.drop(self.gi, gs.read, ops.now, gs.read_pos)
            gs.read = None
        if gs.table is not None:
            gs.table.read_page = None  # copied by the step just committed
        if req.num_computed not in done:
            self._take_work_as_checkpoint(req, gs, ops)

    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        for pos, page in gs.checkpoints.items():
            self._untrack(page)
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
        if not ops.caching:
            return NEVER
        return self.checkpoints.next_position(req)

    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        if gs.read is not None or (gs.table is not None and gs.table.read_page is not None):
            return 0
        nxt = min(gs.checkpoints, default=NEVER)
        if gs.work is not None and ops.caching:
            nxt = min(nxt, self.checkpoints.next_position(req))
        return nxt


class CopyForwardMambaPolicy(MambaPolicy):
    """``MambaPolicy`` for an engine that copies a checkpoint forward one step late.

    vLLM's align-mode worker writes the state after ``t`` tokens into the checkpoint page
    of the step ending at ``t`` and copies it into the work page when the next step starts.
    So at the commit where ``t`` becomes the computed length, the checkpoint is registered
    (findable for hits) but stays held by the request as its ``read`` page (the copy source
    of the next step); it is dropped at the following commit, like a prefix hit's page.
    So a hit's read page stays held until that commit too, a checkpoint at a step's end
    gets its own page, and every periodic position is checkpointed.  vLLM's model runner
    writes the K/V of every computed token, so attention groups never hold cached pages past
    this kind's hit (:mod:`jenga.core.manager.junction`)."""

    recompute_under_shared = False
    checkpoint_rule = CopyForwardCheckpoints

    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        if gs.read is not None:
            ops.drop(self.gi, gs.read, ops.now, gs.read_pos)
            gs.read = None
            gs.table.read_page = None
        done = [pos for pos in gs.checkpoints if pos <= req.num_computed]
        for pos in done:
            page = gs.checkpoints.pop(pos)
            self._untrack(page)
            if pos // self.block <= len(req.hashes):
                ops.register(self.gi, page, self.key(req, pos))
            if pos == req.num_computed:
                gs.read, gs.read_pos = page, pos
                gs.table.read_page = page
            else:
                ops.drop(self.gi, page, ops.now, pos)
