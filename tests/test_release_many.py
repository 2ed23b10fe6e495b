"""``LargePageAllocator.release_many`` (USED -> FREE for a run of pages, the free path without
prefix caching) leaves exactly the state of one ``release`` per page: two allocators driven
through the same seeded history, one releasing page by page, must agree after every step."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jenga.core.alloc.allocator import CACHED, LargePageAllocator, PageViews


def snapshot(a: LargePageAllocator) -> tuple:
    return (
        [bytes(s) for s in a.state], a.n_used.tobytes(), a.n_cached.tobytes(), bytes(a.in_e), list(a.group_of),
        list(a.tag_of), list(a.free_small), list(a.cached_small), list(a.hidden_free), list(a.used_small),
        list(a.owned), list(a.e_count), a.num_e, a.num_carved, a.snapshot(),
    )


@pytest.mark.parametrize("page_bytes", [[6, 2], [4, 1, 2], [3]])
def test_release_many_equals_one_release_per_page(page_bytes):
    rng = random.Random(sum(page_bytes))
    one, bulk = LargePageAllocator(PageViews.of(page_bytes, 1200)), LargePageAllocator(PageViews.of(page_bytes, 1200))
    runs: list[tuple[int, list[int]]] = []  # (group, pages still USED)
    bulk_calls = 0
    for _ in range(450):
        op = rng.random()
        g = rng.randrange(len(page_bytes))
        room = one.free_small[g] + one.num_free_large * one.small_per_large[g]
        if op < 0.45 and room:
            n = rng.randint(1, min(room, 400))
            tag = rng.randrange(6)
            got = [a.allocate_many(g, tag, n, 10**9) for a in (one, bulk)]
            assert got[0] == got[1]
            runs.append((g, list(got[0][0])))
        elif op < 0.6 and runs:  # some of a run's pages become CACHED (large pages may enter E)
            g, pages = runs[rng.randrange(len(runs))]
            cached = [p for p in pages if rng.random() < 0.3]
            for a in (one, bulk):
                a.to_cached_many(g, cached)
            pages[:] = [p for p in pages if p not in set(cached)]
        elif op < 0.65:  # cached pages are evicted (CACHED -> FREE)
            g = rng.randrange(len(page_bytes))
            cached = [p for p, s in enumerate(one.state[g]) if s == CACHED]
            for page in rng.sample(cached, min(len(cached), 40)):
                for a in (one, bulk):
                    a.evict_cached(g, page)
        elif runs:  # a run's USED pages (all, or a random part) are released
            i = rng.randrange(len(runs))
            g, pages = runs[i]
            out = pages if rng.random() < 0.7 else [p for p in pages if rng.random() < 0.7]
            if rng.random() < 0.3:
                rng.shuffle(out)  # in any order
            for page in out:
                one.release(g, page)
            bulk.release_many(g, list(out) if rng.random() < 0.5 else np.asarray(out))
            bulk_calls += len(out) > 64
            gone = set(out)
            pages[:] = [p for p in pages if p not in gone]
            if not pages:
                runs.pop(i)
        assert snapshot(one) == snapshot(bulk)
        one.check_integrity()
        bulk.check_integrity()
    assert bulk_calls >= 5  # the numpy path ran, not only the short loop
