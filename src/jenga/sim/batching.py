"""The engine's continuous-batching scheduler, adapted to the simulator.

The simulator reuses :class:`jenga.sched.scheduler.Scheduler` (FCFS admission with
``lookup`` then ``allocate``, chunked prefill under a token budget, preemption by recompute
of the newest running request) so the simulator and the engine share one scheduling policy.
:class:`SimScheduler` only adds what a trace needs and the engine does not:

* **images** — :class:`ManagerView` passes each request's image spans to ``add_request``;
* **speculative decoding** — a decoding request's ``allocate`` asks for ``num_lookahead``
  extra slots (capped at the model's maximum length), and :meth:`SimScheduler.update` takes
  a *list* of accepted tokens per request;
* **admission back-off** — the engine scheduler frees a waiting head whose first chunk did
  not fit and re-adds it (re-hashing the whole prompt and re-running ``lookup``) on every
  step.  For 100k-token prompts that dominated the simulator's wall time, so after a failed
  admission the head is retried only once a request finished or was preempted, or every
  ``RETRY_EVERY`` steps (memory can also grow as windows slide).
* **scheduler kind** — :data:`SCHEDULERS` maps a name to the class: ``chunked`` (the engine's
  v1-like mixed chunked prefill; vLLM v1) or ``v0`` (:class:`jenga.sched.v0_scheduler.V0Scheduler`:
  whole-prompt admission and prefill-only steps; vLLM v0 with chunked prefill off).
* **rejection** — a request that cannot fit even with nothing else running (its first chunk
  does not fit an empty cache, or it had to preempt itself) is removed with a reason instead
  of raising or looping forever.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from jenga.errors import InsufficientMemoryError, InvalidArgumentError
from jenga.sched.scheduler import Scheduler, StepPlan
from jenga.sched.sequence import Sequence, Status
from jenga.sched.v0_scheduler import V0Scheduler


class ManagerView:
    """Forwards the ``KVCacheManager`` calls the scheduler makes, adding images on
    ``add_request`` and speculative lookahead on a decoding request's ``allocate``."""

    def __init__(self, mgr, num_lookahead: int = 0):
        self.mgr = mgr
        self.model = mgr.model
        self.max_len = mgr.model.max_model_len
        self.k = num_lookahead
        self.images: dict[object, tuple] = {}
        self.seqs: dict[object, Sequence] = {}
        self.decoding: set[object] = set()

    def add_request(self, rid, tokens) -> None:
        self.mgr.add_request(rid, tokens, images=self.images.get(rid, ()))

    def lookup(self, rid, *, max_tokens: int | None = None) -> int:
        return self.mgr.lookup(rid, max_tokens=max_tokens)

    def allocate(self, rid, n: int):
        if self.k and rid in self.decoding:
            start = self.seqs[rid].num_computed
            return self.mgr.allocate(rid, n, num_lookahead=max(0, min(self.k, self.max_len - start - n)))
        return self.mgr.allocate(rid, n)

    def chunk_tokens(self, rid, n: int) -> int:
        return self.mgr.chunk_tokens(rid, n)

    def can_allocate(self, rid, n: int) -> bool:  # a prefill chunk: no lookahead
        return self.mgr.can_allocate(rid, n)

    def append_tokens(self, rid, ids) -> None:
        self.mgr.append_tokens(rid, ids)

    def free(self, rid) -> None:
        self.decoding.discard(rid)
        self.mgr.free(rid)


RETRY_EVERY = 8


class SimScheduler(Scheduler):
    """:class:`Scheduler` over a :class:`ManagerView`; see the module docstring.

    ``rejected`` maps request id -> reason for requests dropped because they can never fit.
    """

    def __init__(self, view: ManagerView, **kw):
        super().__init__(view, **kw)
        self.view = view
        self.rejected: dict[object, str] = {}
        self._epoch = 0  # finished + preempted requests so far
        self._blocked: tuple[int, int] | None = None  # (epoch, step) of the last failed admission
        self._head_failed = False  # this step's waiting head did not fit in memory

    def add_sim(self, seq: Sequence, images: tuple = ()) -> None:
        self.view.seqs[seq.request_id] = seq
        if images:
            self.view.images[seq.request_id] = tuple(images)
        self.add(seq)

    def reject(self, seq: Sequence, reason: str) -> None:
        if seq.in_manager:
            self.view.free(seq.request_id)
            seq.in_manager = False
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = "rejected"
        self.ids.discard(seq.request_id)
        self._forget(seq.request_id)
        self.rejected[seq.request_id] = reason

    def _memory_note(self) -> str:
        s = self.view.mgr.stats()
        g = float(1 << 30)
        return (f"{s.total_bytes / g:.1f} GiB total, {s.used_bytes / g:.1f} used, {s.cached_bytes / g:.1f} cached, "
                f"{s.free_bytes / g:.1f} free")

    def _forget(self, rid) -> None:
        self.view.seqs.pop(rid, None)
        self.view.images.pop(rid, None)
        self.view.decoding.discard(rid)

    def schedule(self) -> StepPlan:
        """One step's plan; requests that can never fit are rejected on the way."""
        while True:
            skip = (self._blocked is not None and self.running and self._blocked[0] == self._epoch
                    and (self.stats.steps - self._blocked[1]) % RETRY_EVERY)
            saved = self.max_num_seqs
            self._head_failed = False
            if skip:
                self.max_num_seqs = 0  # the admission loop does not run this step
            try:
                plan = super().schedule()
            except InsufficientMemoryError:
                if len(self.running) == 1:  # alone and its next chunk still does not fit
                    seq = self.running[0]
                    self.reject(seq, f"grew to {seq.num_tokens} tokens, more than the KV cache holds with "
                                     f"nothing else running ({self._memory_note()})")
                elif not self.running and self.waiting:
                    seq = self.waiting[0]
                    self.reject(seq, f"{seq.num_tokens} tokens: the first chunk does not fit with nothing else "
                                     f"running ({self._memory_note()})")
                else:
                    raise
                continue
            finally:
                self.max_num_seqs = saved
            self._epoch += len(plan.preempted)
            if not skip and self._head_failed and not plan.preempted:
                if self._blocked is None or self._blocked[0] != self._epoch:
                    self._blocked = (self._epoch, self.stats.steps)  # the head was tried and did not fit
            elif not skip:
                self._blocked = None
            for seq in plan.preempted:
                if not self.running and seq is plan.preempted[-1] and not plan.scheduled:
                    # it preempted everything else and then itself: it can never fit
                    self.reject(seq, f"grew to {seq.num_tokens} tokens, more than the KV cache holds with nothing "
                                     f"else running ({self._memory_note()})")
            return plan

    def leave(self, seq: Sequence) -> None:
        self._head_failed = True
        super().leave(seq)

    def update(self, plan: StepPlan, sampled: Seq[Seq[int] | None]) -> list[Sequence]:
        """Commit the step: ``sampled[i]`` is the list of tokens accepted for
        ``plan.scheduled[i]`` (``None`` for a non-final prefill chunk).  A request stops at
        ``max_tokens`` outputs (extra accepted tokens are dropped) or the model's max length.
        Returns the finished requests (already freed in the manager)."""
        if len(sampled) != len(plan.scheduled):
            raise InvalidArgumentError(f"{len(sampled)} samples for {len(plan.scheduled)} scheduled requests")
        return super().update(plan, sampled)

    def commit(self, seq: Sequence, toks: Seq[int] | None) -> bool:
        if not toks:
            raise InvalidArgumentError(f"request {seq.request_id!r} needs sampled tokens this step")
        room = min(seq.params.max_tokens - len(seq.output_token_ids), self.max_model_len - seq.num_tokens)
        toks = list(toks[:max(1, room)])
        seq.tokens.extend(toks)
        seq.output_token_ids.extend(toks)
        self.view.append_tokens(seq.request_id, toks)
        if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            self._epoch += 1
            self.finish(seq, "length")
            self._forget(seq.request_id)
            return True
        self.view.decoding.add(seq.request_id)
        return False


class V0SimScheduler(SimScheduler, V0Scheduler):
    """:class:`SimScheduler` whose steps follow :class:`V0Scheduler` (no chunked prefill)."""


#: Scheduler kind -> class (``SimConfig.scheduler``).
SCHEDULERS: dict[str, type[SimScheduler]] = {"chunked": SimScheduler, "v0": V0SimScheduler}
