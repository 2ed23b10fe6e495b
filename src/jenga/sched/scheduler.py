"""Continuous-batching scheduler over a KV-cache manager (torch-free, reusable by a simulator).

Interface
---------
``Scheduler(manager, max_num_seqs=..., max_num_batched_tokens=..., eos_token_ids=...)`` takes
any object with the ``KVCacheManager`` API (``add_request / lookup / allocate /
append_tokens / free``).  The caller drives it with three calls per step::

    sched.add(seq)                       # any time: a new Sequence joins the waiting queue
    plan = sched.schedule()              # StepPlan: who runs this step, with how many tokens
    ... run the model on plan.scheduled (tokens seq.tokens[seq.num_computed : +num_tokens],
        K/V written into plan.scheduled[i].tables), sample one token per item with .sample ...
    finished = sched.update(plan, sampled)   # sampled[i]: token id, or None when not .sample

``finish(seq, reason)`` ends a request early (e.g. the engine matched a stop string).

Policy (vLLM-v1-like)
---------------------
* Token budget ``max_num_batched_tokens`` per step; running requests first, in admission
  order (decodes take 1 token, prefills a chunk of what is left of the budget), then waiting
  requests FCFS while the budget and ``max_num_seqs`` allow (chunked prefill).  The manager's
  ``chunk_tokens`` may shorten a chunk (a state group ends a step on its prompt-end checkpoint or junction,
  :mod:`jenga.core.manager.cache_control`).
* A waiting request is added to the manager, ``lookup`` finds its cached prefix (those tokens
  are not fed again), then ``allocate`` asks for the first chunk.  If that returns ``None`` the
  request stays waiting (the manager is told to ``free`` it) and admission stops for the step.
* If ``allocate`` for a running request returns ``None``, the most recently admitted running
  request is preempted by recompute: freed in the manager (its full pages stay in the prefix
  cache), put at the front of the waiting queue, and re-added later with prompt + generated
  tokens as its new prompt.  Repeated until the allocation fits or the request preempted itself.
  No request is admitted in a step that preempted.
* After the step, ``append_tokens`` commits the computed tokens with the sampled token (an
  empty list for a non-final prefill chunk).  A request finishes on ``max_tokens``, an EOS id
  (unless ``ignore_eos``), a ``stop_token_ids`` id or the model's max length; then it is freed.

Errors: :class:`~jenga.errors.InsufficientMemoryError` when a request cannot be scheduled even
with nothing else running (the KV budget is too small for it).  ``touched`` then lists the
requests that ``schedule`` allocated for (or tried to) before it raised: their allocations
are not committed, so the caller must ``finish`` them (the engine aborts them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from jenga.errors import DuplicateRequestError, InsufficientMemoryError, InvalidArgumentError
from jenga.sched.sequence import Sequence, Status


@dataclass(slots=True)
class ScheduledRequest:
    """``num_tokens`` tokens ``seq.tokens[start : start + num_tokens]`` run this step;
    ``sample``: they end the known tokens, so one token is sampled from the last one."""

    seq: Sequence
    start: int
    num_tokens: int
    tables: object  # jenga.core.tables.PageTables
    sample: bool


@dataclass(slots=True)
class StepPlan:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_tokens: int = 0
    num_decode: int = 0  # scheduled requests feeding exactly their one last token

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    preemptions: int = 0
    scheduled_tokens: int = 0
    decode_steps: int = 0  # steps with at least one decode
    decode_batch_sum: int = 0
    batch_sum: int = 0
    max_running: int = 0

    @property
    def decode_batch_mean(self) -> float:
        return self.decode_batch_sum / self.decode_steps if self.decode_steps else 0.0

    @property
    def batch_mean(self) -> float:
        return self.batch_sum / self.steps if self.steps else 0.0


class Scheduler:
    """See the module docstring for the contract."""

    def __init__(self, manager, *, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, eos_token_ids: Iterable[int] = ()):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise InvalidArgumentError(f"max_num_seqs ({max_num_seqs}) and max_num_batched_tokens "
                                       f"({max_num_batched_tokens}) must be positive")
        self.mgr = manager
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.max_model_len = max_model_len or manager.model.max_model_len
        self.eos = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.ids: set[object] = set()
        self.stats = SchedulerStats()
        self.touched: list[Sequence] = []  # requests the current schedule() allocated for (or tried to)

    # ------------------------------------------------------------------ queue
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.ids:
            raise DuplicateRequestError(f"request id {seq.request_id!r} is already scheduled")
        if seq.num_tokens >= self.max_model_len:
            raise InvalidArgumentError(f"request {seq.request_id!r}: prompt of {seq.num_tokens} tokens leaves no "
                                       f"room to generate within max_model_len {self.max_model_len}")
        seq.status = Status.WAITING
        self.ids.add(seq.request_id)
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # --------------------------------------------------------------- schedule
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.touched = []
        left = self._schedule_running(plan, self.budget)
        if not plan.preempted:
            self._admit(plan, left)
        self._account(plan)
        return plan

    def _schedule_running(self, plan: StepPlan, left: int) -> int:
        """Running requests first, in admission order, each up to what is left of ``left``
        tokens; preempts the newest when an allocation fails.  Returns the tokens left."""
        mgr = self.mgr
        i = 0
        while i < len(self.running) and left > 0:
            seq = self.running[i]
            self.touched.append(seq)
            n = mgr.chunk_tokens(seq.request_id, min(seq.num_uncomputed, left))
            tables = mgr.allocate(seq.request_id, n)
            while tables is None:
                if len(self.running) == 1:  # alone: a shorter chunk, or it never fits
                    n, tables = self._fit_alone(seq, n)
                    if tables is None:
                        raise InsufficientMemoryError(
                            f"request {seq.request_id!r} needs pages for {seq.num_computed + 1} tokens, more than "
                            "the whole KV cache holds; raise the KV memory budget or lower max_tokens")
                    break
                victim = self.running.pop()
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is seq:
                    break
                tables = mgr.allocate(seq.request_id, n)
            if tables is None:
                break
            self._take(plan, seq, n, tables)
            left -= n
            i += 1
        return left

    def _fit_alone(self, seq: Sequence, n: int) -> tuple[int, object]:
        """``seq`` runs alone and a chunk of ``n`` tokens does not fit: the longest shorter
        chunk the manager can allocate (``can_allocate``, which changes nothing; a sliding
        group holds its window plus every token of the step, so a shorter step needs fewer
        pages) and its tables, or ``(n, None)`` when not even one token fits."""
        mgr, rid = self.mgr, seq.request_id
        lo, hi = 0, n  # can_allocate(lo) holds (0 trivially), can_allocate(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if mgr.can_allocate(rid, mid) else (lo, mid)
        m = mgr.chunk_tokens(rid, lo) if lo else 0
        tables = mgr.allocate(rid, m) if m else None
        return (m, tables) if tables is not None else (n, None)

    def _enter(self, seq: Sequence) -> None:
        """Add the waiting head to the manager and skip its cached prefix (``lookup``)."""
        self.touched.append(seq)
        if not seq.in_manager:
            self.mgr.add_request(seq.request_id, seq.tokens, **self._request_extras(seq))
            seq.in_manager = True
            seq.num_computed = self.mgr.lookup(seq.request_id)
            seq.prefix_hit_tokens += seq.num_computed

    def _admit_alone(self, seq: Sequence, n: int, left: int) -> tuple[int, object]:
        """The waiting head's first chunk of ``n`` tokens does not fit with nothing else running:
        a shorter chunk (``_fit_alone``), else the same without its hit (``drop_hit``).
        ``(n, None)`` when neither fits."""
        n, tables = self._fit_alone(seq, n)
        if tables is not None:
            return n, tables
        self.drop_hit(seq)
        n = self.mgr.chunk_tokens(seq.request_id, min(seq.num_uncomputed, left))
        tables = self.mgr.allocate(seq.request_id, n)
        return (n, tables) if tables is not None else self._fit_alone(seq, n)

    def drop_hit(self, seq: Sequence) -> None:
        """Look the waiting head up again with no hit (``max_tokens=0``: its prompt is recomputed),
        when it does not fit with nothing else running.  Its held hit may be what does not fit:
        the hit's pages can lie in large pages that the request's other groups then cannot take
        (a shared prefix on a hybrid model spread over every large page, or pages a host tier
        promoted for it), while a cache holding nothing for anyone holds what
        ``capacity.max_context_tokens`` promises (``RequestLimits``)."""
        seq.prefix_hit_tokens -= seq.num_computed
        seq.num_computed = self.mgr.lookup(seq.request_id, max_tokens=0)

    def leave(self, seq: Sequence) -> None:
        """The waiting head did not fit: take it out of the manager again (it stays waiting).
        A hook: a subclass may note the failed admission (then call this)."""
        self.mgr.free(seq.request_id)
        seq.in_manager, seq.num_computed = False, 0
        if not self.running:
            raise InsufficientMemoryError(
                f"request {seq.request_id!r} ({seq.num_tokens} tokens) does not fit in the KV cache "
                "even with nothing else running; raise the KV memory budget")

    def _start(self, plan: StepPlan, seq: Sequence, n: int, tables) -> None:
        self.waiting.popleft()
        seq.status = Status.RUNNING
        self.running.append(seq)
        self._take(plan, seq, n, tables)

    def _admit(self, plan: StepPlan, left: int) -> None:
        """Waiting requests FCFS, each with a first chunk of what is left of the budget."""
        while self.waiting and left > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self._enter(seq)
            n = self.mgr.chunk_tokens(seq.request_id, min(seq.num_uncomputed, left))
            tables = self.mgr.allocate(seq.request_id, n)
            if tables is None and not self.running:
                n, tables = self._admit_alone(seq, n, left)
            if tables is None:
                self.leave(seq)
                break
            self._start(plan, seq, n, tables)
            left -= n

    def _account(self, plan: StepPlan) -> None:
        st = self.stats
        st.steps += 1
        st.preemptions += len(plan.preempted)
        st.scheduled_tokens += plan.num_tokens
        st.batch_sum += len(plan.scheduled)
        st.max_running = max(st.max_running, len(self.running))
        if plan.num_decode:
            st.decode_steps += 1
            st.decode_batch_sum += plan.num_decode
        if plan.empty and self.running:
            raise InsufficientMemoryError("no request could be scheduled; the KV budget is too small")

    @staticmethod
    def _request_extras(seq: Sequence) -> dict:
        """``add_request`` keywords a sequence carries (images, cache salt); none for plain text."""
        extras: dict = {}
        if seq.images:
            extras["images"] = seq.images
        if seq.cache_salt is not None:
            extras["cache_salt"] = seq.cache_salt
        return extras

    def _take(self, plan: StepPlan, seq: Sequence, n: int, tables) -> None:
        sample = seq.num_computed + n == seq.num_tokens
        plan.scheduled.append(ScheduledRequest(seq, seq.num_computed, n, tables, sample))
        plan.num_tokens += n
        if n == 1 and sample and seq.output_token_ids:
            plan.num_decode += 1

    def _preempt(self, seq: Sequence) -> None:
        self.mgr.free(seq.request_id)
        seq.in_manager = False
        seq.num_computed = 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    # ----------------------------------------------------------------- update
    def update(self, plan: StepPlan, sampled: Seq[int | None]) -> list[Sequence]:
        """Commit the step: ``sampled[i]`` for ``plan.scheduled[i]`` (``None`` unless ``.sample``).

        Returns the requests that finished (already freed in the manager)."""
        if len(sampled) != len(plan.scheduled):
            raise InvalidArgumentError(f"{len(sampled)} sampled tokens for {len(plan.scheduled)} scheduled requests")
        finished = []
        for item, tok in zip(plan.scheduled, sampled, strict=True):
            seq = item.seq
            seq.num_computed += item.num_tokens
            if not item.sample:
                self.mgr.append_tokens(seq.request_id, ())
            elif self.commit(seq, tok):
                finished.append(seq)
        return finished

    def commit(self, seq: Sequence, tok) -> bool:
        """Append the token sampled for ``seq`` (its step ended the known tokens), tell the
        manager, and finish the request if it stops; True when it finished.  A subclass with a
        different sample type (e.g. several accepted speculative tokens) overrides this."""
        if tok is None:
            raise InvalidArgumentError(f"request {seq.request_id!r} needs a sampled token this step")
        seq.append(tok)
        self.mgr.append_tokens(seq.request_id, (tok,))
        reason = self._stop_reason(seq, tok)
        if reason is None:
            return False
        self._finish(seq, reason, tok if reason == "stop" else None)
        return True

    def _stop_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if (not p.ignore_eos and tok in self.eos) or tok in p.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str, stop_reason: object = None) -> None:
        """End a running request now (e.g. a stop string matched); frees its pages."""
        if seq.finished:
            return
        self._finish(seq, reason, stop_reason)

    def _finish(self, seq: Sequence, reason: str, stop_reason: object) -> None:
        seq.status = Status.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        if seq.in_manager:
            self.mgr.free(seq.request_id)
            seq.in_manager = False
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.ids.discard(seq.request_id)
