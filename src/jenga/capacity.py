"""Closed-form capacity of a manager: the longest single request and how many short
requests fit, from the manager's own groups and page rules (decode state: sliding and
chunked groups hold their window / current chunk; a state group one state).

Cross-checked against real allocations in ``tests/test_capacity.py``.
"""

from __future__ import annotations

from jenga.prefix.policies import FullPolicy, MambaPolicy, cdiv


def pages_for_context(mgr, length: int) -> list[int]:
    """Small pages each group of ``mgr`` holds for one request of ``length`` tokens that is
    about to compute its next token."""
    out = []
    for pol in mgr.policies:
        if isinstance(pol, FullPolicy):
            hi = length // pol.tpp  # page of the next token
            lo = pol.first_needed(length) // pol.tpp
            out.append(hi - lo + 1)
        elif isinstance(pol, MambaPolicy):
            out.append(1)
        else:
            out.append(0)  # image kinds: no images in a text-only request
    return out


def large_pages_for(mgr, pages: list[int]) -> int:
    return sum(cdiv(p, k) for p, k in zip(pages, mgr.alloc.k, strict=True))


def max_context_tokens(mgr, limit: int = 1 << 40) -> int:
    """Longest request (tokens) whose pages fit in the manager's memory, not capped by
    the model's max length.  Returns 0 if not even one token fits."""
    n = mgr.alloc.num_large
    fits = lambda length: large_pages_for(mgr, pages_for_context(mgr, length)) <= n  # noqa: E731
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi < limit and fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_concurrent_requests(mgr, length: int) -> int:
    """How many requests of ``length`` tokens fit at once (large pages shared between
    requests once every request's own pages are placed)."""
    per = pages_for_context(mgr, length)
    n = mgr.alloc.num_large
    if large_pages_for(mgr, per) > n:
        return 0
    lo, hi = 1, 2
    while large_pages_for(mgr, [p * hi for p in per]) <= n:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if large_pages_for(mgr, [p * mid for p in per]) <= n else (lo, mid)
    return lo
