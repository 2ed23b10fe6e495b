"""Why a lookup missed: the prompt tokens a hit could have covered but did not, by cause.

A lookup's reach is ``top`` (whole blocks, never the last token).  What it misses below ``top``
is classified once per request, at its lookup, and counted at its first allocate (with the hit
counters, so a lookup repeated while the request waits counts once):

* ``window_evicted``: every full-attention page was cached further, but a sliding or chunked
  group lacks the window before it (the policy that cut the hit names the cause, ``miss_reason``);
* ``no_checkpoint``: the same, cut by a state group with no checkpoint at that position;
* ``evicted``: the first full-attention page missing was cached once and evicted under pressure
  (the index keeps use counts of evicted keys; only with the reuse order, else ``never_cached``);
* ``other_salt``: nothing cached under this request's salt / adapter, but a recent prompt with
  the same first block ran under another one (a memo of first blocks, ``memo_size`` entries);
* ``never_cached``: none of the above.

Cost: on a miss, one ``longest_prefix`` per group at the full-attention reach, one dict probe.
"""

from __future__ import annotations

from jenga.core.request import Request

REASONS = ("window_evicted", "no_checkpoint", "evicted", "other_salt", "never_cached")


class MissReasons:
    """Missed prompt tokens per reason (module doc)."""

    def __init__(self, block: int, memo_size: int = 4096):
        self.block = block
        self.memo_size = memo_size
        self._first: dict[bytes, bytes] = {}  # first block's token bytes -> salt root it last ran under

    def classify(self, req: Request, top: int, reach: int, hit: int, policies, bound, ops, index) -> tuple:
        """``((reason, tokens), ...)`` for a lookup of ``req`` that could hit ``top`` tokens, whose
        full-attention pages reach ``reach`` and which hit ``hit``; remembers its first block."""
        out = []
        if hit < reach:  # some other group cut the hit
            reason = next((pol.miss_reason for pol in policies
                           if pol is not bound and pol.longest_prefix(req, reach, ops) < reach), "window_evicted")
            out.append((reason, reach - hit))
        lo = max(hit, reach)
        if lo < top:
            out.append((self._cold_reason(req, lo, bound, index), top - lo))
        first = req.tokens[:self.block].tobytes() if len(req.tokens) >= self.block else None
        if first is not None:
            self._first.pop(first, None)
            self._first[first] = req.salt_root
            if len(self._first) > self.memo_size:
                del self._first[next(iter(self._first))]  # the oldest
        return tuple(out)

    def _cold_reason(self, req: Request, pos: int, bound, index) -> str:
        if bound is not None and index.uses is not None:
            m = bound.tpp // self.block
            i = (pos // bound.tpp + 1) * m - 1
            if i < len(req.hashes) and index.seen(bound.gi, req.hashes[i]):
                return "evicted"
        if pos == 0 and len(req.tokens) >= self.block:
            salt = self._first.get(req.tokens[:self.block].tobytes())
            if salt is not None and salt != req.salt_root:
                return "other_salt"
        return "never_cached"
