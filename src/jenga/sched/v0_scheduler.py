"""vLLM-v0-style scheduling without chunked prefill (``--enable-chunked-prefill=False``).

The paper's "vLLM" baseline for Llama 3.2 Vision, Ministral, Jamba and the character model is
a vLLM fork of about v0.6.3 run with chunked prefill off (artifact ``figure14.md``).  Its
scheduler differs from :class:`~jenga.sched.scheduler.Scheduler` (v1-like mixed chunked
prefill) in three ways, all reproduced here:

* **Whole prompts.** A waiting request is admitted only if the manager can allocate its
  *whole* (uncached) prompt at once; otherwise it waits (admission stops, FCFS).
* **Prefill-only steps.** While requests are waiting and fit, a step runs only prefills, up to
  ``max_num_batched_tokens`` prompt tokens in total — vLLM v0's default with chunked prefill
  off is ``max(max_model_len, 2048)`` — and at most ``max_num_seqs`` (256) running requests.
  Running requests do not decode in such a step.
* **Decode steps.** Otherwise every running request decodes one token; when an allocation
  fails the newest running request is preempted by recompute (as in the v1 scheduler).

Everything else (``update``, ``finish``, preemption bookkeeping, stats) is the base class's.
"""

from __future__ import annotations

from collections.abc import Iterable

from jenga.errors import InvalidArgumentError
from jenga.sched.scheduler import Scheduler, StepPlan
from jenga.sched.sequence import Sequence

#: vLLM v0's floor on the token budget when chunked prefill is off (``SchedulerConfig``).
V0_MIN_BATCHED_TOKENS = 2048
#: vLLM v0's default ``max_num_seqs``.
V0_MAX_NUM_SEQS = 256


def v0_token_budget(max_model_len: int) -> int:
    """vLLM v0's default ``max_num_batched_tokens`` without chunked prefill."""
    return max(max_model_len, V0_MIN_BATCHED_TOKENS)


class V0Scheduler(Scheduler):
    """See the module docstring.  ``max_num_batched_tokens=None`` takes v0's default."""

    def __init__(self, manager, *, max_num_seqs: int = V0_MAX_NUM_SEQS, max_num_batched_tokens: int | None = None,
                 max_model_len: int | None = None, eos_token_ids: Iterable[int] = ()):
        max_len = max_model_len or manager.model.max_model_len
        budget = v0_token_budget(max_len) if max_num_batched_tokens is None else max_num_batched_tokens
        super().__init__(manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                         max_model_len=max_len, eos_token_ids=eos_token_ids)

    def add(self, seq: Sequence) -> None:
        if seq.num_tokens > self.budget:  # v0 ignores such a prompt: it can never be prefilled in one step
            raise InvalidArgumentError(f"request {seq.request_id!r}: prompt of {seq.num_tokens} tokens exceeds "
                                       f"max_num_batched_tokens {self.budget} (no chunked prefill)")
        super().add(seq)

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.touched = []
        self._prefill(plan)
        if plan.empty:
            self._schedule_running(plan, max(self.budget, len(self.running)))
        self._account(plan)
        return plan

    def _prefill(self, plan: StepPlan) -> None:
        left = self.budget
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            self._enter(seq)
            n = seq.num_uncomputed
            tables = self.mgr.allocate(seq.request_id, n) if n <= left else None
            if tables is None and n <= left and not self.running:  # alone: its held hit may not fit
                self.drop_hit(seq)
                n = seq.num_uncomputed
                tables = self.mgr.allocate(seq.request_id, n) if n <= left else None
            if tables is None:
                if n > left:  # over this step's budget: next prefill step
                    self.mgr.free(seq.request_id)
                    seq.in_manager, seq.num_computed = False, 0
                else:
                    self.leave(seq)  # the whole prompt does not fit now (raises if nothing runs)
                break
            self._start(plan, seq, n, tables)
            left -= n
