"""Holding an admission back one step while a step in flight computes its prefix.

On a hybrid model a request resumes only from a cached state checkpoint, and a checkpoint
joins the cache when the step that writes it is committed (the attention pages of the same
prefix are findable from their allocate on).  When many requests sharing a prefix arrive
together (a system prompt), admitting them all in the same step computes the shared prefix
once per request; admitted one step later, each resumes from the checkpoint the first one
writes.  vLLM's own scheduler has a rule of this kind: with Mamba's ``align`` cache mode an
admission whose hit resumes from a state another request writes in the same step is refused,
and its admission loop stops there.

:class:`PrefixWait` asks jenga what the request's hit will be once the steps in flight commit
(``KVCacheManager.cached_tokens(..., in_flight=True)``) against what it is now, and holds the
request this step when the recompute it saves is worth the step it waits:

    saved tokens x requests in the scheduler  >=  max_num_batched_tokens

Recomputing ``saved`` tokens now lengthens a full step by about ``saved / max_num_batched_tokens``
of it, and every request the scheduler serves waits that much longer; holding delays the held
request alone, by one step.  So with 200 requests queued behind a 512-token system prompt every
duplicate waits, and a lone request sharing a short prefix with one in flight does not.  Other
requests go on being admitted in its place (vLLM's ``_handle_blocked_waiting_request`` skip: it
keeps its place at the head of the queue).  A request waits at most ``max_waits`` steps, and a
preempted one never (its recompute is owed already).

``JENGA_VLLM_PREFIX_WAIT``: ``priced`` (the default: the rule above), ``always`` (whenever the
hit will grow), ``off`` (never hold).
"""

from __future__ import annotations

from collections.abc import Callable

from jenga.errors import InvalidArgumentError
from jenga.vllm.switches import switch

PREFIX_WAIT_ENV = "JENGA_VLLM_PREFIX_WAIT"
PREFIX_WAITS = ("priced", "always", "off")


def prefix_wait_name() -> str:
    """The rule ``JENGA_VLLM_PREFIX_WAIT`` asks for (default ``priced``)."""
    return switch(PREFIX_WAIT_ENV, PREFIX_WAITS, "priced")


class PrefixWait:
    """Decides, per waiting request and step, whether it waits for a prefix in flight (module doc).

    ``cached(request, in_flight)``: the tokens of its prompt a lookup finds now, or once the
    steps in flight commit (read only); ``writing()``: whether any step in flight writes pages
    that join the cache only at its commit (no probe otherwise); ``step_tokens``: the scheduler's
    token budget of one step."""

    def __init__(self, cached: Callable[[object, bool], int], writing: Callable[[], bool], *, step_tokens: int,
                 priced: bool = True, max_waits: int = 8):
        if step_tokens <= 0 or max_waits < 0:
            raise InvalidArgumentError(f"PrefixWait: step_tokens {step_tokens} must be > 0, max_waits {max_waits} >= 0")
        self.cached, self.writing = cached, writing
        self.step_tokens, self.priced, self.max_waits = step_tokens, priced, max_waits
        self.waits: dict[str, int] = {}  # request id -> steps it was held
        self.held = 0  # holds so far (one per request and step)

    def holds(self, request, num_requests: int) -> bool:
        """Whether ``request`` (about to be admitted, nothing computed) waits this step;
        ``num_requests``: the requests the scheduler serves (waiting and running)."""
        if request.num_preemptions or request.num_computed_tokens or not self.writing():
            return False
        rid = request.request_id
        if self.waits.get(rid, 0) >= self.max_waits:
            return False
        saved = self.cached(request, True) - self.cached(request, False)
        if saved <= 0 or (self.priced and saved * num_requests < self.step_tokens):
            return False
        self.waits[rid] = self.waits.get(rid, 0) + 1
        self.held += 1
        return True

    def forget(self, request_id: str) -> None:
        """``request_id`` left the scheduler (finished, aborted)."""
        self.waits.pop(request_id, None)
