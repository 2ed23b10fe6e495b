"""Memory accounting shared by jenga and the baseline managers.

*Needed* bytes are what live requests really read in their next step (full layers: every
computed token; sliding: the last window; chunked: the current chunk; Mamba: one state;
images: the image tokens held), a token on a page several live requests hold once (counted
from the page tables, so needed never exceeds the held pages, baselines included), and a
second copy of a prefix page another live request holds not at all (it is *duplicate* waste).
Out-of-window waste is what the held pages keep beyond that, their unfilled tails, padding
and duplicate copies.  *Allocated*
bytes are pages held by live requests plus *stranded* free slots inside large pages already
cut for a group.  Waste = allocated - needed, broken down by cause.

Prefix hits are counted at a request's first allocate; ``first_*`` are requests looked up
for the first time, ``repeat_*`` requests re-added after they were freed while running (a
preempted request recomputed), whose hits say little about the cache policy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class CacheStats:
    total_bytes: int
    used_bytes: int  # pages held by live requests
    cached_bytes: int  # evictable pages (prefix cache)
    free_bytes: int  # free large pages + free slots inside cut large pages
    needed_bytes: int  # bytes live requests' next step reads
    waste_large_page_bytes: int  # free slots inside large pages that hold used pages
    waste_partial_page_bytes: int  # unfilled tails of held pages (and lookahead room)
    waste_out_of_window_bytes: int  # held pages no live request reads any more
    waste_padding_bytes: int  # padding added to keep the LCM bounded
    prefix_hit_tokens: int
    prefix_query_tokens: int
    num_requests: int
    evicted_pages: int
    group_used_bytes: tuple[int, ...] = ()  # used_bytes split by cache group (manager.model.groups order)
    waste_duplicate_bytes: int = 0  # held copies of prefix pages another held page has
    first_hit_tokens: int = 0
    first_query_tokens: int = 0
    #: prompt tokens a hit could have covered, by why it did not (jenga.core.manager.miss_reasons)
    prefix_miss_tokens: dict[str, int] = field(default_factory=dict)
    host_total_bytes: int = 0  # the host tier (0 without one)
    host_used_bytes: int = 0  # host pages holding content
    promotions: int = 0  # pages copied host -> device (in plans taken)
    demotions: int = 0  # pages copied device -> host (in plans taken)
    bytes_promoted: int = 0
    bytes_demoted: int = 0
    host_hit_tokens: int = 0  # hit tokens whose pages were promoted from the host tier

    @property
    def stranded_bytes(self) -> int:
        """Free slots inside carved large pages that hold used pages (unusable by other groups)."""
        return self.waste_large_page_bytes

    @property
    def repeat_hit_tokens(self) -> int:
        return self.prefix_hit_tokens - self.first_hit_tokens

    @property
    def repeat_query_tokens(self) -> int:
        return self.prefix_query_tokens - self.first_query_tokens

    @property
    def allocated_bytes(self) -> int:
        return self.used_bytes + self.waste_large_page_bytes

    @property
    def waste_bytes(self) -> int:
        return (self.waste_large_page_bytes + self.waste_partial_page_bytes + self.waste_out_of_window_bytes
                + self.waste_padding_bytes + self.waste_duplicate_bytes)

    @property
    def waste_frac(self) -> float:
        a = self.allocated_bytes
        return self.waste_bytes / a if a else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_query_tokens
        return self.prefix_hit_tokens / q if q else 0.0

    @property
    def first_hit_rate(self) -> float:
        """Hit rate of first lookups only (what the cache policy earned)."""
        q = self.first_query_tokens
        return self.first_hit_tokens / q if q else 0.0

    @property
    def repeat_hit_rate(self) -> float:
        """Hit rate of lookups after a preemption."""
        q = self.repeat_query_tokens
        return self.repeat_hit_tokens / q if q else 0.0

    @property
    def stranded_frac(self) -> float:
        """Stranded free slots as a fraction of the pool."""
        return self.stranded_bytes / self.total_bytes if self.total_bytes else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(allocated_bytes=self.allocated_bytes, waste_bytes=self.waste_bytes, waste_frac=self.waste_frac,
                 prefix_hit_rate=self.prefix_hit_rate, stranded_bytes=self.stranded_bytes,
                 stranded_frac=self.stranded_frac, first_hit_rate=self.first_hit_rate,
                 repeat_hit_rate=self.repeat_hit_rate)
        return d


def collect_stats(mgr) -> CacheStats:
    """Stats of a ``KVCacheManager`` (or a baseline built on it).  O(requests x groups + held pages)."""
    alloc = mgr.alloc
    groups = mgr.model.groups
    pb = alloc.page_bytes
    n = range(len(groups))
    group_used = tuple(alloc.used_pages(g) * pb[g] for g in n)
    used = sum(group_used)
    cached = sum(len(mgr.evictor.keys[g]) * pb[g] for g in n)
    # free slots in large pages that live requests use (slots beside cached pages in a fully
    # evictable large page are reclaimable at once, so they count as free, not waste)
    carved_free = alloc.stranded_bytes()
    total = alloc.num_large * alloc.large_page_bytes
    partial = padding = 0
    for req in mgr.requests.values():
        held, need, stale, pad = mgr.request_accounting(req)
        padding += pad
        partial += max(0, held - need - stale - pad)
    _, duplicate = mgr.sharing_accounting()
    # needed: a token several live requests hold counted once (from the page tables); out of the
    # window: what the held pages keep beyond that, the tails, the padding and the copies
    needed = max(0, mgr.needed_bytes() - duplicate)
    stale_bytes = max(0, used - needed - partial - padding - duplicate)
    stats = CacheStats(total, used, cached, total - used - cached, needed, carved_free, partial, stale_bytes,
                       padding, mgr.prefix_hit_tokens, mgr.prefix_query_tokens, len(mgr.requests),
                       mgr.evictor.num_evicted_pages, group_used, duplicate, mgr.first_hit_tokens,
                       mgr.first_query_tokens, dict(mgr.hits.miss_tokens))
    host = mgr.host
    if host is not None:
        stats.host_total_bytes, stats.host_used_bytes = host.total_bytes, host.used_bytes
        stats.promotions, stats.demotions = host.promotions, host.demotions
        stats.bytes_promoted, stats.bytes_demoted = host.bytes_promoted, host.bytes_demoted
        stats.host_hit_tokens = host.hit_tokens
    return stats
