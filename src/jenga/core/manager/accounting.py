"""``ByteAccounting``: what a manager's held pages are worth, for ``jenga.core.manager.stats``.

Per live request: held, needed, stale and padding bytes, from each group's policy; over the
pool: bytes counted twice by per-request sums (shared pages) and duplicate prefix copies.
The manager owns one (baselines override its ``request_accounting``, which asks it)."""

from __future__ import annotations

from collections.abc import Iterable

from jenga.core.manager.ledger import PageLedger
from jenga.core.policy.base import Policy
from jenga.core.request import Request
from jenga.core.specs import ModelSpec


class ByteAccounting:
    """Reads the policies, the ledger's references and the model's page sizes."""

    def __init__(self, policies: list[Policy], ledger: PageLedger, model: ModelSpec):
        self.policies, self.ledger, self.model = policies, ledger, model

    def used_bytes(self) -> int:
        """Bytes of pages live requests hold (their hits included): ``KVCacheManager.used_bytes``."""
        return self.ledger.alloc.used_bytes()

    def request(self, req: Request) -> tuple[int, int, int, int]:
        """(held, needed, stale, padding) bytes of one live request (see ``jenga.core.manager.stats``)."""
        held = needed = stale = padding = 0
        for pol, gs in zip(self.policies, req.groups, strict=True):
            grp = pol.group
            n = pol.held_pages(gs)
            k = pol.stale_pages(req, gs)
            held += n * grp.page_bytes
            needed += pol.needed_bytes(req, gs)
            stale += k * grp.page_bytes
            padding += (n - k) * (grp.page_bytes - grp.useful_page_bytes)
        return held, needed, stale, padding

    def sharing(self, requests: Iterable[Request]) -> tuple[int, int]:
        """(bytes of pages counted more than once by per-request accounting: each extra
        reference of a shared page; bytes of held prefix pages whose content another held
        page has: duplicate copies).  O(pool pages + held pages)."""
        ledger = self.ledger
        shared = 0
        for g, ref in enumerate(ledger.ref):
            extra = sum(ref) - ledger.alloc.used_pages(g)
            shared += extra * self.model.groups[g].page_bytes
        return shared, self.duplicate_bytes(requests)

    def duplicate_bytes(self, requests: Iterable[Request]) -> int:
        dup = 0
        for req in requests:
            for pol, gs in zip(self.policies, req.groups, strict=True):
                dup += pol.duplicate_pages(req, gs, self.ledger) * pol.group.page_bytes
        return dup
