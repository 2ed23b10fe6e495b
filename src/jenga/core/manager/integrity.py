"""``check_integrity``: recount everything the manager tracks incrementally."""

from __future__ import annotations

from collections import Counter

from jenga.core.alloc.page_states import CACHED, FREE, USED
from jenga.core.flat_arrays import view


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
    totals = mgr.alloc.check_integrity()
    mgr.evictor.check()
    assert totals["free"] + totals["used"] + totals["cached"] == mgr.alloc.num_large * mgr.alloc.large_page_bytes
    for pol in mgr.policies:
        pol.check(mgr.requests.values())
    refs: Counter = Counter()
    for req in mgr.requests.values():
        dup = [k for k, c in Counter(held_pages(mgr, req, images=False)).items() if c > 1]
        assert not dup, f"request {req.request_id!r} holds pages twice: {dup[:5]}"
        refs.update(held_pages(mgr, req))
    for g, ref in enumerate(mgr.ref):
        state = mgr.alloc.page_states(g)
        keys = mgr.evictor.keys[g]
        for page, count in enumerate(ref):
            st = state[page]
            held = refs.get((g, page), 0)
            assert count == held, f"page {g}:{page}: refcount {count}, held by {held} live references"
            if st == USED:
                assert count > 0, f"page {g}:{page} USED but unreferenced"
            elif st == CACHED:
                assert page in keys, f"page {g}:{page} CACHED without an evictor key"
                assert mgr.index.is_registered(g, page), f"page {g}:{page} CACHED but not indexed"
            else:
                assert st == FREE and count == 0, f"page {g}:{page} FREE but referenced"
                assert not mgr.index.is_registered(g, page), f"page {g}:{page} FREE but still indexed"
        assert all(state[p] == CACHED for p in keys), f"group {g}: evictor keys on non-cached pages"
        assert len(mgr.index.key_of[g]) == len(mgr.index.table[g]), f"index flags of group {g} differ from its pages"
        assert not any(k is not None for k in mgr.index.keys[g][view(mgr.index.flags[g]) == 0].tolist()), \
            f"index of group {g} keeps a key of an unregistered page"
        for key, page in mgr.index.table[g].items():
            assert mgr.index.key_of[g][page] == key, f"index of group {g} inconsistent at page {page}"
            assert state[page] in (USED, CACHED), f"indexed page {g}:{page} is FREE"
