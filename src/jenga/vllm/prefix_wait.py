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
requests may be admitted in its place (vLLM's ``_handle_blocked_waiting_request`` skip: it
keeps its place at the head of the queue).  A request waits at most ``max_waits`` steps, and a
preempted one never (its recompute is owed already).

*The queue behind a held request* (:meth:`PrefixWait.stops`).  vLLM's loop stops at such a
request; jenga's stops behind a long one (at least half a step's tokens) while the pool is
pressed, ``stops_from`` (a third) or more of its bytes held by requests (vLLM's ``usage``: cached
pages count as free).  Admitted in the held request's place there, another long prompt takes the
pages the held one needs once its prefix lands, and it then waits for that prompt to finish:
Falcon-H1-7B inside vLLM 0.34, 16 articles x 4 questions at 4 % of the H100 budget, each article's
first question prefilling, its three others held, the next article's first question admitted
behind them: batch 3.0 against vLLM-best's 3.7, 0.90x its req/s; with the queue stopped, 1.00x.
Below a third, the pages others take leave room for the held one, and stopping only delays them
(Jamba-1.5-Mini, 200 short prompts over 8 system prompts at the real H200 budget: 21 steps,
stopped 25, 63.0 against 62.4 req/s).  Behind a short held prompt stopping only delays the others
too (measured, the same 4 % budget: RAG prompts on Nemotron-H-8B 6.26 -> 6.37 req/s and p99 TTFT
25.9 -> 25.3 s, vLLM-best 25.6 s, going on behind prompts under 4,096 tokens; at 8,192, Nemotron-H-8B's
round-robin chats lose what stopping gains them, 5.21 -> 5.06 req/s).

*The queue behind a prefix admitted this step* (:meth:`PrefixWait.leads`, :meth:`PrefixWait.skips`).
A long prompt admitted this step (at least half a step's tokens to compute) whose prompt waiting
requests will read (the scheduler's common-prefix predictor knows them) is such a prefix in flight
too, though its readers are not held: they miss now and sit behind the misses in the admission
order.  While the pool is pressed, the misses behind it wait this step: admitted, one takes the pages
its readers need once the prefix lands.  Llama-4-Scout inside vLLM 0.34, round-robin chats at 4 % of
the H100 budget: a chat's first turn prefilling, the next chat's first turn admitted behind it, the
five later turns that read the first one's prompt admitted a 64-step wave later: 6.66 req/s without
this rule, 7.05 with it (vLLM-best 7.10); Falcon-H1-7B's chats, whose readers the hold above covers,
5.80 -> 5.68 (vLLM-best 5.34).

``JENGA_VLLM_PREFIX_WAIT``: ``priced`` (the default: the rule above), ``always`` (whenever the
hit will grow), ``off`` (never hold).  ``JENGA_VLLM_PREFIX_WAIT_STOPS``: ``pressed`` (the default:
above), ``always`` (vLLM's rule), ``never`` (others go on at any usage); both queues above.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from jenga.errors import InvalidArgumentError
from jenga.vllm.switches import switch

PREFIX_WAIT_ENV = "JENGA_VLLM_PREFIX_WAIT"
PREFIX_WAITS = ("priced", "always", "off")
PREFIX_WAIT_STOPS_ENV = "JENGA_VLLM_PREFIX_WAIT_STOPS"
PREFIX_WAIT_STOPS = ("pressed", "always", "never")


def prefix_wait_name() -> str:
    """The rule ``JENGA_VLLM_PREFIX_WAIT`` asks for (default ``priced``)."""
    return switch(PREFIX_WAIT_ENV, PREFIX_WAITS, "priced")


def prefix_wait_stops() -> float:
    """The usage from which the queue behind a held request waits too (``JENGA_VLLM_PREFIX_WAIT_STOPS``:
    ``pressed`` a third, ``always`` 0, ``never`` above any usage)."""
    return {"pressed": 1 / 3, "always": 0.0, "never": math.inf}[switch(PREFIX_WAIT_STOPS_ENV, PREFIX_WAIT_STOPS,
                                                                         "pressed")]


class PrefixWait:
    """Decides, per waiting request and step, whether it waits for a prefix in flight (module doc).

    ``cached(request, in_flight)``: the tokens of its prompt a lookup finds now, or once the
    steps in flight commit (read only); ``writing()``: whether any step in flight writes pages
    that join the cache only at its commit (no probe otherwise); ``step_tokens``: the scheduler's
    token budget of one step; ``usage()``: the share of the pool's bytes requests hold, and
    ``stops_from``: the usage from which the queue behind a held request of at least half a step's
    tokens waits too (``stops``)."""

    def __init__(self, cached: Callable[[object, bool], int], writing: Callable[[], bool], *, step_tokens: int,
                 priced: bool = True, max_waits: int = 8, usage: Callable[[], float] = lambda: 0.0,
                 stops_from: float = math.inf):
        if step_tokens <= 0 or max_waits < 0 or not stops_from >= 0:
            raise InvalidArgumentError(f"PrefixWait: step_tokens {step_tokens} must be > 0, max_waits {max_waits} "
                                       f">= 0, stops_from {stops_from} >= 0")
        self.cached, self.writing, self.usage = cached, writing, usage
        self.step_tokens, self.priced, self.max_waits, self.stops_from = step_tokens, priced, max_waits, stops_from
        self.waits: dict[str, int] = {}  # request id -> steps it was held
        self.held = 0  # holds so far (one per request and step)
        self.leading = False  # a long prompt admitted this step has readers waiting (``leads``)

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

    def stops(self, request) -> bool:
        """Whether, ``holds`` having held ``request`` this step, the requests behind it wait too (the
        module doc): it is long (at least half a step's tokens) and the pool is pressed."""
        return 2 * request.num_tokens >= self.step_tokens and self.usage() >= self.stops_from

    def new_step(self) -> None:
        """A scheduler step starts: nothing admitted in it yet."""
        self.leading = False

    def leads(self, request, readers: int) -> None:
        """``request`` was admitted this step (``num_computed_tokens`` its hit) and ``readers``
        waiting requests will read its whole prompt: from a long one (at least half a step's tokens
        to compute) on, ``skips`` may skip the misses behind it (the module doc)."""
        if readers > 0 and 2 * (request.num_prompt_tokens - request.num_computed_tokens) >= self.step_tokens:
            self.leading = True

    def skips(self, cached: Callable[[], int]) -> bool:
        """Whether a waiting request behind a prefix ``leads`` saw admitted this step waits this step:
        the pool is pressed and the request misses (``cached()``: the tokens of its prompt cached,
        asked last)."""
        return self.leading and self.usage() >= self.stops_from and not cached()

    def forget(self, request_id: str) -> None:
        """``request_id`` left the scheduler (finished, aborted)."""
        self.waits.pop(request_id, None)
