"""The free paths' shortcuts leave exactly the state and the eviction order of the rules they
stand for: re-timing a sliding window's kept pages in place (``PrefixEvictor.retime_run``) equals
holding and dropping them again (``hit_many`` then ``cache_run``); the numpy paths of every module
equal their element-by-element paths (``BULK`` raised everywhere so the twin never takes them)."""

from __future__ import annotations

import copy
import struct
from array import array

import numpy as np
import pytest
from conftest import full, group, make_manager, model, serve, sliding, snapshot

import jenga.core.alloc.allocator
import jenga.core.evict.evictor
import jenga.core.evict.fresh_run
import jenga.core.evict.run_heap
import jenga.core.manager.ledger
from jenga.core.evict.evictor import PrefixEvictor, ReuseEvictor
from jenga.core.evict.fresh_run import FreshRun
from jenga.core.evict.run_heap import RunHeap
from jenga.core.flat_arrays import int64s, largest_keys

P = list(range(1, 41))  # a shared prefix of 40 tokens


def swa_model(sliding_layers: int):
    """Full attention (2 layers) and a window of 8 (``sliding_layers`` layers: 2 or 1 window pages
    per large page)."""
    return model(group("full", full(), 2), group("swa", sliding(8), sliding_layers, first_layer=2))


def trace(mgr) -> list:
    """Requests sharing ``P`` (hits, use counts of 2+), one still running while others free (its
    large pages stay out of E), released windows re-timed at free; then every page evicted.
    Returns the snapshot after the frees and the eviction order."""
    serve(mgr, "a", P + [100, 101], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    mgr.add_request("live", P[:24] + [300, 301, 302])
    mgr.lookup("live")
    assert mgr.allocate("live", 27 - mgr.requests["live"].num_computed) is not None
    mgr.append_tokens("live", [5])
    serve(mgr, "b", P + [200], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    serve(mgr, "c", P[:32] + [400] * 5, list(range(20, 34)))
    mgr.check_integrity()
    return trace_order(mgr)


def trace_order(mgr) -> list:
    """The manager's snapshot, then the order in which every cached page is evicted."""
    state = snapshot(mgr)
    order = []
    alloc = mgr.alloc
    while (large := alloc.evict_large()) is not None:
        order.append(("large", large))
    for g in range(len(mgr.model.groups)):
        while (page := alloc.evict_small(g)) is not None:
            order.append((g, page))
    mgr.check_integrity()
    return [state, order]


def touch_then_add(alloc):
    """The rule ``retime_run`` stands for: hold the pages (CACHED -> USED) and drop them again."""
    def retime(evictor, group, ids, negs, last_access):
        alloc.hit_many(group, list(ids))
        alloc.cache_run(group, ids, negs, last_access)
    return retime


@pytest.mark.parametrize("eviction", ["lru", "reuse", "predict"])
@pytest.mark.parametrize("sliding_layers", [1, 2])
def test_retime_in_place_equals_hold_and_drop(monkeypatch, eviction, sliding_layers):
    fresh = make_manager(swa_model(sliding_layers), 200, window_slack=4, out_of_window_age=1000, eviction=eviction)
    assert fresh.alloc.small_per_large == [1, 2 // sliding_layers]
    twin = copy.deepcopy(fresh)
    calls = []
    orig = PrefixEvictor.retime_run
    monkeypatch.setattr(PrefixEvictor, "retime_run", lambda *a: (calls.append(len(a[2])), orig(*a))[1])
    want = trace(fresh)
    assert calls and max(calls) > 1  # the free re-timed kept window pages
    monkeypatch.setattr(PrefixEvictor, "retime_run", touch_then_add(twin._alloc))
    assert trace(twin) == want


@pytest.mark.parametrize("eviction", ["lru", "reuse", "predict"])
@pytest.mark.parametrize("sliding_layers", [1, 2])
def test_numpy_free_paths_equal_the_per_element_paths(monkeypatch, eviction, sliding_layers):
    """With ``BULK`` = 4 the frees above go through every numpy path (shared pages still held,
    unregistered tails, large pages entering E, re-timed windows); with ``BULK`` huge none."""
    fresh = make_manager(swa_model(sliding_layers), 200, window_slack=4, out_of_window_age=1000, eviction=eviction)
    twin = copy.deepcopy(fresh)
    modules = (jenga.core.manager.ledger, jenga.core.alloc.allocator, jenga.core.evict.evictor)
    for mod in modules:
        monkeypatch.setattr(mod, "BULK", 4)
    want = trace(fresh)
    for mod in modules:
        monkeypatch.setattr(mod, "BULK", 10**9)
    assert trace(twin) == want


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 9, 16])
def test_largest_key_per_large_page_is_the_lexicographic_max_of_its_cached_slots(k):
    rng = np.random.default_rng(k)
    cached = rng.random((40, k)) < 0.6
    cached[np.arange(40), rng.integers(0, k, 40)] = True  # every large page holds a cached slot
    kt, kn = rng.integers(-3, 3, (40, k)), rng.integers(-4, 0, (40, k))
    ts, ns = largest_keys(cached, kt, kn)
    want = [max((kt[r, j], kn[r, j]) for j in range(k) if cached[r, j]) for r in range(40)]
    assert list(zip(ts.tolist(), ns.tolist(), strict=True)) == want


@pytest.mark.parametrize("caching", [True, False])
def test_long_drop_with_gaps_equals_the_per_element_path(monkeypatch, caching):
    """A run with pages already let go of (``None``) inside it: the numpy path's fallback."""
    def scenario(mgr):
        serve(mgr, "a", P + [100, 101], [1, 2, 3], free=False)
        serve(mgr, "b", P + [200], [1, 2], free=False)
        gs = mgr.requests["b"].groups[0]
        for i in (3, 17, 18, len(gs.pages) - 1):  # dropped one by one before the free
            mgr.ledger.drop(0, gs.pages[i], mgr.now, (i + 1) * mgr.policies[0].tpp)
            gs.pages[i] = None
        mgr.free("b")
        mgr.free("a")
        mgr.check_integrity()
        return snapshot(mgr)

    fresh = make_manager(swa_model(2), 200, caching=caching, eviction="reuse")
    twin = copy.deepcopy(fresh)
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 4)
    want = scenario(fresh)
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 10**9)
    assert scenario(twin) == want


@pytest.mark.parametrize("eviction", ["lru", "reuse", "predict"])
def test_retime_keys_skips_missing_and_held_pages_on_both_paths(monkeypatch, eviction):
    """``retime_keys`` with keys nobody holds (gone from the index), held pages and cached ones:
    only the cached pages change, the same on the numpy and the per-element path."""
    def scenario(mgr):
        serve(mgr, "a", P + [100, 101], [1, 2, 3])
        serve(mgr, "b", P[:16] + [200], [1, 2], free=False)  # holds the first pages again
        table = mgr.index.table[1]
        keys = sorted(table, key=table.get)[:30]
        keys[2:2] = [b"gone" * 8, b"also gone" * 4]
        ends = [16 * (i + 1) for i in range(len(keys))]
        mgr.ledger.retime_keys(1, keys, ends, mgr.now + 5)
        mgr.check_integrity()
        return trace_order(mgr)

    fresh = make_manager(swa_model(2), 200, window_slack=4, out_of_window_age=1000, eviction=eviction)
    twin = copy.deepcopy(fresh)
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 4)
    want = scenario(fresh)
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 10**9)
    assert scenario(twin) == want


@pytest.mark.parametrize("xs", [[], [7], list(range(5, 300, 3)), [2**62, 0, -3, True, np.int64(9)]])
def test_int64s_equals_numpy_conversion_and_refuses_a_none(xs):
    got = int64s(xs)
    assert got.dtype == np.int64 and got.flags.writeable
    assert got.tolist() == np.asarray(xs, dtype=np.int64).tolist()
    with pytest.raises(struct.error):
        int64s(xs + [None])


def test_long_drop_of_an_unreferenced_page_fails_before_any_change(monkeypatch):
    """The bulk drop checks references only when some page stays held: a page already at zero
    references makes that check fail, with no state changed."""
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 4)
    mgr = make_manager(swa_model(2), 200, eviction="reuse")
    serve(mgr, "a", P + [100, 101], [1, 2, 3], free=False)
    pages = list(mgr.requests["a"].groups[0].pages)
    gone = pages[:6]
    mgr.ledger.drop_run(0, list(gone), 0, len(gone), mgr.now, mgr.policies[0].tpp)
    before = snapshot(mgr)
    with pytest.raises(AssertionError, match="unreferenced"):
        mgr.ledger.drop_run(0, list(pages), 0, len(pages), mgr.now, mgr.policies[0].tpp)
    assert snapshot(mgr) == before


@pytest.mark.parametrize("falling", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_fresh_run_largest_keys_are_the_lexicographic_max_of_each_large_pages_cached_slots(seed, falling):
    """``FreshRun.largest_keys``: large pages holding cached pages from before the run (their
    slots looked up) and large pages holding only the run's pages (read from the run), a subset
    of them entering E."""
    rng = np.random.default_rng(seed)
    k, n = 4, 30
    before = rng.random(n * k) < 0.4  # cached before the run, with older keys
    kt, kn = rng.integers(0, 5, n * k), rng.integers(-400, 0, n * k)
    run = np.sort(rng.choice(np.flatnonzero(~before), size=int((~before).sum()) // 2, replace=False))
    negs = -16 * (np.arange(len(run), dtype=np.int64) + 1)
    if not falling:
        negs = rng.permutation(negs)
    cached = before.copy()
    cached[run], kt[run], kn[run] = True, 9, negs
    n_cached = array("q", cached.reshape(n, k).sum(axis=1).tolist())
    fresh = FreshRun(0, 9, run, negs, k)
    assert fresh.falling == falling and fresh.larges.tolist() == sorted(set((run // k).tolist()))
    larges = fresh.larges[rng.random(len(fresh.larges)) < 0.7]
    looked_up = []

    def largest(group, ids):
        looked_up.extend(ids.tolist())
        keys = [max((kt[p], kn[p]) for p in range(x * k, x * k + k) if cached[p]) for x in ids.tolist()]
        return np.array([t for t, _ in keys]), np.array([m for _, m in keys])

    ts, ns = fresh.largest_keys(larges, n_cached, largest)
    want = [max((kt[p], kn[p]) for p in range(x * k, x * k + k) if cached[p]) for x in larges.tolist()]
    assert list(zip(ts.tolist(), ns.tolist(), strict=True)) == want
    assert set(looked_up) == {x for x in larges.tolist() if before[x * k:x * k + k].any()}


@pytest.mark.parametrize("eviction", ["lru", "reuse", "predict"])
@pytest.mark.parametrize("sliding_layers", [1, 2])
def test_fresh_run_pushes_equal_the_per_element_paths(monkeypatch, eviction, sliding_layers):
    """``BULK`` = 4 and runs of more than 2 pushed as runs: the frees' runs go through
    ``FreshRun`` and ``push_sorted``; the same state and eviction order as with neither."""
    fresh = make_manager(swa_model(sliding_layers), 200, window_slack=4, out_of_window_age=1000, eviction=eviction)
    twin = copy.deepcopy(fresh)
    modules = (jenga.core.manager.ledger, jenga.core.alloc.allocator, jenga.core.evict.evictor)
    for mod in modules:
        monkeypatch.setattr(mod, "BULK", 4)
    pushed = []
    orig = RunHeap.push_sorted
    monkeypatch.setattr(RunHeap, "push_sorted", lambda self, *a: (pushed.append(len(a[2])), orig(self, *a))[1])
    for mod in (jenga.core.evict.run_heap, jenga.core.evict.fresh_run, jenga.core.evict.evictor):
        monkeypatch.setattr(mod, "SMALL", 2)
    want = trace(fresh)
    assert pushed
    for mod in modules:
        monkeypatch.setattr(mod, "BULK", 10**9)
    assert trace(twin) == want


@pytest.mark.parametrize("sliding_layers", [1, 2])
def test_reuse_short_key_run_equals_the_general_path(monkeypatch, sliding_layers):
    """``ReuseEvictor.key_run``'s one loop for a short run (keys, class-3 counts, one-page large
    pages' entries) leaves the state and eviction order of ``priorities_of`` + ``_set_keys`` +
    the allocator's call back, with pages reused twice (class 3) among them."""
    fresh = make_manager(swa_model(sliding_layers), 200, window_slack=4, out_of_window_age=1000, eviction="reuse")
    twin = copy.deepcopy(fresh)
    protected = []
    orig = ReuseEvictor.key_run

    def counting(self, group, ids, negs, t):
        before = sum(self._num_prot)
        out = orig(self, group, ids, negs, t)
        protected.append((self.pages.small_per_large[group], type(ids) is list and sum(self._num_prot) > before))
        return out

    monkeypatch.setattr(ReuseEvictor, "key_run", counting)
    want = trace(fresh)
    assert {k for k, p in protected if p} == set(fresh.alloc.small_per_large)  # class-3 pages on every group's path
    monkeypatch.setattr(ReuseEvictor, "key_run", PrefixEvictor.key_run)
    assert trace(twin) == want
