"""Where a state kind keeps checkpoints, and how a step treats its state pages.

A state policy (:class:`jenga.core.policy.state.MambaPolicy`) is handed one :class:`Checkpoints`
at construction (its ``checkpoint_rule`` builds jenga's when none is given).  The rule is a public
strategy: the engine variant that copies a checkpoint forward one step late and the ``uniform``
baseline's vLLM rules are subclasses of it, injected into the policy, not overrides of the
policy's private steps.  The rule reads a request and positions only; it holds no page.
"""

from __future__ import annotations

from jenga.core.request import Request
from jenga.core.specs import LayerGroup


class Checkpoints:
    """jenga's checkpoint rule (``MambaPolicy``'s doc): every ``every`` tokens (the spec's
    ``checkpoint_interval`` unless given), at the junction and the prompt's last full block, tail
    checkpoints before a long prompt's end; ``block`` is the hash block size."""

    #: a prompt with an uncached part of at least this many checkpoint intervals also gets
    #: tail checkpoints
    TAIL_FROM = 8
    #: a step ending on a checkpoint position registers its work page as that checkpoint (the next
    #: step copies it into a fresh work page) instead of writing a page of its own
    work_becomes_checkpoint = True
    #: a hit's checkpoint is let go of once the step that copies it is allocated (else: at the
    #: step's commit, the copy source held until then)
    releases_read_at_allocate = True
    #: a position whose state another live request's step already writes into a page of its own
    #: (same key, not committed yet) gets no second page
    shares_writes = True

    def __init__(self, group: LayerGroup, block: int, every: int | None = None):
        self.block = block
        self.every = group.spec.checkpoint_interval if every is None else every
        self._tails_of: dict[int, tuple[int, ...]] = {}

    def marks(self, req: Request) -> tuple[int, ...]:
        """The junction (or where ``req.junction_checkpoint`` moved its checkpoint) and prompt-end
        checkpoint positions (block multiples); a prompt whose
        uncached part (after its hit or junction) is long adds checkpoints 1, 2, 4, ... blocks
        before its end (below one interval): a later prompt that branches off shortly before
        this one's end (another question on the same document) then resumes within a factor
        of two of its branch point, not up to an interval before it.  Short new parts skip
        them (a state page is large next to them; a prompt continuing a cached prefix, such as
        the next turn of a conversation, is branched off at its junction or its end)."""
        end = self.prompt_end(req)
        junction = req.junction if req.junction_checkpoint is None else req.junction_checkpoint
        if req.prompt_len - max(req.hit, req.junction) < self.TAIL_FROM * self.every or not end:
            return junction, end
        return (junction, end) + self._tails(end)

    def prompt_end(self, req: Request) -> int:
        """The prompt-end checkpoint's position: the prompt's last full block, or where the caller
        put it (``req.prompt_checkpoint``; 0: none)."""
        if req.prompt_checkpoint is not None:
            return req.prompt_checkpoint
        return req.prompt_len // self.block * self.block

    def _tails(self, end: int) -> tuple[int, ...]:
        """``end - d`` for ``d`` = 1, 2, 4, ... blocks below one interval (kept per ``end``: a
        long prompt asks at every allocate and commit)."""
        tails = self._tails_of.get(end)
        if tails is None:
            if len(self._tails_of) >= 4096:
                self._tails_of.clear()
            tails, d = [], self.block
            while d < self.every:
                tails.append(end - d)
                d *= 2
            tails = self._tails_of[end] = tuple(tails)
        return tails

    def new_checkpoints(self, req: Request, end: int) -> list[int] | range:
        """Checkpoint positions of the step up to ``end`` that get a page: ``(start, end -
        lookahead)``; the one at the step's end is the work page itself (``work_becomes_checkpoint``)."""
        return self.positions(req, req.start, end - req.num_lookahead - 1)

    def positions(self, req: Request, start: int, stop: int) -> list[int] | range:
        """Checkpoint positions in ``(start, stop]``."""
        first = start // self.every + 1
        periodic = self.periodic(req, range(first * self.every, stop + 1, self.every))
        extra = [m for m in self.marks(req) if start < m <= stop and m % self.every]
        if not extra:
            return periodic
        return sorted(set(periodic).union(extra))

    def periodic(self, req: Request, periodic: range) -> range:
        """Which of a step's periodic positions get a checkpoint: a long prompt the step's last
        one (tails or a branch point cover the end), a short prompt continuing a cached prefix
        none (its branch points only), a short prompt of which nothing was cached every one."""
        if req.prompt_len >= self.TAIL_FROM * self.every:
            return periodic[-1:]
        if req.hit or req.junction:
            return periodic[:0]
        return periodic

    def is_checkpoint(self, req: Request, pos: int) -> bool:
        """Whether the state after ``pos`` tokens is a checkpoint (a step ending there keeps it)."""
        return pos > 0 and (pos % self.every == 0 or pos in self.marks(req))

    def aged(self, req: Request, pos: int) -> bool:
        """Whether a checkpoint at ``pos`` let go of now goes before other cached pages: a periodic
        one that is no branch point."""
        return pos % self.every == 0 and pos not in self.marks(req) \
            and pos < req.prompt_len // self.block * self.block

    def next_position(self, req: Request) -> int:
        """The first checkpoint position after ``req.start``."""
        start = req.start
        nxt = (start // self.every + 1) * self.every
        for m in self.marks(req):
            if start < m < nxt:
                nxt = m
        return nxt


class CopyForwardCheckpoints(Checkpoints):
    """For an engine that copies a checkpoint forward one step late (``CopyForwardMambaPolicy``):
    every periodic position, each step's end state in a page of its own where
    ``CopyForwardMambaSpec.step_end_from`` keeps it, a hit's read page held until the next commit."""

    releases_read_at_allocate = False
    shares_writes = False  # the worker writes each step's end state into a page of its own

    def __init__(self, group: LayerGroup, block: int, every: int | None = None):
        super().__init__(group, block, every)
        self.step_end_from = group.spec.step_end_from

    def periodic(self, req: Request, periodic: range) -> range:
        return periodic

    def new_checkpoints(self, req: Request, end: int) -> list[int] | range:
        pos = self.positions(req, req.start, end - req.num_lookahead)
        stop = end - req.num_lookahead
        if self.keeps_step_end(req, stop) and stop not in pos:
            return sorted([*pos, stop])
        return pos

    def keeps_step_end(self, req: Request, stop: int) -> bool:
        """Whether a step ending at ``stop`` keeps its end state (``CopyForwardMambaSpec.step_end_from``):
        a chunk end on a page boundary inside the prompt, below its last block, far enough in for
        the recompute it saves a later prompt sharing that prefix to outweigh a state page."""
        first = self.step_end_from
        return 0 < first <= stop and stop % self.block == 0 and req.start < stop < req.prompt_len // self.block * \
            self.block
