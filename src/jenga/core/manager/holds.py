"""Undoing holds: a rolled-back allocation's, or a lookup's hit let go before its allocate
(``PageLedger.unhold``), and the keys that undo gives back.

Right after ``hold`` an undo is exact.  A lookup's holds are undone later, after other requests
may have held and dropped the same pages, so a page whose last reference goes gets the key of
its latest release by another holder (``ReleasedKeys``: per group, flat arrays instead of a dict
of ``(group, page)`` tuples, so a free of a shared run records its keys in one numpy pass), else
the key it had when held."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from jenga.core.alloc.allocator import LargePageAllocator
from jenga.core.flat_arrays import view, zeros

Key = tuple[int, int]  # (release time, -prefix length)


class ReleasedKeys:
    """Per group and page: the key of the latest release by another holder, or none (module doc)."""

    __slots__ = ("t", "n", "on", "count")

    def __init__(self, sizes: list[int]):
        self.t = [zeros(s) for s in sizes]
        self.n = [zeros(s) for s in sizes]
        self.on = [bytearray(s) for s in sizes]
        self.count = 0  # pages with a recorded key

    def __bool__(self) -> bool:
        return self.count > 0

    def get(self, group: int, page: int) -> Key | None:
        return (self.t[group][page], self.n[group][page]) if self.on[group][page] else None

    def put(self, group: int, page: int, key: Key) -> None:
        """Record ``key`` (replacing an older one)."""
        on = self.on[group]
        if not on[page]:
            on[page] = 1
            self.count += 1
        self.t[group][page], self.n[group][page] = key

    def put_default(self, group: int, page: int, key: Key) -> None:
        """Record ``key`` unless one is recorded (a recorded key is newer)."""
        if not self.on[group][page]:
            self.put(group, page, key)

    def pop(self, group: int, page: int) -> Key | None:
        """The recorded key (forgotten now), or None."""
        on = self.on[group]
        if not on[page]:
            return None
        on[page] = 0
        self.count -= 1
        return self.t[group][page], self.n[group][page]

    def forget_many(self, group: int, pages: np.ndarray) -> None:
        """Forget the keys recorded for distinct ``pages``."""
        if self.count:
            on = view(self.on[group])
            self.count -= int(np.count_nonzero(on[pages]))
            on[pages] = 0

    def update_many(self, group: int, pages: np.ndarray, held: np.ndarray, t: int, negs: np.ndarray) -> None:
        """After distinct ``pages`` were dropped: ``put`` ``(t, negs[i])`` where ``held[i]`` (others
        still hold the page), forget the key of the rest (their last reference went)."""
        on = view(self.on[group])
        keep = held.view(np.uint8)
        self.count += int(np.count_nonzero(keep)) - int(np.count_nonzero(on[pages]))
        on[pages] = keep
        mine = pages[held]
        view(self.t[group])[mine] = t
        view(self.n[group])[mine] = negs[held]


def unhold_log(log: Iterable[tuple], refs: list, released: ReleasedKeys, alloc: LargePageAllocator, now: int) -> None:
    """Undo ``hold`` calls (``key``: the evictor key the page had when it was held).

    Right after ``hold`` (a rolled-back allocate) this is exact.  A lookup's holds are
    undone later, after other requests may have held and dropped the same pages, so
    a page whose last reference goes gets the key of its latest release, else the key
    it had when held; a page still referenced keeps that key for its last holder.
    """
    batches: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (group, t) -> pages, -prefix lengths
    now_key = (now, 0)
    for group, page, key in reversed(list(log)):
        ref = refs[group]
        if type(page) is list:  # a run from hold_run: (group, pages, keys)
            _unhold_run(ref, released, group, page, key, batches, now_key)
            continue
        ref[page] -= 1
        if ref[page] > 0:
            if key is not None:
                released.put_default(group, page, key)  # a recorded key is newer
            continue
        key = released.pop(group, page) or key or now_key
        ids, negs = batches.setdefault((group, key[0]), ([], []))  # key is (t, -prefix_len)
        ids.append(page)
        negs.append(key[1])
    for (group, t), (ids, negs) in batches.items():
        alloc.cache_run(group, ids, negs, t)

def _unhold_run(ref, released: ReleasedKeys, group: int, pages: list[int], keys: list, batches: dict,
                now_key: tuple[int, int]) -> None:
    """The per-page rule of ``unhold_log`` for one ``hold_run`` entry, last page first."""
    if type(keys) is tuple:  # a long run's keys (``hold_run``)
        _unhold_long(ref, released, group, pages, keys, batches, now_key)
        return
    last_t, batch_ids, batch_negs = None, None, None
    for i in range(len(pages) - 1, -1, -1):
        page, key = pages[i], keys[i]
        r = ref[page] = ref[page] - 1
        if r > 0:
            if key is not None:
                released.put_default(group, page, key)
            continue
        if released:
            key = released.pop(group, page) or key
        key = key or now_key
        t = key[0]
        if t != last_t:
            batch_ids, batch_negs = batches.setdefault((group, t), ([], []))
            last_t = t
        batch_ids.append(page)
        batch_negs.append(key[1])

def _unhold_long(ref, rel: ReleasedKeys, group: int, pages: list[int], keys: list, batches: dict,
                 now_key: tuple[int, int]) -> None:
    """``_unhold_run`` of a long run with numpy (the same keys, batches in the same order)."""
    ids = np.asarray(pages[::-1], dtype=np.int64)
    has = np.asarray(keys[0][::-1], dtype=bool)
    kt = np.where(has, np.asarray(keys[1][::-1], dtype=np.int64), now_key[0])
    kn = np.where(has, np.asarray(keys[2][::-1], dtype=np.int64), now_key[1])
    refs = view(ref)
    r = refs[ids] - 1
    refs[ids] = r
    alive = r > 0
    on, rt, rn = view(rel.on[group]), view(rel.t[group]), view(rel.n[group])
    keep = alive & has
    if keep.any():  # ``put_default``: a recorded key is newer
        fresh = keep & (on[ids] == 0)
        sel = ids[fresh]
        on[sel] = 1
        rt[sel], rn[sel] = kt[fresh], kn[fresh]
        rel.count += len(sel)
    dead = ~alive
    ids, kt, kn = ids[dead], kt[dead], kn[dead]
    if rel.count and len(ids):
        recorded = on[ids] == 1
        if recorded.any():
            sel = ids[recorded]
            kt[recorded], kn[recorded] = rt[sel], rn[sel]
            on[sel] = 0
            rel.count -= len(sel)
    if not len(ids):
        return
    times, first = np.unique(kt, return_index=True)
    for t in times[np.argsort(first)].tolist():  # batches in order of first appearance
        mine = kt == t
        batch_ids, batch_negs = batches.setdefault((group, t), ([], []))
        batch_ids.extend(ids[mine].tolist())
        batch_negs.extend(kn[mine].tolist())
