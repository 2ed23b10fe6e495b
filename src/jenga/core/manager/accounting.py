"""``ByteAccounting``: what a manager's held pages are worth, for ``jenga.core.manager.stats``.

Per live request: held, needed, stale and padding bytes, from each group's policy; over the
pool: bytes counted twice by per-request sums (shared pages) and duplicate prefix copies.
A mixin of :class:`~jenga.core.manager.manager.KVCacheManager` (baselines override ``request_accounting``)."""

from __future__ import annotations

from jenga.core.policy.registry import FullPolicy
from jenga.core.request import Request


class ByteAccounting:
    """Needs ``policies``, ``ref``, ``alloc``, ``model`` and ``requests`` of the manager."""

    def request_accounting(self, req: Request) -> tuple[int, int, int, int]:
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

    def sharing_accounting(self) -> tuple[int, int]:
        """(bytes of pages counted more than once by per-request accounting: each extra
        reference of a shared page; bytes of held prefix pages whose content another held
        page has: duplicate copies).  O(pool pages + held pages)."""
        shared = 0
        for g, ref in enumerate(self.ref):
            extra = sum(ref) - self.alloc.used_small[g]
            shared += extra * self.model.groups[g].page_bytes
        return shared, self._duplicate_bytes()

    def _duplicate_bytes(self) -> int:
        dup = 0
        for req in self.requests.values():
            for pol, gs in zip(self.policies, req.groups, strict=True):
                if isinstance(pol, FullPolicy) and gs.pages:
                    dup += pol.duplicate_pages(req, gs, self) * pol.group.page_bytes
        return dup
