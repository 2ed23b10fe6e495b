"""Aborted fills: pages registered at allocate (findable from then on, so requests of the
same step share them) whose step did not run for their request.

A request freed, or rejecting tokens, after ``allocate`` and before ``append_tokens``
committed them leaves pages that nobody writes; they leave the prefix index so no later
lookup serves them.  A request that already holds such a page (looked up after the
allocate, in the same step) would read it unwritten: that order is refused, before any
change.  Schedulers preempt in the running pass, before admitting (vLLM's, jenga's).
Two functions the manager calls with its ledger.
"""

from __future__ import annotations

from jenga.core.manager.ledger import PageLedger
from jenga.core.request import Request
from jenga.errors import InvalidArgumentError


def aborted_fill(req: Request, computed: int, ledger: PageLedger) -> list[tuple[int, int]]:
    """Pages ``req`` registered at allocate that will not be written (its tokens from
    ``computed`` on are not committed).  Raises, changing nothing, when another live
    request already holds one: it was looked up after ``req``'s allocate, so it would
    read a page nobody fills (free or reject before admitting others in a step)."""
    out = []
    for pol, gs in req.pairs or ():
        for page in pol.unfilled(req, gs, computed, ledger):
            ledger.settle()  # a pending hit may hold the page
            if ledger.ref[pol.gi][page] > 1:
                raise InvalidArgumentError(
                    f"request {req.request_id!r}: its tokens from {computed} on are dropped, but page "
                    f"{pol.gi}:{page} they fill is already shared by a request looked up after its "
                    "allocate; free or reject tokens before admitting other requests in a step")
            out.append((pol.gi, page))
    return out


def abort_fill(req: Request, pages: list[tuple[int, int]], computed: int, ledger: PageLedger) -> None:
    """Unregister ``aborted_fill``'s pages: no later lookup finds a page never written."""
    for g, page in pages:
        ledger.unregister(g, page)
    for pol, gs in req.pairs or ():
        pol.rewind(req, gs, computed)
