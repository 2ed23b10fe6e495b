"""``PrefixEvictor``, the base of every evictor: the keys of CACHED pages and one global order by
``(last access, -prefix length)`` (``eviction="lru"``, the paper's), and ``ReuseEvictor``, the default, which
orders by use count on top of it (below).

*Balanced*: all groups of a request get the request's access time when it frees them.
*Aligned*: a page's prefix length is the token position of its end, the same in every
group, so on equal times the same tokens leave every group (the tail first).  A large
page's key is the largest key of its cached pages: it is evicted whole only when every
page in it is older than what other large pages hold.

Keys live in flat per-group arrays (``key_t``, ``key_n``; a page has a key while it is
CACHED); the orders are :class:`~jenga.core.evict.run_heap.RunHeap` s, one entry per run of
pages released together, so a free or a bulk eviction costs per run, not per page.

*The default order: reuse classes* (``ReuseEvictor``).  A scan-resistant evictor: pages whose
content proved reusable outlive one-off pages, and among those a stable subset stays resident
when the reused set is larger than the pool.  Plain LRU (``PrefixEvictor``) thrashes on a cyclic
working set bigger than the pool: every page is evicted just before its next use.  Here each block
hash has a *use count* (computed or hit; kept by :class:`~jenga.core.prefix.index.PrefixIndex`
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

from collections.abc import Iterator, Mapping
from functools import partial

import numpy as np

from jenga.core.alloc.page_states import CACHED, EvictionSource, PageViews
from jenga.core.evict.fresh_run import FreshRun, push_back
from jenga.core.evict.large import LargeEviction
from jenga.core.evict.listener import EvictionListener
from jenga.core.evict.run_heap import SMALL, RunHeap
from jenga.core.flat_arrays import BULK, as_ids, largest_keys, unique_counts, view, zeros
from jenga.core.policy.base import held_window_time
from jenga.core.prefix.index import PrefixIndex

Key = tuple[int, int]  # (last_access, -prefix_length)


class CachedKeys(Mapping):
    """A group's evictor keys as a read-only mapping page -> ``(t, -prefix length)`` (CACHED pages)."""

    __slots__ = ("_state", "_t", "_n", "_counts", "_g")

    def __init__(self, state: bytearray, t, n, counts: list[int], g: int):
        self._state, self._t, self._n, self._counts, self._g = state, t, n, counts, g

    def __contains__(self, page) -> bool:
        return type(page) is int and 0 <= page < len(self._state) and self._state[page] == CACHED

    def __getitem__(self, page) -> Key:
        if page not in self:
            raise KeyError(page)
        return self._t[page], self._n[page]

    def __len__(self) -> int:
        return self._counts[self._g]

    def __iter__(self):
        return iter(np.flatnonzero(view(self._state) == CACHED).tolist())


class _CachedWithKey:
    """An element of a group's small-page order is valid while its page is CACHED with that key."""

    __slots__ = ("state", "t", "n")

    def __init__(self, state: bytearray, t, n):
        self.state, self.t, self.n = state, t, n

    def one(self, page: int, t: int, n: int, _) -> bool:
        return self.state[page] == CACHED and self.t[page] == t and self.n[page] == n

    def many(self, pages: np.ndarray, ts: np.ndarray, ns: np.ndarray, _) -> np.ndarray:
        return (view(self.state)[pages] == CACHED) & (view(self.t)[pages] == ts) & (view(self.n)[pages] == ns)


class PrefixEvictor(EvictionSource):
    """Holds the key of every CACHED page; evicts small pages per group and whole large pages."""

    #: whether this order reads the index's use counts (the manager then has the index keep them)
    counts_uses = False
    #: the options this order takes, a frozen dataclass handed to its constructor after ``listener``
    #: (``KVCacheManager(eviction_options=...)``); None: it takes none
    options_class = None

    def __init__(self, pages: PageViews, index: PrefixIndex, listener: EvictionListener | None = None):
        """Built on the pool's ``pages`` (read in place, never written) before the allocator, which
        is handed this evictor; the manager sizes the index's page arrays (``track_pages``, and
        ``track_uses`` where ``counts_uses``).  ``listener`` (a host tier) is told of each eviction
        first."""
        self.pages = pages
        self.index = index
        self.listener = listener
        a = pages
        n = len(a.small_per_large)
        self.key_t = [zeros(a.num_large * k) for k in a.small_per_large]  # per page: key (t, n) while CACHED
        self.key_n = [zeros(a.num_large * k) for k in a.small_per_large]
        self.num_keys = [0] * n  # per group: CACHED pages
        self.keys = [CachedKeys(self.pages.state[g], self.key_t[g], self.key_n[g], self.num_keys, g) for g in range(n)]
        # a group of one small page per large page never evicts small pages: a cached page's
        # large page has no used page, so it is always in E (``evict_small`` finds nothing)
        self._small_order = [k > 1 for k in a.small_per_large]
        self._heaps = []
        for g in range(n):
            valid = _CachedWithKey(self.pages.state[g], self.key_t[g], self.key_n[g])
            self._heaps.append(RunHeap(valid.one, valid.many, reads="tni"))
        # per group: the order of fully evictable large pages, and evicting many at once
        self.large = LargeEviction(pages, index)
        self.num_evicted_pages = 0

    # ------------------------------------------------------------ keys
    def key_run(self, group: int, ids, negs, last_access: int) -> tuple:
        """Key the distinct registered USED ``ids`` whose last holder left at ``last_access``
        (``-prefix length`` in ``negs``; sequences): ``LargePageAllocator.cache_run`` makes them
        CACHED next, then calls ``keyed``.  ``(ids, larges, counts)``: the ids (an int array for a
        long run) and, where known, their distinct large pages ascending and how many each has."""
        ids = self._set_keys(group, ids, negs, last_access)
        self.num_keys[group] += len(ids)
        fresh = self._fresh
        if fresh is not None and fresh.larges is not None:  # its large pages counted once, for both
            return ids, fresh.larges, fresh.counts
        return ids, None, None

    def keyed(self) -> None:
        """The run ``key_run`` keyed is CACHED now (its large pages entered their orders)."""
        self._fresh = None

    def release_stamps(self, group: int, pages) -> list[int]:
        """The time each CACHED page of ``pages`` was released at (its key's time)."""
        kt = self.key_t[group]
        return [kt[page] for page in pages]

    def retime_run(self, group: int, ids, negs, last_access: int) -> None:
        """``unkey_many`` then ``key_run`` for distinct CACHED ``ids``, in place: the same keys
        and orders without moving the pages through USED (their large pages stay in E and
        re-enter its order with their new largest key; old heap entries go stale)."""
        self.forget_many(group, ids)  # the old keys' hooks (class-3 flags)
        ids = self._set_keys(group, ids, negs, last_access)
        k = self.pages.small_per_large[group]
        if k == 1:  # a cached page is its own large page, in E
            self._push_larges(group, ids)
            self._fresh = None
            return
        fresh = self._fresh
        if fresh is not None and fresh.larges is not None:
            larges = fresh.larges[view(self.pages.in_e)[fresh.larges] == 1]
            if len(larges):
                self._push_larges(group, larges)
        else:
            larges = sorted({page // k for page in (ids.tolist() if type(ids) is np.ndarray else ids)})
            in_e = self.pages.in_e
            self._push_larges(group, [large for large in larges if in_e[large]])
        self._fresh = None

    def _set_keys(self, group: int, ids, negs, last_access: int):
        """Write the keys of ``ids`` released now at ``last_access`` (``-prefix length`` in ``negs``)
        and push them on the group's small-page order; ``ids`` back (numpy for a long run)."""
        bulk = len(ids) > BULK
        if bulk:
            ids, negs = as_ids(ids), as_ids(negs)
        elif type(ids) is np.ndarray:  # a few pages left of a long run: Python ints for the loops
            ids, negs = ids.tolist(), np.asarray(negs).tolist()
        if self._plain:  # a window kept for a held prefix (``UNTIL_FREE + now``): LRU reads ``now``
            prios = held_window_time(last_access)[0]
        else:
            prios = self.priorities_of(group, ids, last_access, negs)
        if bulk:
            view(self.key_t[group])[ids] = prios
            view(self.key_n[group])[ids] = negs
            if type(prios) is int:  # one key time for the run: ``_push_larges`` reads the keys from here
                self._fresh = FreshRun(group, prios, ids, negs, self.pages.small_per_large[group])
            if self._small_order[group]:
                # a run's pages come first to last: the order wants last first (contiguous copies,
                # the ids once for both columns; one priority for all needs no reversal)
                back = ids[::-1].copy()
                if type(prios) is int:
                    push_back(self._heaps[group], prios, negs, self._fresh.falling, back, back)
                else:
                    self._heaps[group].push(prios[::-1].copy(), negs[::-1].copy(), back, back)
        else:
            kt, kn = self.key_t[group], self.key_n[group]
            ts = [prios] * len(ids) if type(prios) is int else prios
            for page, t, neg in zip(ids, ts, negs, strict=True):
                kt[page] = t
                kn[page] = neg
            if self._small_order[group]:
                self._heaps[group].push(ts, negs, ids, ids)
        return ids

    #: the long run whose keys were just written with one time (``_set_keys``), while it is
    #: cached or re-keyed; else None
    _fresh: FreshRun | None = None

    # ------------------------------------------------ eviction order hooks
    #: True when ``priority`` is the release time itself (plain LRU: the fast path)
    _plain = True

    def priorities_of(self, group: int, ids, last_access: int, negs=None):
        """The first part of each page's key (smaller goes first): a list, or one int for all;
        ``negs``: the pages' ``-prefix length`` (a sequence as long as ``ids``).  Only called when
        ``_plain`` is False (here it is the release time)."""
        return last_access

    def release_time(self, group: int, page: int, key: Key) -> int:
        """The release time behind a key (``unkey`` hands it back for an undo)."""
        return key[0]

    def release_keys(self, group: int, pages: list[int], keys: list[Key]) -> list[Key]:
        """``(release_time, -prefix length)`` of each of ``pages`` (``keys``: their keys)."""
        return keys

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        """The CACHED pages among ``pages`` whose key would change if they were held and
        given back now (their use counts changed); none here: the key is the release time."""
        return []

    def forget_many(self, group: int, pages) -> None:
        """The pages' keys are forgotten (evicted, or about to be re-keyed)."""

    def unkey(self, group: int, page: int) -> Key:
        """A page that was CACHED is hit (``LargePageAllocator.hit`` made it USED): its key leaves.
        Returns its (release time, -prefix length) (to undo with ``cache_run``)."""
        key = self.key_t[group][page], self.key_n[group][page]
        self.num_keys[group] -= 1
        return self.release_time(group, page, key), key[1]

    def unkey_many(self, group: int, pages: list[int]) -> list[Key]:
        """``unkey`` for distinct ``pages``; their (release time, -prefix length)."""
        if len(pages) > BULK:
            ids = as_ids(pages)
            out = list(zip(view(self.key_t[group])[ids].tolist(), view(self.key_n[group])[ids].tolist(), strict=True))
        else:
            kt, kn = self.key_t[group], self.key_n[group]
            out = [(kt[p], kn[p]) for p in pages]
        self.num_keys[group] -= len(pages)
        return self.release_keys(group, pages, out)

    def unkey_run(self, group: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``unkey_many`` for a long run: (release times, -prefix lengths) as arrays."""
        ts, ns = view(self.key_t[group])[ids], view(self.key_n[group])[ids]
        self.num_keys[group] -= len(ids)
        return self.release_times(group, ids, ts), ns

    def release_times(self, group: int, ids: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """The release times behind keys' first parts ``ts`` (``release_keys`` for arrays)."""
        return ts

    def drop_many(self, group: int, pages: list[int]) -> None:
        """Forget cached ``pages``: the host tier hears first, then their keys and index entries go
        (the allocator frees them next)."""
        if self.listener is not None:
            self.listener.evicting(self, group, pages)
        self.forget_many(group, pages)
        self.index.drop_many(group, pages)
        self.num_evicted_pages += len(pages)
        self.num_keys[group] -= len(pages)

    def check(self) -> None:
        """Recount the keyed pages (for ``check_integrity``)."""
        counted = [st.count(CACHED) for st in self.pages.state]
        assert counted == self.num_keys, f"keyed pages {self.num_keys} != cached pages {counted}"

    def protected_supply(self, groups=None) -> tuple[list[int], int] | None:
        """(per group: protected pages outside fully evictable large pages, fully evictable large
        pages holding a protected page): what an admission must leave alone while others run
        (``Admission``); ``None``: this order protects no page.  ``groups``: count only those
        groups' protected pages (default: every group's)."""
        return None

    def protected_bytes(self) -> int:
        """Bytes of protected pages."""
        return 0

    def supply_counts(self) -> tuple:
        """Everything the lengths of ``keys``, ``protected_supply`` and ``protected_bytes`` read, as
        one value: equal values, equal answers (a memo's key, ``Admission.hit_cannot_fit``)."""
        return tuple(self.num_keys)

    # -------------------------------------------------- EvictionSource hooks
    def pick_small(self, group: int) -> int | None:
        if not self._small_order[group]:
            return None
        heap, in_e, k = self._heaps[group], self.pages.in_e, self.pages.small_per_large[group]
        skipped = []
        found = None
        while heap.top() is not None:
            e = heap.pop()
            if in_e[e[2] // k]:
                skipped.append(e)  # whole-large candidates stay whole
                continue
            found = e[2]
            break
        if skipped:
            heap.push(*zip(*skipped, strict=True))
        if found is not None:
            self.drop_many(group, [found])
        return found

    def pick_large(self, group: int | None = None) -> tuple[int, int] | None:
        picked = self.large.pick_one(group)
        if picked is not None:
            self._forget_whole(picked[0], [picked[1]])
        return picked

    def pick_large_many(self, m: int, out: list[int]) -> Iterator[tuple[int, list[int] | np.ndarray]]:
        """``pick_large()`` up to ``m`` times, in its order (``LargeEviction.pick_many``)."""
        for g, larges in self.large.pick_many(m, out):
            self._forget_whole(g, larges)
            yield g, larges

    def _forget_whole(self, g: int, larges: list[int] | np.ndarray) -> None:
        """Every cached page of each of the fully evictable ``larges`` of group ``g`` (popped from
        its order; a list, or an int array) is forgotten in one call (the allocator frees them)."""
        k = self.pages.small_per_large[g]
        if type(larges) is np.ndarray:
            if k == 1:
                pages = larges
            else:  # the cached pages of each large page, in order
                block = (larges[:, None] * k + np.arange(k)).ravel()
                pages = block[view(self.pages.state[g])[block] == CACHED]
            self.drop_many(g, pages.tolist())
        else:
            if k == 1:
                pages = larges
            else:
                st = self.pages.state[g]
                pages = [p for large in larges for p in range(large * k, (large + 1) * k) if st[p] == CACHED]
            self.drop_many(g, pages)

    def on_evictable(self, large: int) -> None:
        self.on_evictable_many(self.pages.group_of[large], (large,))

    def on_evictable_many(self, group: int, larges) -> None:
        """``on_evictable`` for each of ``larges`` (all of ``group``)."""
        self._push_larges(group, larges)

    def _push_larges(self, group: int, larges) -> None:
        """Each of ``larges`` (in E) enters the group's order with the largest key of its
        cached pages (a new version: its earlier entries go stale)."""
        k = self.pages.small_per_large[group]
        if len(larges) * k <= BULK:
            ver, kt, kn = self.large.ver, self.key_t[group], self.key_n[group]
            if type(larges) is not list:
                larges = [int(x) for x in larges]
            if k == 1 and len(larges) <= SMALL:  # a page is its own large page: its key, one loop
                entries = []
                for large in larges:
                    v = ver[large] = ver[large] + 1
                    entries.append((kt[large], kn[large], large, -1 - v))
                self.large.heaps[group].push_singles(entries)
                return
            vs = []
            for large in larges:
                ver[large] += 1
                vs.append(ver[large])
            if k > 1:  # the largest keys when the order is read, of the large pages still in it
                self.large.heaps[group].push_made(partial(self._largest_valid, group, larges, vs), len(larges))
                return
            self.large.heaps[group].push([kt[p] for p in larges], [kn[p] for p in larges], larges, vs)
            return
        ids = as_ids(larges)
        ver = view(self.large.ver)
        ver[ids] += 1
        fresh = self._fresh
        if fresh is not None and fresh.group == group and k == 1 and ids is fresh.ids:
            # each page is its own large page: its key is the run's (just written)
            back = ids[::-1].copy()
            push_back(self.large.heaps[group], fresh.t, fresh.negs, fresh.falling, back, ver[back])
            return
        if fresh is not None and fresh.group == group and fresh.larges is not None:
            ts, ns = fresh.largest_keys(ids, self.pages.n_cached, self._largest)
        else:
            ts, ns = self._largest(group, ids)
        back = slice(None, None, -1)  # a run's large pages come first to last: the order wants last first
        self.large.heaps[group].push(ts[back], ns[back], ids[back], ver[ids][back])

    def _largest_valid(self, group: int, larges: list[int], vs: list[int]) -> tuple[list[int], ...]:
        """``(ts, ns, larges, vs)`` of those of ``larges`` still in E at version ``vs`` (the others
        are stale for good: versions only grow), with the largest key of their cached pages:
        the one they entered with, as a large page's keys change only through a new version."""
        ver, in_e, k = self.large.ver, self.pages.in_e, self.pages.small_per_large[group]
        kt, kn, st = self.key_t[group], self.key_n[group], self.pages.state[group]
        ts, ns, ls, gs = [], [], [], []
        for large, v in zip(larges, vs, strict=True):
            if ver[large] != v or not in_e[large]:
                continue
            t, n = max((kt[p], kn[p]) for p in range(large * k, (large + 1) * k) if st[p] == CACHED)
            ts.append(t)
            ns.append(n)
            ls.append(large)
            gs.append(v)
        return ts, ns, ls, gs

    def _largest(self, group: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The largest key of the cached pages of each of large pages ``ids`` (of ``group``)."""
        k = self.pages.small_per_large[group]
        kt, kn = view(self.key_t[group]), view(self.key_n[group])
        if k == 1:
            return kt[ids], kn[ids]
        st = view(self.pages.state[group])
        if ids[-1] - ids[0] == len(ids) - 1 and (ids[1:] > ids[:-1]).all():  # consecutive: one slice
            span = slice(int(ids[0]) * k, (int(ids[-1]) + 1) * k)
            cached = st[span].reshape(-1, k) == CACHED
            kt, kn = kt[span].reshape(-1, k), kn[span].reshape(-1, k)
        else:
            block = ids[:, None] * k + np.arange(k)
            cached, kt, kn = st[block] == CACHED, kt[block], kn[block]
        return largest_keys(cached, kt, kn)

    def on_unevictable(self, large: int) -> None:
        self.large.ver[large] += 1

    def on_unevictable_many(self, group: int, larges) -> None:
        if len(larges) > BULK:
            view(self.large.ver)[as_ids(larges)] += 1
            return
        ver = self.large.ver
        for large in larges:
            ver[large] += 1


# ---------------------------------------------------------------- the default order: reuse classes (module doc)

PROTECTED = 1 << 61  # priorities of class 3 are PROTECTED - release time


class ReuseEvictor(PrefixEvictor):
    """``PrefixEvictor`` with use-count classes (module doc)."""

    _plain = False

    counts_uses = True

    def __init__(self, pages, index, listener=None):
        super().__init__(pages, index, listener)
        # per group: each cached page's release time (its key's first part may be a class)
        self.times = [zeros(pages.num_large * k) for k in pages.small_per_large]
        self._flags = [bytearray(pages.num_large * k) for k in pages.small_per_large]  # 1: a class-3 page
        self._num_prot = [0] * len(pages.small_per_large)
        self.protected = [ProtectedPages(f, self._num_prot, g) for g, f in enumerate(self._flags)]  # class 3
        self._prot_in = zeros(pages.num_large)  # per large page: class-3 pages in it
        self._prot_out = [0] * len(pages.small_per_large)  # per group: class-3 pages outside E
        self._e_prot = [0] * len(pages.small_per_large)  # per group: large pages in E holding a class-3 page

    # class-3 pages are counted per large page, so an admission can ask what it may evict
    # without touching them (``protected_supply``) in O(groups)
    def _protect(self, group: int, pages, on: bool) -> None:
        """Flag ``pages`` (distinct) as class 3 (``on``) or not; pages already so are left."""
        if not on and not self._num_prot[group]:
            return  # nothing to clear
        flags, k, in_e, prot_in = self._flags[group], self.pages.small_per_large[group], self.pages.in_e, self._prot_in
        if len(pages) <= BULK:
            for page in pages:
                if flags[page] == on:
                    continue
                flags[page] = on
                self._num_prot[group] += 1 if on else -1
                large = page // k
                n = prot_in[large] = prot_in[large] + (1 if on else -1)
                if not in_e[large]:
                    self._prot_out[group] += 1 if on else -1
                elif n == (1 if on else 0):
                    self._e_prot[group] += 1 if on else -1
            return
        ids = as_ids(pages)
        ids = ids[view(flags)[ids] != on]
        if not len(ids):
            return
        view(flags)[ids] = on
        self._num_prot[group] += len(ids) if on else -len(ids)
        larges, counts = (ids, 1) if k == 1 else unique_counts(ids // k)
        counts = np.broadcast_to(counts, larges.shape)
        pin = view(prot_in)
        before = pin[larges]
        after = before + counts if on else before - counts
        pin[larges] = after
        e = view(in_e)[larges] == 1
        self._prot_out[group] += (1 if on else -1) * int(counts[~e].sum())
        self._e_prot[group] += int((e & (before == 0)).sum()) if on else -int((e & (after == 0)).sum())

    def record_times(self, group: int, ids, last_access: int) -> None:
        """Each page's last access (per run: one numpy store past ``BULK`` pages)."""
        if len(ids) > BULK:
            view(self.times[group])[ids] = last_access
        else:
            times = self.times[group]
            for page in ids:
                times[page] = last_access

    def priorities_of(self, group: int, ids, last_access: int, negs=None):
        self.record_times(group, ids, last_access)
        if last_access < 0:
            return last_access
        page_uses = self.index.page_uses[group]
        last_access, held_window = held_window_time(last_access)
        # a window its holder's prefix needs: last of class 3
        protected = PROTECTED if held_window else PROTECTED - last_access
        if len(ids) > BULK:
            reused = view(page_uses)[ids] >= 2
            if not reused.any():
                return last_access
            self._protect(group, ids[reused], True)  # pages being cached: their large page is not in E
            return np.where(reused, protected, last_access)
        reused = [page_uses[p] >= 2 for p in ids]
        if True not in reused:
            return last_access
        self._protect(group, [p for p, r in zip(ids, reused, strict=True) if r], True)
        return [protected if r else last_access for r in reused]

    def key_run(self, group: int, ids, negs, last_access: int) -> tuple:
        """``PrefixEvictor.key_run``; a short run (a list) in one loop: ``priorities_of``, the
        keys, the class-3 counts and, for a group of one page per large page, the large-page
        entries, which the allocator's ``on_evictable_many`` for exactly these pages pushes."""
        if type(ids) is not list or len(ids) > BULK:
            return super().key_run(group, ids, negs, last_access)
        k = self.pages.small_per_large[group]
        times, kt, kn, ver = self.times[group], self.key_t[group], self.key_n[group], self.large.ver
        t, protected, page_uses = last_access, None, self.index.page_uses[group]
        if last_access >= 0:
            t, held_window = held_window_time(last_access)
            protected = PROTECTED if held_window else PROTECTED - t
        flags, prot_in, in_e = self._flags[group], self._prot_in, self.pages.in_e
        out, reused = [], 0  # k == 1: large-page entries; else each page's key time
        for page, neg in zip(ids, negs, strict=True):
            times[page] = last_access
            prio = t
            if protected is not None and page_uses[page] >= 2:
                prio = protected
                reused += 1
                if flags[page] != 1:  # ``_protect``
                    flags[page] = 1
                    self._num_prot[group] += 1
                    large = page // k
                    n = prot_in[large] = prot_in[large] + 1
                    if not in_e[large]:
                        self._prot_out[group] += 1
                    elif n == 1:
                        self._e_prot[group] += 1
            kt[page] = prio
            kn[page] = neg
            if k == 1:
                v = ver[page] = ver[page] + 1
                out.append((prio, neg, page, -1 - v))
            else:
                out.append(prio)
        self.num_keys[group] += len(ids)
        if k > 1:
            self._heaps[group].push(out, negs, ids, ids)  # (``_small_order``)
            return ids, None, None
        self._short = (ids, out, reused)
        return ids, None, None

    def keyed(self) -> None:
        super().keyed()
        self._short = None

    #: ``(ids, large-page entries, class-3 pages)`` of the short run ``key_run`` keyed (one page
    #: per large page), until the allocator's call back (``keyed``); else None
    _short = None

    def release_time(self, group: int, page: int, key: tuple[int, int]) -> int:
        self._protect(group, (page,), False)
        return self.times[group][page]

    def release_stamps(self, group: int, pages) -> list[int]:
        """``PrefixEvictor.release_stamps`` from the release times (a key here may be a class)."""
        times = self.times[group]
        return [held_window_time(times[page])[0] for page in pages]

    def release_keys(self, group: int, pages: list[int], keys: list[tuple[int, int]]) -> list[tuple[int, int]]:
        self._protect(group, pages, False)
        if len(pages) > BULK:
            times = view(self.times[group])[as_ids(pages)].tolist()
        else:
            times = [self.times[group][p] for p in pages]
        return [(t, key[1]) for t, key in zip(times, keys, strict=True)]

    def release_times(self, group: int, ids: np.ndarray, ts: np.ndarray) -> np.ndarray:
        self._protect(group, ids, False)
        return view(self.times[group])[ids]

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        keys, page_uses = self.keys[group], self.index.page_uses[group]
        out = []
        for page in pages:
            key = keys.get(page)
            if key is None or key[0] < 0 or key[0] > PROTECTED // 2:
                continue  # held by others, aged, or protected already (use counts only grow)
            if page_uses[page] >= 2:
                out.append(page)
        return out

    def forget_many(self, group: int, pages) -> None:
        self._protect(group, pages, False)

    def on_evictable_many(self, group: int, larges) -> None:
        short = self._short
        if short is not None and larges is short[0]:  # ``key_run``'s pages, keyed and versioned
            _, entries, reused = short
            if reused:  # ``_move_protected``: each class-3 page's large page enters E
                self._prot_out[group] -= reused
                self._e_prot[group] += reused
            if len(entries) <= SMALL:
                self.large.heaps[group].push_singles(entries)
            else:  # (t, n, id, version) columns
                ts, ns, ids, gs = zip(*entries, strict=True)
                self.large.heaps[group].push(list(ts), list(ns), list(ids), [-1 - g for g in gs])
            return
        self._move_protected(group, larges, -1)
        super().on_evictable_many(group, larges)

    def on_unevictable(self, large: int) -> None:
        self.on_unevictable_many(self.pages.group_of[large], (large,))

    def on_unevictable_many(self, group: int, larges) -> None:
        self._move_protected(group, larges, 1)
        super().on_unevictable_many(group, larges)

    def _move_protected(self, group: int, larges, sign: int) -> None:
        """``larges`` left E (``sign`` 1) or entered it (-1): their class-3 pages move in or
        out of the group's count, and each holding one out of or into ``_e_prot``."""
        if not self._num_prot[group]:
            return
        if len(larges) <= BULK:
            prot_in = self._prot_in
            for large in larges:
                n = prot_in[large]
                if n:
                    self._prot_out[group] += sign * n
                    self._e_prot[group] -= sign
            return
        n = view(self._prot_in)[as_ids(larges)]
        self._prot_out[group] += sign * int(n.sum())
        self._e_prot[group] -= sign * int(np.count_nonzero(n))

    def protected_supply(self, groups=None) -> tuple[list[int], int]:
        """(per group: class-3 pages outside fully evictable large pages, fully evictable
        large pages holding a class-3 page): what ``supply()`` counts that an allocation
        must leave alone to evict no page reused at least twice.  ``groups``: only those
        groups' class-3 pages (the others count none); default every group."""
        if groups is None:
            return self._prot_out, sum(self._e_prot)
        out = [0] * len(self._prot_out)
        for g in groups:
            out[g] = self._prot_out[g]
        return out, sum(self._e_prot[g] for g in groups)

    def protected_bytes(self) -> int:
        """Bytes of class-3 pages."""
        out = 0
        for n, b in zip(self._num_prot, self.pages.page_bytes, strict=True):  # len(self.protected[g]), each g
            out += n * b
        return out

    def supply_counts(self) -> tuple:
        return tuple(self.num_keys), tuple(self._prot_out), tuple(self._e_prot), tuple(self._num_prot)

    def check(self) -> None:
        """Recount the class-3 counters (for ``check_integrity``)."""
        super().check()
        assert [f.count(1) for f in self._flags] == self._num_prot, "class-3 page counts"
        inside, out, e = {}, [0] * len(self.protected), [set() for _ in self.protected]
        for g, pages in enumerate(self.protected):
            k = self.pages.small_per_large[g]
            for page in pages:
                assert page in self.keys[g] and self.keys[g][page][0] >= PROTECTED // 2, f"{g}:{page} not class 3"
                inside[page // k] = inside.get(page // k, 0) + 1
                if self.pages.in_e[page // k]:
                    e[g].add(page // k)
                else:
                    out[g] += 1
        for g in range(len(self.index.key_of)):
            self.index.check_uses(g)
        recorded = {large: n for large, n in enumerate(self._prot_in) if n}
        e_counts = [len(larges) for larges in e]
        assert inside == recorded and out == self._prot_out and e_counts == self._e_prot, \
            f"class-3 counters {recorded, self._prot_out, self._e_prot} != {inside, out, e_counts}"


class ProtectedPages:
    """A group's class-3 pages as a read-only set (iteration, ``len``, ``in``) over its flags."""

    __slots__ = ("_flags", "_counts", "_g")

    def __init__(self, flags: bytearray, counts: list[int], g: int):
        self._flags, self._counts, self._g = flags, counts, g

    def __contains__(self, page) -> bool:
        return type(page) is int and 0 <= page < len(self._flags) and self._flags[page] == 1

    def __len__(self) -> int:
        return self._counts[self._g]

    def __iter__(self):
        return iter(np.flatnonzero(view(self._flags)).tolist())
