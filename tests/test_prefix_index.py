"""PrefixIndex.register_many ends in exactly the state of ``register`` one pair at a time (tables,
their order, use counts and their order, per-page counts), whatever the run holds; ``drop_many``
as ``drop`` one at a time; use counts survive eviction (``uses``, the longest gone first out)."""

from __future__ import annotations

import random

import pytest

from jenga.core.prefix.index import PrefixIndex


def _state(ix: PrefixIndex):
    return (list(ix.table[0].items()), list(ix.key_of[0].items()), list(ix.counts(0).items()),
            list(ix.uses[0].items()), list(ix.page_uses[0]), bytes(ix.flags[0]), ix.keys[0].tolist())


def _fresh(kept: int) -> PrefixIndex:
    ix = PrefixIndex(1)
    ix.USES_KEPT = kept
    ix.track_uses([200])
    ix.track_pages([200])
    return ix


@pytest.mark.parametrize("seed", range(60))
def test_register_many_equals_one_at_a_time(seed):
    rng = random.Random(seed)
    kept = rng.choice([8, 30, 1 << 20])  # small caps make the oldest uses go mid-run
    bulk, single = _fresh(kept), _fresh(kept)
    keys = [bytes([k]) * 16 for k in range(60)]
    free = list(range(200))
    rng.shuffle(free)
    for _ in range(12):
        n = rng.randrange(1, 24)
        run_keys = [rng.choice(keys) for _ in range(n)]  # repeats and registered keys: the slow path
        if rng.random() < 0.5:  # distinct keys never seen: the fast path
            run_keys = [rng.randbytes(16) for _ in range(n)]
        elif rng.random() < 0.5:  # distinct keys counted before, some maybe registered
            run_keys = rng.sample(keys, n)
        elif rng.random() < 0.7:  # distinct keys not registered, some counted before: bulk, uses moved
            gone = [k for k in keys if k not in bulk.table[0]]
            run_keys = rng.sample(gone, min(n, len(gone))) + [rng.randbytes(16) for _ in range(n - len(gone))]
        pages = [free.pop() for _ in range(n)]
        if rng.random() < 0.2 and bulk.key_of[0]:
            pages[rng.randrange(n)] = rng.choice(list(bulk.key_of[0]))  # a registered page
        bulk.register_many(0, pages, run_keys)
        for page, key in zip(pages, run_keys, strict=True):
            single.register(0, page, key)
        assert _state(bulk) == _state(single)
        gone = rng.sample(list(bulk.key_of[0]), min(rng.randrange(1, 6), len(bulk.key_of[0])))  # evictions
        bulk.drop_many(0, gone)
        for page in gone:
            single.drop(0, page)
        free += gone
        assert _state(bulk) == _state(single)
        bulk.check_uses(0)


@pytest.mark.parametrize("seed", range(30))
def test_count_and_uncount_of_a_long_run_equal_one_at_a_time(seed):
    """``count_use_many`` / ``uncount_use_many`` of runs past ``BULK`` (numpy) end as ``count_use`` /
    ``uncount_use`` page by page: per-page counts, never below 0, and ``uses`` untouched (it
    holds the keys no longer registered only)."""
    rng = random.Random(seed)
    n = 400
    bulk, single = PrefixIndex(1), PrefixIndex(1)
    kept = rng.choice([150, 1 << 20])  # caps only the keys gone from the index
    for ix in (bulk, single):
        ix.USES_KEPT = kept
        ix.track_uses([n])
        ix.track_pages([n])
    pages = rng.sample(range(n), 300)
    keys = [rng.randbytes(16) for _ in pages]
    for ix in (bulk, single):
        for lo in range(0, 300, 30):
            ix.register_many(0, pages[lo:lo + 30], keys[lo:lo + 30])
    assert _state(bulk) == _state(single)
    held: list[list[int]] = []
    for _ in range(12):
        if held and rng.random() < 0.4:
            run = held.pop(rng.randrange(len(held)))
            bulk.uncount_use_many(0, run)
            for page in run:
                single.uncount_use(0, page)
        else:
            run = rng.sample(pages, rng.randrange(65, 200))
            held.append(run)
            bulk.count_use_many(0, run)
            for page in run:
                single.count_use(0, page)
        assert _state(bulk) == _state(single)
    for run in held:  # every hold taken back: counts down to 0 and below
        bulk.uncount_use_many(0, run)
        for page in run:
            single.uncount_use(0, page)
        assert _state(bulk) == _state(single)
    extra = rng.sample(pages, 100)  # uncounted below zero: page count 0, not counted
    bulk.uncount_use_many(0, extra)
    for page in extra:
        single.uncount_use(0, page)
    assert _state(bulk) == _state(single)
    for _ in range(2):  # long evictions (numpy): counted keys into ``uses`` in order, trimmed to the cap
        gone = rng.sample(list(bulk.key_of[0]), 140)
        bulk.drop_many(0, gone)
        for page in gone:
            single.drop(0, page)
        assert _state(bulk) == _state(single)
        bulk.check_uses(0)


def test_use_counts_survive_eviction_and_the_longest_gone_leave_first():
    """A key's count (computed or hit) lives on its page while registered, moves to ``uses``
    when the page leaves the index, and comes back one higher when the key is computed again;
    ``uses`` keeps ``USES_KEPT`` gone keys, the longest gone first out; a count of 0 (a hold
    taken back) is not kept; ``seen`` reads both."""
    ix = _fresh(2)
    a, b, c, d = (bytes([k]) * 16 for k in range(4))
    ix.register_many(0, [0, 1, 2], [a, b, c])
    ix.count_use(0, 0)
    assert [ix.uses_of(0, p) for p in (0, 1, 2)] == [2, 1, 1] and ix.uses[0] == {}
    assert ix.seen(0, a) and not ix.seen(0, d)
    ix.drop_many(0, [2, 0])
    assert list(ix.uses[0].items()) == [(c, 1), (a, 2)] and list(ix.page_uses[0][:3]) == [0, 1, 0]
    assert ix.seen(0, a) and ix.counts(0) == {c: 1, a: 2, b: 1}
    ix.register(0, 5, a)  # computed again: one more, back on its page
    assert ix.uses_of(0, 5) == 3 and list(ix.uses[0]) == [c]
    ix.drop(0, 1)
    ix.drop(0, 5)
    assert list(ix.uses[0].items()) == [(b, 1), (a, 3)]  # c, the longest gone, went first
    assert not ix.seen(0, c)
    ix.register_many(0, list(range(10, 20)), [bytes([9, k]) * 8 for k in range(10)])  # fresh: 1 each
    ix.uncount_use(0, 10)
    ix.drop(0, 10)  # a count taken back to 0 is not remembered
    assert list(ix.uses[0]) == [b, a] and not ix.seen(0, bytes([9, 0]) * 8)
    ix.check_uses(0)
