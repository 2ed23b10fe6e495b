"""PrefixIndex.register_many ends in exactly the state of ``register`` one pair at a time (tables,
their order, use counts and their order, per-page counts), whatever the run holds -- except that a
run of fresh pages with new keys (the bulk path) trims the remembered uses to ``USES_KEPT`` once,
after the run, not after each pair."""

from __future__ import annotations

import random

import pytest

from jenga.prefix.index import PrefixIndex


def _state(ix: PrefixIndex):
    return (list(ix.table[0].items()), list(ix.key_of[0].items()), list(ix.counts(0).items()),
            list(ix.page_uses[0]), bytes(ix.flags[0]))


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
        fast = n > 8 and len(set(run_keys)) == n and not any(k in single.table[0] for k in run_keys) \
            and not any(p in single.key_of[0] for p in pages)
        bulk.register_many(0, pages, run_keys)
        single.USES_KEPT = 1 << 30 if fast else kept
        for page, key in zip(pages, run_keys, strict=True):
            single.register(0, page, key)
        single.USES_KEPT = kept
        while fast and len(single.uses[0]) > kept:
            single._drop_oldest_use(0)
        assert _state(bulk) == _state(single)
        for page in rng.sample(list(bulk.key_of[0]), min(3, len(bulk.key_of[0]))):  # evictions
            bulk.drop(0, page)
            single.drop(0, page)
            free.append(page)
        assert _state(bulk) == _state(single)


@pytest.mark.parametrize("seed", range(30))
def test_count_and_uncount_of_a_long_run_equal_one_at_a_time(seed):
    """``count_uses`` / ``uncount_uses`` of runs past ``BULK`` (numpy) end as ``count_use`` /
    ``uncount_use`` page by page: counts, their keys' order, uncounted keys entering in order,
    counts taken to 0 leaving ``uses``."""
    rng = random.Random(seed)
    n = 400
    bulk, single = PrefixIndex(1), PrefixIndex(1)
    kept = rng.choice([150, 1 << 20])  # a small cap leaves registered pages uncounted
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
            bulk.uncount_uses(0, run)
            for page in run:
                single.uncount_use(0, page)
        else:
            run = rng.sample(pages, rng.randrange(65, 200))
            held.append(run)
            bulk.count_uses(0, run)
            for page in run:
                single.count_use(0, page)
        assert _state(bulk) == _state(single)
    for run in held:  # every hold taken back: counts down to 0 and below, keys popped
        bulk.uncount_uses(0, run)
        for page in run:
            single.uncount_use(0, page)
        assert _state(bulk) == _state(single)
    extra = rng.sample(pages, 100)  # uncounted below zero: popped, page count 0
    bulk.uncount_uses(0, extra)
    for page in extra:
        single.uncount_use(0, page)
    assert _state(bulk) == _state(single)
