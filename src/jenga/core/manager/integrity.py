"""``check_integrity``: recount everything the manager tracks incrementally.

Every page's invariants are checked at once over the flat per-page arrays (numpy); when one
fails, the same invariants are walked page by page to name the first page that breaks one."""

from __future__ import annotations

from collections import Counter
from itertools import compress

from jenga.core.alloc.page_states import CACHED, FREE, USED


def held_pages(mgr, req, *, images: bool = True) -> list[tuple[int, int]]:
    """Every (group, page) reference a live request holds (one entry per reference).

    ``images=False`` leaves out per-image pages: a request showing the same image twice
    legitimately holds that image's cached pages once per occurrence.
    """
    out = []
    for pol, gs in zip(mgr.policies, req.groups, strict=True):
        out.extend((pol.gi, p) for p in pol.footprint.references(gs, images))
    return out


def check_manager(mgr) -> None:
    """Assert: free + used + cached == total; refcounts == references held by live
    requests; a page a request holds twice, a USED page nobody holds, a CACHED page
    outside the index or the evictor, or an index entry on a FREE page all fail."""
    alloc, evictor, index, refs = mgr.alloc, mgr.evictor, mgr.index, mgr.ref  # settled once
    totals = alloc.check_integrity()
    evictor.check()
    assert totals["free"] + totals["used"] + totals["cached"] == alloc.num_large * alloc.large_page_bytes
    for pol in mgr.policies:
        pol.check(mgr.requests.values())
    held: list[list[int]] = [[] for _ in refs]  # per group: every page referenced, once per reference
    for req in mgr.requests.values():
        own: dict[int, list[int]] = {}
        for pol, gs in zip(mgr.policies, req.groups, strict=True):
            own.setdefault(pol.gi, []).extend(pol.footprint.references(gs, False))
            held[pol.gi].extend(pol.footprint.references(gs, True))
        if any(len(set(pages)) != len(pages) for pages in own.values()):
            dup = [k for k, c in Counter(held_pages(mgr, req, images=False)).items() if c > 1]
            raise AssertionError(f"request {req.request_id!r} holds pages twice: {dup[:5]}")
    for g, ref in enumerate(refs):
        state = alloc.page_states(g)
        keys, flags, table = evictor.keys[g], index.flags[g], index.table[g]
        n = len(ref)
        counts = [0] * n
        for page in held[g]:
            if 0 <= page < n:
                counts[page] += 1
        keyed = bytearray(n)
        for page in keys:
            keyed[page] = 1
        if ref.tolist() != counts or not _pages_hold(state, counts, keyed, flags):
            _check_pages(g, ref, state, counts, keys, index)
            raise AssertionError(f"group {g}: the page-by-page recount disagrees with the bulk one")
        assert not _mask(keyed) & ~_mask(state, CACHED), f"group {g}: evictor keys on non-cached pages"
        assert len(index.key_of[g]) == len(table), f"index flags of group {g} differ from its pages"
        page_keys = index.keys[g].tolist()
        unregistered = list(compress(page_keys, flags.translate(_ONLY[0])))
        assert unregistered.count(None) == len(unregistered), f"index of group {g} keeps a key of an unregistered page"
        indexed = list(table.values())
        if bytes(map(flags.__getitem__, indexed)).count(1) != len(indexed) or \
                list(map(page_keys.__getitem__, indexed)) != list(table):
            for key, page in table.items():
                assert index.key_of[g][page] == key, f"index of group {g} inconsistent at page {page}"
        at = bytes(map(state.__getitem__, indexed))
        if at.count(USED) + at.count(CACHED) != len(at):
            page = next(p for p in indexed if state[p] not in (USED, CACHED))
            raise AssertionError(f"indexed page {g}:{page} is FREE")


def _mask(flags, value: int = 1) -> int:
    """The pages (bytes) equal to ``value`` as the bits of an int: bit ``8 * i`` for page ``i``
    (so masks of the same pages combine with ``&``, ``|``, ``^`` in one C step each)."""
    return int.from_bytes(flags.translate(_ONLY[value]), "little")


#: per page state value: the translation table keeping that value as 1, every other as 0
_ONLY = {v: bytes(int(i == v) for i in range(256)) for v in (0, 1, FREE, USED, CACHED)}


def _pages_hold(state: bytes, counts: list[int], keyed: bytearray, flags: bytearray) -> bool:
    """Whether every page keeps ``_check_pages``'s invariants, given that each refcount equals its
    ``counts`` (all pages at once, on bit masks)."""
    n = len(state)
    if not n == len(counts) == len(keyed) == len(flags):
        return False
    ones = _mask(b"\x01" * n)
    held = _mask(bytes(map(bool, counts)))
    used, cached, free = _mask(state, USED), _mask(state, CACHED), _mask(state, FREE)
    registered = _mask(flags)
    bad = used & ~held  # USED but unreferenced
    bad |= cached & ~(_mask(keyed) & registered)  # CACHED without a key or not indexed
    bad |= (ones ^ (used | cached)) & ~(free & ~held & ~registered)  # FREE only, unreferenced, not indexed
    return not bad


def _check_pages(g: int, ref, state: bytes, counts: list[int], keys, index) -> None:
    """Group ``g``'s pages one by one: each refcount equals the live references (``counts``); a
    USED page is referenced, a CACHED one keyed and indexed, a FREE one neither referenced nor
    indexed.  Raises on the first page that breaks one (the bulk check found one)."""
    for page, count in enumerate(ref):
        st = state[page]
        held = int(counts[page])
        assert count == held, f"page {g}:{page}: refcount {count}, held by {held} live references"
        if st == USED:
            assert count > 0, f"page {g}:{page} USED but unreferenced"
        elif st == CACHED:
            assert page in keys, f"page {g}:{page} CACHED without an evictor key"
            assert index.is_registered(g, page), f"page {g}:{page} CACHED but not indexed"
        else:
            assert st == FREE and count == 0, f"page {g}:{page} FREE but referenced"
            assert not index.is_registered(g, page), f"page {g}:{page} FREE but still indexed"
