"""Closed-form capacity of a manager: the longest single request and how many short
requests fit, from the manager's own groups and page rules (decode state: sliding and
chunked groups hold their window / current chunk; a state group one state).  A length is
promised only when every shorter one fits too: the scheduler runs a request alone one step
at a time, down to one token a step (it shrinks a prefill chunk that does not fit), and the
step computing token ``l`` holds ``pages_for_context(l)``, which for a sliding or chunked
group is not monotone in ``l`` (``peak_pages``).  With speculative decoding every step also
holds ``lookahead`` draft slots past its tokens (never past the model's maximum length): the
step computing token ``l`` holds the pages of positions up to ``l + lookahead``.

Cross-checked against real allocations in ``tests/test_capacity.py``.
"""

from __future__ import annotations

from jenga.core.policy.registry import cdiv


def pages_for_context(mgr, length: int) -> list[int]:
    """Small pages each group of ``mgr`` holds for one request of ``length`` tokens that is
    about to compute its next token (``Footprint.context_pages``)."""
    return [pol.footprint.context_pages(length) for pol in mgr.policies]


def peak_pages(mgr, length: int, lookahead: int = 0, model_max_len: int | None = None) -> list[int]:
    """Most small pages each group holds at any step of a request computing its tokens
    ``0 .. length`` one step at a time (``pages_for_context`` of each ``l <= length``), each
    step also holding ``lookahead`` draft slots past its token, capped at ``model_max_len``
    positions (``SpecScheduler.lookahead``): steps of ``1 + lookahead`` positions over
    ``0 .. length + lookahead``.

    A group's count at ``l + P`` is at least its count at ``l`` (``P``: the page for a full or
    sliding group, ``lcm(chunk, page)`` for a chunked one), so the last ``P`` lengths hold the
    peak; within one chunk the count only grows, so a chunked group's peak is at ``length`` or
    a chunk's last token.  Summed over groups whose peaks may fall on different lengths, this
    is an upper bound on what one step holds (exact for one windowed kind; ``Footprint.peak_pages``)."""
    last = length + lookahead if model_max_len is None else min(length + lookahead, max(length, model_max_len - 1))
    return [pol.footprint.peak_pages(last, 1 + lookahead) for pol in mgr.policies]


def fits(mgr, pages: list[int]) -> bool:
    """Whether these small pages per group fit in the manager's large pages (and, for a
    static partition, in every group's share)."""
    pool = mgr.pool
    need = [cdiv(p, k) for p, k in zip(pages, pool.small_per_large, strict=True)]
    caps = pool.large_page_caps
    if caps is not None and any(n > c for n, c in zip(need, caps, strict=True)):
        return False
    return sum(need) <= pool.num_large_pages


def max_context_tokens(mgr, limit: int = 1 << 40, lookahead: int = 0, model_max_len: int | None = None) -> int | None:
    """Longest request (tokens) whose pages fit in the manager's memory, not capped by
    the model's max length.  Returns 0 if not even one token fits, and ``None`` when the
    length is unbounded (every layer keeps only a window or chunk, e.g. Mistral-7B).
    ``lookahead``, ``model_max_len``: the draft slots every step holds (``peak_pages``)."""
    def ok(length: int) -> bool:
        return fits(mgr, peak_pages(mgr, length, lookahead, model_max_len))

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


def max_concurrent_requests(mgr, length: int, lookahead: int = 0) -> int:
    """How many requests of ``length`` tokens fit at once (large pages shared between
    requests once every request's own pages are placed; ``lookahead``: ``peak_pages``)."""
    per = peak_pages(mgr, length, lookahead)
    if not fits(mgr, per):
        return 0
    lo, hi = 1, 2
    while fits(mgr, [p * hi for p in per]):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mgr, [p * mid for p in per]) else (lo, mid)
    return lo
