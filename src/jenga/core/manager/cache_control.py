"""What a serving scheduler asks of the manager beside a request's own lifecycle:
shrinking a hit, an admission query, a chunk's end, resetting the prefix cache, KV events, usage.

*Chunk split* (``chunk_tokens``): a scheduler proposes ``n`` new tokens for a request (what is
left of its prompt, capped by the step's budget) and asks the manager; each group's policy may
end the step earlier (``Policy.step_end``).  A state group ends a prefill step that would cross
the prompt-end checkpoint exactly on it, so the state at the prompt's last full block is the
step's work page, not a second page live beside it (vLLM's ``_mamba_block_aligned_split`` does
the same for its own manager); jenga's own state kind also ends the step of a short prompt
resuming a cached state below its junction on the junction.  Nothing changes without prefix
caching (no checkpoints) or for groups that store per-token pages.

Functions over the manager's parts; ``KVCacheManager``'s methods of the same names call them
(so every baseline has them).  ``can_allocate`` runs admission's ``plan`` / ``quota_of`` /
``unhold_plan``, the halves of ``allocate`` that change nothing when undone.
"""

from __future__ import annotations

from jenga.core.alloc.allocator import LargePageAllocator
from jenga.core.policy.base import Policy
from jenga.core.prefix.events import KVEvent
from jenga.core.prefix.index import PrefixIndex
from jenga.core.request import Request
from jenga.core.specs import ModelSpec
from jenga.core.validation import checked_int
from jenga.errors import InvalidArgumentError, SequenceTooLongError


def can_allocate(mgr, req: Request, num_new_tokens: int, num_lookahead: int, step: int | None = None,
                 reserve: bool = False) -> bool:
    """``KVCacheManager.can_allocate`` for the live record ``req``.

    Exact (the same count against free + evictable memory ``allocate`` makes) and without any
    effect; token ids need not be known, so an admission check asks ``can_allocate(rid,
    prompt_len + max_new_tokens - hit)`` for a whole sequence.  Without ``step`` sliding and
    chunked groups then count every page, as one allocate of that length would hold them; with
    ``step`` (the most tokens one step of the request computes, lookahead included) each group
    counts the most pages the steps hold at once (``Policy.peak_plan``: a window or chunk plus a
    step's tokens), so a yes means that, with nothing else changing, every step's allocate up to
    that length succeeds.  ``reserve`` (an admission: ``req`` not allocated yet): the pages the
    admitted requests still need to reach their prompt's end (their next prefill steps, planned
    alike: ``prompt_pages_pending``) count as taken, so an admission does not take what a longer
    prompt admitted before it computes next.  Raises like ``allocate`` on a bad count or a length
    past the model's maximum."""
    if num_new_tokens < 0 or num_lookahead < 0:
        raise InvalidArgumentError(f"request {req.request_id!r}: negative token count "
                                   f"({num_new_tokens}, lookahead {num_lookahead})")
    if step is not None and step < 1:
        raise InvalidArgumentError(f"request {req.request_id!r}: a step of {step} tokens")
    end = req.num_computed + req.num_scheduled + num_new_tokens + num_lookahead  # ``req.start``
    if end > mgr.model.max_model_len:
        raise SequenceTooLongError(f"request {req.request_id!r}: {end} tokens exceed the model's max length "
                                   f"{mgr.model.max_model_len}")
    if req.tables is None and mgr.host is not None and mgr.host.waits(req.request_id):
        return False  # its host hit's promotion was refused: allocate waits
    admission = mgr.admission
    old, req.num_lookahead = req.num_lookahead, num_lookahead
    if req.tables is None and admission.hit_cannot_fit(req, end, admission.admitted, step):
        req.num_lookahead = old  # surely refused: answered without planning or holding the hit (a
        return False             # scheduler asks again each step for the request at the head of its queue)
    mgr.ledger.settle()  # planning exactly counts the hit's pages as held
    need, log = admission.plan(req, end, _pairs(mgr, req), step)
    if reserve and req.tables is None:
        need = [n + p for n, p in zip(need, prompt_pages_pending(mgr, req, step), strict=True)]
    ok = admission.quota_of(req, need, end, admission.admitted) is not None
    admission.unhold_plan(req, log)
    req.num_lookahead = old
    return ok


def prompt_pages_pending(mgr, req: Request, step: int | None) -> list[int]:
    """Per group, the pages the allocated requests other than ``req`` still need to reach their
    prompt's end (each planned as ``can_allocate`` plans an admission, with ``step``; planning holds
    nothing once undone)."""
    admission = mgr.admission
    pending = [0] * len(mgr.policies)
    for other in mgr.requests.values():
        if other is req or other.tables is None or other.start >= other.prompt_len:
            continue
        need, log = admission.plan(other, other.prompt_len, _pairs(mgr, other), step)
        admission.unhold_plan(other, log)
        pending = [p + n for p, n in zip(pending, need, strict=True)]
    return pending


def _pairs(mgr, req: Request) -> list:
    """``req``'s (policy, group state) pairs: those of its first allocate, else every group's."""
    return req.pairs or list(zip(mgr.policies, req.groups, strict=True))


def chunk_tokens(policies: list[Policy], req: Request, num_new_tokens: int, caching: bool) -> int:
    """``KVCacheManager.chunk_tokens`` for the live record ``req`` (module doc)."""
    n = checked_int(num_new_tokens, "num_new_tokens", minimum=0)
    if not n or not caching:
        return n
    start = req.start
    stop = start + n
    for pol in policies:
        stop = pol.step_end(req, stop)
    return stop - start


def reset_prefix_cache(alloc: LargePageAllocator, index: PrefixIndex) -> bool:
    """``KVCacheManager.reset_prefix_cache``: every cached page becomes free, the index empties.

    Like vLLM's, it refuses while any request holds pages (their pages are shared through the
    index): returns False and changes nothing then, else True.  With KV events on, it records
    one ``AllBlocksCleared``."""
    if alloc.used_bytes():
        return False
    events, index.events = index.events, None
    try:
        while alloc.evict_large() is not None:
            pass
        for g in range(len(alloc.small_per_large)):
            while alloc.evict_small(g) is not None:
                pass
    finally:
        index.events = events
    assert not len(index), "reset_prefix_cache left indexed pages"
    if events is not None:
        events.cleared()
    return True


def take_events(index: PrefixIndex, model: ModelSpec, block: int) -> list[KVEvent]:
    """``KVCacheManager.take_events``."""
    log = index.events
    if log is None:
        return []
    sizes = [g.tokens_per_page if g.spec.per_token else g.spec.checkpoint_interval for g in model.groups]
    return log.take(sizes, block, [g.spec.kind for g in model.groups])
