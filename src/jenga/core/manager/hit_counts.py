"""``HitCounts``: prompt tokens looked up and found cached, for the prefix hit rates.

A request counts once, at its first ``allocate`` (its lookup's hit is final then).  A request
freed while running and added again under the same id (a preemption) is a *repeat*: it counts
in the totals but not in the first-lookup figures, which measure what the cache holds for new
prompts.  The ids of the last ``REPEAT_MEMO_SIZE`` freed requests that had run are remembered.
"""

from __future__ import annotations

from jenga.core.request import Request

REPEAT_MEMO_SIZE = 256  # freed ids remembered as having run (a re-add is a repeat lookup)


class HitCounts:
    """Token counters over all lookups (``hit_tokens`` / ``query_tokens``) and over first
    lookups only (``first_hit_tokens`` / ``first_query_tokens``), and the repeat memo."""

    def __init__(self):
        self.hit_tokens = 0
        self.query_tokens = 0
        self.first_hit_tokens = 0
        self.first_query_tokens = 0
        self._ran: dict[object, bool] = {}  # freed request ids that had run (their re-add is a repeat)

    def is_repeat(self, request_id: object) -> bool:
        """Whether a request added under ``request_id`` is a re-add of one that ran (forgets it)."""
        return self._ran.pop(request_id, False)

    def count(self, req: Request) -> None:
        """Count ``req``'s prompt and hit, once (its first allocate)."""
        if not req.counted:
            req.counted = True
            self.query_tokens += req.prompt_len
            self.hit_tokens += req.hit
            if not req.repeat:
                self.first_query_tokens += req.prompt_len
                self.first_hit_tokens += req.hit

    def freed(self, req: Request) -> None:
        """``req`` was freed: remember its id if it had run (a later re-add is a repeat)."""
        if req.counted or req.repeat:
            ran = self._ran
            ran[req.request_id] = True
            if len(ran) > REPEAT_MEMO_SIZE:
                del ran[next(iter(ran))]  # the oldest
