"""A scan-resistant evictor: pages whose content proved reusable outlive one-off pages, and
among those a stable subset stays resident when the reused set is larger than the pool.

Plain LRU (:class:`~jenga.prefix.evictor.PrefixEvictor`) thrashes on a cyclic working set
bigger than the pool: every page is evicted just before its next use.  Here each block
hash has a *use count* (computed or hit; kept by :class:`~jenga.prefix.index.PrefixIndex`
beyond the page's eviction, like ARC's ghost lists).  Eviction order, first to last:

1. pages released aged (out of window or chunk: negative times), oldest first;
2. pages used once (a one-off prompt tail, or a prefix waiting for its second user), LRU:
   a new prefix keeps the time it needs for a second request to arrive;
3. pages used at least twice, most recently released first: when the reused set does not
   fit, the pages resident longest stay (they keep hitting) instead of each evicting the
   next one to be needed (in the spirit of LIRS / MRU for loops).

Within a class, ties go to the longer prefix first, as in the base evictor (aligned).
"""

from __future__ import annotations

from jenga.prefix.evictor import PrefixEvictor

PROTECTED = 1 << 61  # priorities of class 3 are PROTECTED - release time


class ReuseEvictor(PrefixEvictor):
    """``PrefixEvictor`` with use-count classes (module doc)."""

    _plain = False

    def __init__(self, allocator, index):
        super().__init__(allocator, index)
        self.times: list[dict[int, int]] = [{} for _ in allocator.k]  # page -> its release time
        index.track_uses()

    def priority(self, group: int, page: int, last_access: int) -> int:
        self.times[group][page] = last_access
        if last_access < 0 or self.index.uses_of(group, page) < 2:
            return last_access
        return PROTECTED - last_access

    def priorities(self, group: int, pages: list[tuple[int, int]], last_access: int) -> list[int]:
        times = self.times[group]
        for page, _ in pages:
            times[page] = last_access
        if last_access < 0:
            return [last_access] * len(pages)
        uses, key_of = self.index.uses[group], self.index.key_of[group]
        protected = PROTECTED - last_access
        return [protected if uses.get(key_of[page], 0) >= 2 else last_access for page, _ in pages]

    def release_time(self, group: int, page: int, key: tuple[int, int]) -> int:
        return self.times[group].pop(page)

    def release_keys(self, group: int, pages: list[int], keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        times = self.times[group]
        return [(times.pop(page), key[1]) for page, key in zip(pages, keys, strict=True)]

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        keys, uses, key_of = self.keys[group], self.index.uses[group], self.index.key_of[group]
        out = []
        for page in pages:
            key = keys.get(page)
            if key is None or key[0] < 0 or key[0] > PROTECTED // 2:
                continue  # held by others, aged, or protected already (use counts only grow)
            if uses.get(key_of[page], 0) >= 2:
                out.append(page)
        return out

    def forget(self, group: int, page: int) -> None:
        self.times[group].pop(page, None)
