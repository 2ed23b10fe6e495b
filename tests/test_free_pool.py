"""FreePool hands out the same ids in the same order as one heap of every free large page."""

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from jenga.core.alloc.allocator import FreePool


def test_take_and_pop_lowest_first_across_heap_and_range():
    pool = FreePool(10)
    assert pool.take(4) == [0, 1, 2, 3] and len(pool) == 6
    pool.push(2)
    pool.push(0)
    pool.push(3)  # next to the range [4, 10): the range grows down to 3
    assert (pool.lo, sorted(pool.runs)) == (3, [(0, 1), (2, 3)])
    assert pool.pop() == 0
    assert pool.take(3) == [2, 3, 4]
    pool.push_many([0, 1])
    assert sorted(pool) == [0, 1, 5, 6, 7, 8, 9]
    assert pool.take(7) == [0, 1, 5, 6, 7, 8, 9] and len(pool) == 0
    pool.push(7)
    assert list(pool) == [7] and pool.pop() == 7
    pool.push_many([4, 2, 3, 9])  # consecutive ids: one run
    assert sorted(pool.runs) == [(2, 5), (9, 10)] and len(pool) == 4
    assert pool.take(2) == [2, 3] and sorted(pool.runs) == [(4, 5), (9, 10)]
    pool.clear()
    assert len(pool) == 0 and list(pool) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.lists(st.tuples(st.sampled_from("ptPm"), st.integers(0, 1000)), max_size=60))
def test_same_order_as_one_heap(n, ops):
    pool, ref = FreePool(n), list(range(n))
    taken: list[int] = []
    for op, x in ops:
        if op in "pt" and ref:
            m = 1 if op == "p" else 1 + x % len(ref)
            got = [pool.pop()] if op == "p" else pool.take(m)
            want = [heapq.heappop(ref) for _ in range(m)]
            assert got == want
            taken += got
        elif op in "Pm" and taken:
            back = sorted(set(taken[x % len(taken):]))[: 1 if op == "P" else None]
            taken = [t for t in taken if t not in back]
            if op == "P":
                pool.push(back[0])
            else:
                pool.push_many(back)
            for b in back:
                heapq.heappush(ref, b)
        assert len(pool) == len(ref) and sorted(pool) == sorted(ref)
