"""A page computed again under a key whose registered page is only CACHED takes the key over:
the cached duplicate is evicted, the live page registered (``PrefixIndex``'s doc).  Without it
a request that recomputes a prefix (its hit 0 because another group lost its pages) holds pages
the index never finds once the cached copies are evicted."""

from __future__ import annotations

import pytest
from conftest import cached_keys, evict_page, full, group, make_manager, model, page_ids, run, sliding

from jenga.core.prefix.events import BlockRemoved, BlockStored

P = list(range(10))


def hybrid():
    return model(group("full", full(), 1), group("swa", sliding(4), 1, first_layer=1))


def first_request_with_sliding_pages_evicted(**kw):
    """``a`` served and freed; its sliding pages evicted, its full pages left cached."""
    mgr = make_manager(hybrid(), 64, **kw)
    mgr.add_request("a", P + [100])
    assert mgr.lookup("a") == 0
    run(mgr, "a", 11, [1])
    a_full = page_ids(mgr, "a", 0)[:10]
    mgr.free("a")
    for page in list(cached_keys(mgr, 1)):
        evict_page(mgr, 1, page)
    assert set(a_full) <= set(cached_keys(mgr, 0))
    return mgr, a_full


def test_recomputed_full_pages_take_over_the_cached_keys_and_a_third_request_hits():
    mgr, a_full = first_request_with_sliding_pages_evicted()
    index = mgr.index
    keys = [index.key_of[0][p] for p in a_full]
    mgr.add_request("b", P + [200])
    assert mgr.lookup("b") == 0  # the sliding group has nothing: the common hit is 0
    run(mgr, "b", 11, [2])
    b_full = page_ids(mgr, "b", 0)[:10]
    assert set(b_full).isdisjoint(a_full)
    assert [index.get(0, k) for k in keys] == b_full  # b's pages registered under the keys
    assert not set(a_full) & set(cached_keys(mgr, 0))  # the cached duplicates evicted, freed
    assert not any(index.is_registered(0, p) for p in a_full)
    mgr.check_integrity()
    for page in list(cached_keys(mgr, 0)):  # whatever else is cached in the full group goes too
        evict_page(mgr, 0, page)
    mgr.add_request("c", P + [300, 301])
    assert mgr.lookup("c") == 10
    t = mgr.allocate("c", 2)
    assert t.groups[0].page_ids[:10] == b_full
    mgr.check_integrity()


@pytest.mark.parametrize("eviction", ["lru", "reuse", "predict"])
def test_take_over_keeps_use_counts_and_events(eviction):
    mgr, a_full = first_request_with_sliding_pages_evicted(eviction=eviction)
    index = mgr.index
    keys = [index.key_of[0][p] for p in a_full]
    counting = index.uses is not None
    before = index.counts(0) if counting else None
    mgr.enable_kv_events()
    mgr.add_request("b", P + [200])
    run(mgr, "b", 11, [2])
    events = [e for e in mgr.take_events() if getattr(e, "group", None) == 0]
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert removed == keys  # the cached duplicates left ...
    assert [h for h in stored if h in set(keys)] == keys  # ... and b's pages were stored under them
    last = {}
    for e in events:  # a router replaying the events ends with every key present
        for h in e.block_hashes:
            last[h] = isinstance(e, BlockStored)
    assert all(last[k] for k in keys)
    if counting:
        after = index.counts(0)
        assert [after[k] for k in keys] == [before[k] + 1 for k in keys]  # computed once more
        index.check_uses(0)
    mgr.check_integrity()


def test_a_key_held_by_a_live_page_is_not_taken_over():
    mgr = make_manager(hybrid(), 64)
    mgr.add_request("a", P + [100])
    run(mgr, "a", 11, [1])
    a_full = page_ids(mgr, "a", 0)[:10]
    mgr.add_request("b", P + [200])
    assert mgr.lookup("b") == 10  # a is live: b shares its pages
    mgr.free("b")
    mgr.add_request("d", P + [200])
    run(mgr, "d", 11, [2])  # allocated without the lookup: its own pages, the keys stay on a's
    d_full = page_ids(mgr, "d", 0)[:10]
    assert set(d_full).isdisjoint(a_full)
    assert all(mgr.index.is_registered(0, p) for p in a_full)
    assert not any(mgr.index.is_registered(0, p) for p in d_full)
    mgr.check_integrity()
