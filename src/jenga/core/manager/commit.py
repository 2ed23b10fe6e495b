"""``StepCommit``: the end of a step, committed (``append_tokens``) or dropped before its commit.

*Commit*: the allocated tokens were computed (but the last ``num_rejected``, draft tokens the
verifier rejected); the computed blocks are hashed and join the prefix index, and once a group
has work (``Policy.next_event``) its policy commits: full pages become reusable, pages out of
window or chunk are released.

*Aborted fill*: pages registered at allocate (findable from then on, so requests of the same
step share them) whose step did not run for their request.  A request freed, or rejecting
tokens, after ``allocate`` and before ``append_tokens`` committed them leaves pages that nobody
writes; they leave the prefix index so no later lookup serves them.  A request that already
holds such a page (looked up after the allocate, in the same step) would read it unwritten: that
order is refused, before any change.  Schedulers preempt in the running pass, before admitting
(vLLM's, jenga's).
"""

from __future__ import annotations

from jenga.core.manager.ledger import PageLedger
from jenga.core.policy.base import NEVER, Policy
from jenga.core.prefix.index import PrefixIndex, PromptHasher
from jenga.core.request import Request
from jenga.errors import InvalidArgumentError


class StepCommit:
    """Commits or drops a request's step; the manager has checked the caller's input."""

    def __init__(self, policies: list[Policy], ledger: PageLedger, hasher: PromptHasher, index: PrefixIndex,
                 block: int, caching: bool):
        self.policies, self.ledger, self.hasher, self.index = policies, ledger, hasher, index
        self.block, self.caching = block, caching

    def commit(self, req: Request, token_ids, num_rejected: int) -> None:
        """``KVCacheManager.append_tokens`` for the live record ``req`` (module doc)."""
        computed = req.num_computed + req.num_scheduled - num_rejected
        aborted = self.aborted(req, computed) if num_rejected else None
        req.tokens.extend(token_ids)
        if aborted:
            self.unregister(req, aborted, computed)
        req.num_computed = computed
        req.num_scheduled = 0
        if self.caching and computed >= (len(req.hashes) + 1) * self.block:
            self.hasher.hash_upto(req, computed // self.block)  # the computed blocks join the index now
        if computed >= req.next_event:
            ledger = self.ledger
            next_event = NEVER
            for pol, gs in req.pairs or zip(self.policies, req.groups, strict=True):
                pol.commit(req, gs, ledger)
                next_event = min(next_event, pol.next_event(req, gs, ledger))
            req.next_event = next_event
            events = self.index.events
            if events is not None:
                events.flush(req)
        t = req.tables
        if t is not None:
            t.num_computed, t.num_new = computed, 0

    def drop(self, req: Request) -> None:
        """``req`` is freed: its scheduled tokens will not be computed (raises as ``aborted``)."""
        if req.num_scheduled:
            aborted = self.aborted(req, req.num_computed)
            if aborted:
                self.unregister(req, aborted, req.num_computed)

    def aborted(self, req: Request, computed: int) -> list[tuple[int, int]]:
        """Pages ``req`` registered at allocate that will not be written (its tokens from
        ``computed`` on are not committed).  Raises, changing nothing, when another live
        request already holds one: it was looked up after ``req``'s allocate, so it would
        read a page nobody fills (free or reject before admitting others in a step)."""
        ledger = self.ledger
        out = []
        for pol, gs in req.pairs or ():
            for page in pol.unfilled(req, gs, computed, ledger):
                if ledger.ref[pol.gi][page] > 1:
                    raise InvalidArgumentError(
                        f"request {req.request_id!r}: its tokens from {computed} on are dropped, but page "
                        f"{pol.gi}:{page} they fill is already shared by a request looked up after its "
                        "allocate; free or reject tokens before admitting other requests in a step")
                out.append((pol.gi, page))
        return out

    def unregister(self, req: Request, pages: list[tuple[int, int]], computed: int) -> None:
        """Unregister ``aborted``'s pages: no later lookup finds a page never written."""
        for g, page in pages:
            self.ledger.unregister(g, page)
        for pol, gs in req.pairs or ():
            pol.rewind(req, gs, computed)
