"""Where a prefill step stops for a junction off vLLM's Mamba block grid: priced.

With jenga's pages finer than an align-mode Mamba block, vLLM's scheduler ends a prefill step at
the junction jenga reports (the shared-prefix boundary: where the prompt leaves the cached prefix,
a hash-block multiple) so that jenga checkpoints the state there.  A junction off the block grid
costs the request a second stop: the next step starts inside a block and must end on the next
block boundary (vLLM's ``_mamba_block_aligned_split``: a block-table column holds the state after
a whole block), so its prefill takes one step more and its first token comes a step later.  What
the exact junction saves: a later request sharing the prefix up to it resumes there instead of at
the block boundary below, ``junction - boundary`` tokens (less than a block) of recompute.  Stock
vLLM stops at the boundary below (it takes the exact junction only with EAGLE drafts).

:class:`JunctionStop` prices it as :mod:`jenga.vllm.prefix_wait` prices a hold: recomputing
``saved`` tokens lengthens a full step by ``saved / max_num_batched_tokens`` of it for every
request the scheduler serves, once per later request that resumes from the junction's state
(its *readers*: the requests waiting with the prefix up to the junction in their prompt, the
common-prefix predictor's known future uses, :class:`jenga.core.prefix.next_use.NextUse`; at least
one, the sibling a junction implies); the extra stop delays this request alone, by one step::

    saved tokens x readers x requests in the scheduler  >=  max_num_batched_tokens

stops at the junction, else at the block boundary below it (no junction stop when that is not
past the hit).  A short system prompt below the block saves the whole prompt per request and keeps
its exact junction under load; a few requests branching a long prefix a few tokens past a
boundary do not pay a step for it (measured: Jamba-1.5-Mini agent-branch at the tight budget,
``benchmarks/vs_vllm_sched.py``: p99 TTFT 0.91 s with every junction exact, vLLM's best 0.72 s).
The price of the rule there: Nemotron-H-8B on the same trace (528-token block) stops its
1,488-token system prompt 432 tokens below while few requests run (exact from 19 on), req/s
1.05x -> 1.00x of vLLM-best, p99 TTFT 1.00x (a ski-rental memory of the recompute left below a
junction, or counting its running holders as readers, measured worse: p99 1.03x-1.07x there).

``JENGA_VLLM_JUNCTION_STOP``: ``priced`` (the default: the rule above), ``exact`` (always at the
junction), ``grid`` (always at the boundary below, stock vLLM's rule).
"""

from __future__ import annotations

from collections.abc import Callable

from jenga.errors import InvalidArgumentError
from jenga.vllm.switches import switch

JUNCTION_STOP_ENV = "JENGA_VLLM_JUNCTION_STOP"
JUNCTION_STOPS = ("priced", "exact", "grid")


def junction_stop_name() -> str:
    """The rule ``JENGA_VLLM_JUNCTION_STOP`` asks for (default ``priced``)."""
    return switch(JUNCTION_STOP_ENV, JUNCTION_STOPS, "priced")


class JunctionStop:
    """Where a request's junction step stop and checkpoint go (module doc).

    ``block``: vLLM's Mamba block (its scheduler's ``cache_config.block_size``); ``step_tokens``: the
    scheduler's token budget of one step; ``num_requests()``: the requests it serves (waiting and
    running)."""

    def __init__(self, block: int, *, step_tokens: int, num_requests: Callable[[], int], rule: str = "priced"):
        if block <= 0 or step_tokens <= 0 or rule not in JUNCTION_STOPS:
            raise InvalidArgumentError(f"JunctionStop: block {block} and step_tokens {step_tokens} must be > 0, "
                                       f"rule {rule!r} one of {', '.join(JUNCTION_STOPS)}")
        self.block, self.step_tokens, self.num_requests, self.rule = block, step_tokens, num_requests, rule

    def stop(self, junction: int, hit: int, readers: int = 1) -> int:
        """The stop for a request whose lookup found ``hit`` tokens and ``junction`` (0: none),
        ``readers`` the requests known to wait for the prefix up to the junction: the junction
        itself, or the block boundary below it, or 0 (none past the hit)."""
        if junction <= 0 or self.rule == "exact" or junction % self.block == 0:
            return junction
        below = junction // self.block * self.block
        below = below if below > hit else 0
        saved = (junction - max(below, hit)) * max(1, readers)
        if self.rule == "priced" and saved * self.num_requests() >= self.step_tokens:
            return junction
        return below


def junction_step_end(junction: int, num_prompt_tokens: int, hit: int, block: int) -> int:
    """Where vLLM's align-mode scheduler ends the step that reaches the shared-prefix boundary
    ``junction`` it was handed (``_mamba_block_aligned_split``), for a request resuming at ``hit``:
    the junction itself inside the prompt; past it (a preempted request recomputing its output
    tokens) the last ``block`` multiple of tokens from ``hit`` below it, 0 when that is the hit
    (no stop).  jenga's junction checkpoint must sit there: vLLM's worker writes a state only at
    a step's end."""
    if junction <= num_prompt_tokens:
        return junction
    floored = hit + (junction - hit) // block * block
    return floored if floored > hit else 0


def resumed_prompt_stop(num_prompt_tokens: int, num_tokens: int, hash_block: int, block: int) -> int | None:
    """Where vLLM's align-mode scheduler stops near the prompt's end while recomputing a request
    resumed with ``num_tokens - num_prompt_tokens`` output tokens (``_mamba_block_aligned_split``):
    its partial-tail stop, the last ``hash_block`` multiple strictly inside the prompt, where that
    lies past its last cacheable ``block`` boundary before the known tokens' end; else that
    boundary (0: none).  ``None`` for a request with no output tokens: its steps stop on the
    prompt's last full block, jenga's default prompt-end checkpoint."""
    if num_tokens <= num_prompt_tokens:
        return None
    last = (num_tokens - 1) // block * block
    tail = (num_prompt_tokens - 1) // hash_block * hash_block
    return tail if last < tail < num_prompt_tokens else last
