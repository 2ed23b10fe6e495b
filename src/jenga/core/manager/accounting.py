"""``ByteAccounting``: what a manager's held pages are worth, for ``jenga.core.manager.stats``.

Per live request: held, needed, stale and padding bytes, from each group's policy; over the
pool: bytes counted twice by per-request sums (shared pages) and duplicate prefix copies.
The manager owns one (baselines override its ``request_accounting``, which asks it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from jenga.core.flat_arrays import int64s, view
from jenga.core.manager.ledger import PageLedger
from jenga.core.policy.base import Policy
from jenga.core.request import GroupState, Request
from jenga.core.specs import ModelSpec


@dataclass(frozen=True)
class RealGroup:
    """A group of the model whose needs are measured, and where a manager keeps its tokens.

    ``policy`` says what a request needs (``record(req)``: its state for this policy); ``parts``:
    the manager's own groups holding this group's tokens, as (group index, layers of this group in
    it); empty where its needs are counted per request (state and image kinds, or a layout whose
    layers do not map).  jenga measures against itself (each group stored in itself); a baseline
    against the real model, stored in its own groups (``jenga.baselines.common``)."""
    policy: Policy
    record: Callable[[Request], GroupState]
    parts: tuple[tuple[int, int], ...] = ()


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
            n = pol.footprint.held_pages(gs)
            k = pol.footprint.stale_pages(req, gs)
            held += n * grp.page_bytes
            needed += pol.footprint.needed_bytes(req, gs)
            stale += k * grp.page_bytes
            padding += (n - k) * (grp.page_bytes - grp.useful_page_bytes)
        return held, needed, stale, padding

    def sharing(self, requests: Iterable[Request]) -> tuple[int, int]:
        """(bytes of pages counted more than once by per-request accounting: each extra
        reference of a shared page; bytes of held prefix pages whose content another held
        page has: duplicate copies).  O(pool pages + held pages)."""
        shared = sum(self._extra_refs(g) * grp.page_bytes for g, grp in enumerate(self.model.groups))
        return shared, self.duplicate_bytes(requests)

    def _extra_refs(self, g: int) -> int:
        """References of group ``g``'s pages beyond one each (a page several requests hold)."""
        return int(view(self.ledger.ref[g]).sum()) - self.ledger.alloc.used_pages(g)

    def needed(self, requests: Iterable[Request], real: list[RealGroup]) -> int:
        """Bytes the live requests' next step reads, each needed token of a page several requests
        hold counted once.  Token groups with ``parts``: a request needs its tokens
        ``[first_needed(n), n)`` (``n`` computed); in each part they lie on the request's pages
        of that group, and a page held by more than one request counts the union of the needed
        slots of its holders (``layers`` x the group's bytes per token and layer each).  So the
        total never exceeds the bytes of the held pages.  Other groups: each request's
        ``needed_bytes``, less the extra references of their pages where the group stores itself.
        O(requests x needed pages), in C but for shared pages."""
        self.ledger.settle()
        requests = list(requests)
        ref, groups = self.ledger.ref, self.model.groups
        total = 0
        for grp in real:
            pol = grp.policy
            token = pol.footprint.first_needed(0) is not None and grp.parts
            if not token:
                for req in requests:
                    total += pol.footprint.needed_bytes(req, grp.record(req))
                if grp.parts == ((pol.gi, pol.group.num_layers),) and pol.group is groups[pol.gi]:
                    total -= max(0, self._extra_refs(pol.gi)) * groups[pol.gi].page_bytes
                continue
            per_layer = pol.footprint.token_bytes // max(1, pol.group.num_layers)
            # shared pages (more than one reference): those a holder needs whole, and the needed
            # slots of those a holder needs in part (the first and last page of its range only)
            whole: dict[int, set[int]] = {gi: set() for gi, _ in grp.parts}
            spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for req in requests:
                n = req.num_computed
                a = pol.footprint.first_needed(n)
                if n <= a:
                    continue
                for gi, layers in grp.parts:
                    tpp, pages = groups[gi].tokens_per_page, req.groups[gi].token_pages()
                    i0, i1 = a // tpp, min(-(-n // tpp), len(pages))
                    if i0 >= i1:
                        continue
                    tokens, inner, many = self._shared_in_range(ref[gi], pages, i0, i1, a, n, tpp)
                    whole[gi].update(inner)
                    for i, p in many:  # shared pages: their slots go to the union below
                        lo, hi = max(a, i * tpp) - i * tpp, min(n, (i + 1) * tpp) - i * tpp
                        tokens -= hi - lo
                        if lo == 0 and hi == tpp:
                            whole[gi].add(p)
                        else:
                            spans.setdefault((gi, p), []).append((lo, hi))
                    total += tokens * layers * per_layer
            parts = dict(grp.parts)
            for gi, pages in whole.items():
                total += len(pages) * groups[gi].tokens_per_page * parts[gi] * per_layer
            for (gi, p), sp in spans.items():
                if p in whole[gi]:
                    continue  # another holder needs it whole
                sp.sort()
                covered, end = 0, 0
                for lo, hi in sp:
                    lo = max(lo, end)
                    if hi > lo:
                        covered, end = covered + hi - lo, hi
                total += covered * parts[gi] * per_layer
        return total

    @staticmethod
    def _shared_in_range(ref, pages: list, i0: int, i1: int, a: int, n: int, tpp: int) -> tuple[int, list, list]:
        """A holder's needed tokens ``[a, n)`` on its pages ``i0..i1`` (page ``i`` holds ``[i*tpp,
        (i+1)*tpp)``): (its needed tokens on held pages, less those of the first list; the shared pages
        strictly inside the range, needed whole; (index, page) of its other shared pages, the range's
        first or last, or every one when some page of the range is not held).  ``ref``: the group's
        references."""
        if None in pages[i0:i1]:
            held = [(i, p) for i, p in enumerate(pages[i0:i1], i0) if p is not None]
            tokens = sum(min(n, (i + 1) * tpp) - max(a, i * tpp) for i, _ in held)
            return tokens, [], [(i, p) for i, p in held if ref[p] > 1]
        ids = int64s(pages[i0:i1])  # every page of the range held: one gather finds the shared ones
        tokens = max(0, min(n, i1 * tpp) - a)
        js = np.flatnonzero(view(ref)[ids] > 1)
        if not len(js):
            return tokens, [], []
        last = i1 - i0 - 1
        inner = js[(js > 0) & (js < last)]  # strictly inside the range: needed whole
        edges = sorted({0, last} & {int(js[0]), int(js[-1])})
        return tokens - len(inner) * tpp, ids[inner].tolist(), [(i0 + j, pages[i0 + j]) for j in edges]

    def duplicate_bytes(self, requests: Iterable[Request]) -> int:
        dup = 0
        for req in requests:
            for pol, gs in zip(self.policies, req.groups, strict=True):
                dup += pol.footprint.duplicate_pages(req, gs, self.ledger) * pol.group.page_bytes
        return dup
