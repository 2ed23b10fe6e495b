"""A common-prefix predictor: which cached prefixes will be used again, from what the
scheduler has seen.

Two sources, in the order they are trusted:

1. **Known future uses.**  Every request the scheduler holds (waiting or running) names the
   block hashes of its prompt.  A cached page whose key one of them holds will be read again
   (a waiting request's hit, a preempted request's resume): ``live(key)``.
2. **A learned return rate.**  A prefix (named by its first block hash) *departs* when its last
   live request leaves, and *returns* when a request starting with it arrives after that (a
   round of questions after the previous round is done, a chat's next turn after its answer).
   ``return_rate`` is returns per departure over the trace so far, with one return in two
   departures as the prior (no evidence: keep as jenga's reuse evictor always did).  A page with
   no live user is predicted to be used again when it was already reused (``uses >= 2``) and
   ``return_rate >= keep_share``: pages of departed prefixes are kept only when departed
   prefixes have tended to come back.

The value of keeping a page is the recompute it saves per byte held, times the chance it is
read again; the cost is the batch its bytes keep waiting.  Pages with a known future use save
their recompute surely, so they are kept; a page whose prefix departed saves it with the learned
chance, and is kept (``PredictedEvictor``: it holds admissions back, and is evicted after the
one-off pages) only when that chance is at least ``keep_share``.

Bounded: ``memory`` departed prefixes are remembered (oldest forgotten first).  A request added
twice under one id (vLLM's resumed streaming sessions) counts once.
"""

from __future__ import annotations

from collections import OrderedDict


class NextUse:
    """Live block hashes and the learned return rate of departed prefixes (module doc)."""

    def __init__(self, *, keep_share: float = 0.5, memory: int = 1 << 16):
        self.keep_share, self.memory = keep_share, memory
        self.live: dict[bytes, int] = {}  # block hash -> live requests whose prompt holds it
        self._held: dict[str, list[bytes]] = {}  # request id -> the prompt hashes it counted
        self._firsts: dict[bytes, int] = {}  # first block hash -> live requests starting with it
        self._departed: OrderedDict[bytes, None] = OrderedDict()
        self.departures = self.returns = 0

    def arrive(self, request_id: str, hashes) -> None:
        """A request the scheduler now holds, with its prompt's block ``hashes`` (vLLM's
        ``request.block_hashes`` at arrival)."""
        if request_id in self._held or not hashes:
            return
        hashes = list(hashes)
        self._held[request_id] = hashes
        live = self.live
        for h in hashes:
            live[h] = live.get(h, 0) + 1
        first = hashes[0]
        n = self._firsts.get(first, 0)
        if not n and first in self._departed:
            del self._departed[first]
            self.returns += 1
        self._firsts[first] = n + 1

    def leave(self, request_id: str) -> None:
        """The request finished (or was aborted): its prompt is no known future use."""
        hashes = self._held.pop(request_id, None)
        if hashes is None:
            return
        live = self.live
        for h in hashes:
            n = live[h] - 1
            if n:
                live[h] = n
            else:
                del live[h]
        first = hashes[0]
        n = self._firsts[first] - 1
        if n:
            self._firsts[first] = n
            return
        del self._firsts[first]
        self.departures += 1
        self._departed[first] = None
        if len(self._departed) > self.memory:
            self._departed.popitem(last=False)

    @property
    def return_rate(self) -> float:
        """Returns per departure so far, prior one in two (module doc)."""
        return (self.returns + 1) / (self.departures + 2)

    def keeps_departed(self) -> bool:
        """Whether a reused page with no live user is predicted to be read again."""
        return self.return_rate >= self.keep_share
