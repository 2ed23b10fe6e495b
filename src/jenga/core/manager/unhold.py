"""Undoing holds: a rolled-back allocation's, or a lookup's hit let go before its allocate
(``PageLedger.undo_holds``).  Right after ``hold`` this is exact; a lookup's pins are undone later,
after other requests may have held and dropped the same pages, so a page whose last reference goes
gets the key of its latest release (:mod:`jenga.core.manager.released_keys`), else the key it had
when pinned."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from jenga.core.evict.lru import PrefixEvictor
from jenga.core.flat_arrays import view
from jenga.core.manager.released_keys import ReleasedKeys


def unhold(log: Iterable[tuple], refs: list, released: ReleasedKeys, evictor: PrefixEvictor, now: int) -> None:
    """Undo ``hold`` calls (``key``: the evictor key the page had when it was held).

    Right after ``hold`` (a rolled-back allocate) this is exact.  A lookup's pins are
    undone later, after other requests may have held and dropped the same pages, so
    a page whose last reference goes gets the key of its latest release, else the key
    it had when pinned; a page still referenced keeps that key for its last holder.
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
        evictor.add_run(group, ids, negs, t)

def _unhold_run(ref, released: ReleasedKeys, group: int, pages: list[int], keys: list, batches: dict,
                now_key: tuple[int, int]) -> None:
    """The per-page rule of ``unhold`` for one ``hold_run`` entry, last page first."""
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
