"""What a serving scheduler asks of the manager beside a request's own lifecycle:
shrinking a hit, an admission query, resetting the prefix cache, KV events, usage.

``KVCacheManager`` (and so every baseline) inherits these; they use only its public
records and the ``_plan`` / ``_rollback`` halves of ``allocate``.
"""

from __future__ import annotations

from jenga.core.prefix.events import EventLog, KVEvent
from jenga.errors import InvalidArgumentError, SequenceTooLongError


class CacheControl:
    """Mixin of :class:`jenga.core.manager.manager.KVCacheManager`."""

    def shrink_hit(self, request_id: object, num_tokens: int) -> int:
        """Keep at most ``num_tokens`` of the hit the last ``lookup`` found.

        The kept hit is the longest length ``<= num_tokens`` every group accepts (the
        same as ``lookup(request_id, max_tokens=num_tokens)``); pages past it are let go
        with the keys they had.  Returns the new hit.  Raises before the first
        ``allocate`` only; a ``num_tokens`` above the hit keeps the hit.
        """
        if num_tokens < 0:
            raise InvalidArgumentError(f"request {request_id!r}: shrink_hit to {num_tokens} tokens")
        req = self._req(request_id)
        if num_tokens >= req.hit:
            return req.hit
        return self.lookup(request_id, max_tokens=num_tokens)

    def can_allocate(self, request_id: object, num_new_tokens: int, *, num_lookahead: int = 0) -> bool:
        """Would ``allocate(request_id, num_new_tokens, num_lookahead=...)`` succeed now?

        Exact (the same count against free + evictable memory ``allocate`` makes) and
        without any effect; token ids need not be known, so an admission check asks
        ``can_allocate(rid, prompt_len + max_new_tokens - hit)`` for a whole sequence
        (sliding and chunked groups then count every page, as one allocate of that length
        would hold them).  Raises like ``allocate`` on a bad count or a length past the
        model's maximum.
        """
        req = self._req(request_id)
        if num_new_tokens < 0 or num_lookahead < 0:
            raise InvalidArgumentError(f"request {request_id!r}: negative token count "
                                       f"({num_new_tokens}, lookahead {num_lookahead})")
        end = req.start + num_new_tokens + num_lookahead
        if end > self.model.max_model_len:
            raise SequenceTooLongError(f"request {request_id!r}: {end} tokens exceed the model's max length "
                                       f"{self.model.max_model_len}")
        old, req.num_lookahead = req.num_lookahead, num_lookahead
        need, log = self._plan(req, end)
        ok = self._quota_of(req, need, end) is not None
        self._rollback(req, log)
        req.num_lookahead = old
        return ok

    def reset_prefix_cache(self) -> bool:
        """Forget every cached page (they become free) and empty the prefix index.

        Like vLLM's, it refuses while any request holds pages (their pages are shared
        through the index): returns False and changes nothing then, else True.  With KV
        events on, it records one ``AllBlocksCleared``.
        """
        if any(self.alloc.used_small):
            return False
        events, self.index.events = self.index.events, None
        try:
            ev = self.evictor
            while ev.evict_large() is not None:
                pass
            for g in range(len(self.model.groups)):
                while ev.evict_small(g) is not None:
                    pass
        finally:
            self.index.events = events
        assert not len(self.index), "reset_prefix_cache left indexed pages"
        if events is not None:
            events.cleared()
        return True

    def enable_kv_events(self) -> None:
        """Record KV events from now on (see ``jenga.core.prefix.events``); ``take_events`` returns them."""
        if self.index.events is None:
            self.index.events = EventLog()

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call, oldest first ([] when not enabled)."""
        log = self.index.events
        if log is None:
            return []
        sizes = [g.tokens_per_page if g.spec.per_token else g.spec.checkpoint_interval for g in self.model.groups]
        return log.take(sizes, self.block)

    @property
    def total_bytes(self) -> int:
        """Bytes of the large pages the budget holds."""
        return self.alloc.num_large * self.alloc.large_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes of pages live requests hold (their hits included); 0 once all are freed."""
        alloc = self.alloc
        return sum(n * b for n, b in zip(alloc.used_small, alloc.page_bytes, strict=True))

    @property
    def usage(self) -> float:
        """``used_bytes / total_bytes`` (vLLM's KV-cache usage: cached pages count as free)."""
        return self.used_bytes / self.total_bytes
