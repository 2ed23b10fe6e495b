"""A common-prefix predictor: which cached prefixes will be used again, from what the
scheduler has seen.

Two sources, in the order they are trusted:

1. **Known future uses.**  Every request waiting to be admitted (new, or preempted) names the
   block hashes of its prompt.  A cached page whose key one of them holds will be read again
   (its hit): ``live``.  A running request is no future use of the pages it has passed (a Mamba
   checkpoint it superseded, a window it left): it leaves ``live`` when it is admitted
   (``admitted``) and comes back when it is preempted (``arrive`` again).
2. **A learned return rate.**  A block (its hash: the prefix ending there) *departs* when the
   last request the scheduler holds with it (waiting or running) leaves, and *returns* when a
   request holding it arrives after that (a round of questions after the previous round is done,
   a chat's next turn after its answer).  ``return_rate`` is returns per departure over the trace
   so far, counted per block (so per byte: a shared system prompt that never departs weighs
   nothing, a retrieved chunk that departs and is seldom retrieved again in the same place weighs
   its length), with one return in two departures as the prior (no evidence: keep as jenga's
   reuse evictor always did).  A page with no live user is predicted to be used again when
   ``return_rate >= keep_share`` (pages of departed prefixes are kept only when departed
   prefixes have tended to come back), whatever its uses once a scheduler feeds the predictor
   (``keeps_used_once``): a returning prefix comes back to pages used once (a chat's next turn
   reads the new pages of the turn before it and its prompt-end state checkpoint, each written
   once).  Fed nothing, no prefix is ever seen to depart and the prior would keep every page:
   there a page is kept only once reused (``uses >= 2``), as the reuse evictor keeps it.

The value of keeping a page is the recompute it saves per byte held, times the chance it is
read again; the cost is the batch its bytes keep waiting.  Pages with a known future use save
their recompute surely, so they are kept; a page whose prefix departed saves it with the learned
chance, and is kept (``PredictedEvictor``: it holds admissions back, and is evicted after the
one-off pages) only when that chance is at least ``keep_share``.

Bounded: ``memory`` departed blocks are remembered (oldest forgotten first).  A request added
twice under one id while held (vLLM's resumed streaming sessions, a preempted request) counts once.
"""

from __future__ import annotations

from collections import OrderedDict


class NextUse:
    """Live block hashes and the learned return rate of departed prefixes (module doc)."""

    def __init__(self, *, keep_share: float = 0.5, memory: int = 1 << 18):
        self.keep_share, self.memory = keep_share, memory
        self.live: dict[bytes, int] = {}  # block hash -> waiting requests whose prompt holds it
        self._held: dict[str, list[bytes]] = {}  # request id -> its prompt hashes (waiting or running)
        self.waiting: set[str] = set()  # request ids whose hashes are in ``live``
        self._holders: dict[bytes, int] = {}  # block hash -> requests held (waiting or running) with it
        self._departed: OrderedDict[bytes, None] = OrderedDict()
        self.departures = self.returns = 0

    def arrive(self, request_id: str, hashes) -> None:
        """A request waits to be admitted, with its prompt's block ``hashes`` (vLLM's
        ``request.block_hashes`` at arrival); a preempted request waits again (its hashes again)."""
        held = self._held.get(request_id)
        if held is not None:
            if request_id not in self.waiting:
                self._count(held, 1)
                self.waiting.add(request_id)
            return
        if not hashes:
            return
        hashes = list(hashes)
        self._held[request_id] = hashes
        self._count(hashes, 1)
        self.waiting.add(request_id)
        holders, departed = self._holders, self._departed
        for h in hashes:
            n = holders.get(h, 0)
            if not n and h in departed:
                del departed[h]
                self.returns += 1
            holders[h] = n + 1

    def admitted(self, request_id: str) -> None:
        """The request runs: it reads its hit now, and no page it passes later."""
        if request_id in self.waiting:
            self.waiting.discard(request_id)
            self._count(self._held[request_id], -1)

    def _count(self, hashes: list[bytes], d: int) -> None:
        live = self.live
        for h in hashes:
            n = live.get(h, 0) + d
            if n:
                live[h] = n
            else:
                del live[h]

    def leave(self, request_id: str) -> None:
        """The request finished (or was aborted): its prompt is no known future use."""
        self.admitted(request_id)
        hashes = self._held.pop(request_id, None)
        if hashes is None:
            return
        holders, departed = self._holders, self._departed
        for h in hashes:
            n = holders[h] - 1
            if n:
                holders[h] = n
                continue
            del holders[h]
            self.departures += 1
            departed[h] = None
        while len(departed) > self.memory:
            departed.popitem(last=False)

    @property
    def holders(self) -> dict[bytes, int]:
        """Block hash -> requests the scheduler holds (waiting or running) whose prompt holds it."""
        return self._holders

    @property
    def return_rate(self) -> float:
        """Returns per departure so far, prior one in two (module doc)."""
        return (self.returns + 1) / (self.departures + 2)

    def keeps_departed(self) -> bool:
        """Whether a reused page with no live user is predicted to be read again."""
        return self.return_rate >= self.keep_share

    def keeps_used_once(self) -> bool:
        """Whether a page used once with no live user is predicted to be read again: a scheduler
        feeds this predictor (it was told of a request) and departed prefixes tend to return."""
        return bool(self._held or self.departures) and self.keeps_departed()
