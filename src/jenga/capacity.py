"""Closed-form capacity of a manager: the longest single request and how many short
requests fit, from the manager's own groups and page rules (decode state: sliding and
chunked groups hold their window / current chunk; a state group one state).

Cross-checked against real allocations in ``tests/test_capacity.py``.
"""

from __future__ import annotations

from jenga.core.policy.registry import FullPolicy, MambaPolicy, cdiv


def pages_for_context(mgr, length: int) -> list[int]:
    """Small pages each group of ``mgr`` holds for one request of ``length`` tokens that is
    about to compute its next token."""
    out = []
    for pol in mgr.policies:
        if isinstance(pol, FullPolicy):
            hi = length // pol.tpp  # page of the next token
            lo = pol.keep_from(length) // pol.tpp
            out.append(hi - lo + 1)
        elif isinstance(pol, MambaPolicy):
            out.append(1)
        else:
            out.append(0)  # image kinds: no images in a text-only request
    return out


def fits(mgr, pages: list[int]) -> bool:
    """Whether these small pages per group fit in the manager's large pages (and, for a
    static partition, in every group's share)."""
    need = [cdiv(p, k) for p, k in zip(pages, mgr.alloc.k, strict=True)]
    caps = getattr(mgr, "caps", None)
    if caps is not None and any(n > c for n, c in zip(need, caps, strict=True)):
        return False
    return sum(need) <= mgr.alloc.num_large


def max_context_tokens(mgr, limit: int = 1 << 40) -> int | None:
    """Longest request (tokens) whose pages fit in the manager's memory, not capped by
    the model's max length.  Returns 0 if not even one token fits, and ``None`` when the
    length is unbounded (every layer keeps only a window or chunk, e.g. Mistral-7B)."""
    def ok(length: int) -> bool:
        return fits(mgr, pages_for_context(mgr, length))

    if not ok(1):
        return 0
    if ok(limit):
        return None
    lo, hi = 1, 2
    while hi < limit and ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def max_concurrent_requests(mgr, length: int) -> int:
    """How many requests of ``length`` tokens fit at once (large pages shared between
    requests once every request's own pages are placed)."""
    per = pages_for_context(mgr, length)
    if not fits(mgr, per):
        return 0
    lo, hi = 1, 2
    while fits(mgr, [p * hi for p in per]):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mgr, [p * mid for p in per]) else (lo, mid)
    return lo
