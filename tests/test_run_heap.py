"""RunHeap pops exactly what one heap entry per element would, and bulk eviction of whole
large pages goes in the order of one ``evict_large`` call at a time."""

from __future__ import annotations

import copy
import heapq

import numpy as np
import pytest
from conftest import full, group, make_manager, model, run, sliding, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from jenga.core.evict import run_heap
from jenga.core.evict.run_heap import RunHeap

OPS = st.lists(st.one_of(
    st.tuples(st.just("push"), st.lists(st.tuples(st.integers(0, 3), st.integers(-4, 0), st.integers(0, 15)),
                                        min_size=1, max_size=12)),
    st.tuples(st.just("stale"), st.integers(0, 15)),
    st.tuples(st.just("pop"), st.integers(1, 4)),
    st.tuples(st.just("take"), st.integers(1, 6)),
    st.tuples(st.just("compact"), st.just(0)),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_run_heap_pops_in_per_element_heap_order(ops):
    check_ops(ops)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_run_heap_of_runs_only_pops_in_per_element_heap_order(ops):
    """Every batch of two or more a sorted run (``SMALL`` = 1): the runs' own paths."""
    small, run_heap.SMALL = run_heap.SMALL, 1
    try:
        check_ops(ops)
    finally:
        run_heap.SMALL = small


def check_ops(ops):
    gen = [0] * 16  # an element is valid while its id's generation is the one it was pushed with

    def one(i, t, n, g):
        return gen[i] == g

    def many(ids, ts, ns, gs):
        return np.asarray(gen, dtype=np.int64)[ids] == gs

    heap, ref = RunHeap(one, many), []

    def ref_pop():
        while ref:
            t, n, i, g = heapq.heappop(ref)
            if gen[i] == g:
                return t, n, i
        return None

    for op, arg in ops:
        if op == "push":
            ts, ns, ids = zip(*arg, strict=True)
            gs = [gen[i] for i in ids]
            heap.push(ts, ns, ids, gs)
            for e in zip(ts, ns, ids, gs, strict=True):
                heapq.heappush(ref, e)
        elif op == "stale":
            gen[arg] += 1
        elif op == "pop":
            for _ in range(arg):
                top = heap.top()
                expect = ref_pop()
                assert top == expect
                if top is None:
                    break
                heap.pop()
                gen[top[2]] += 1  # the element's page is evicted: its other copies go stale
        elif op == "compact":  # stale singles and runs dropped in one pass: the order is unchanged
            heap.compact()
            assert heap._base == sum(gen[e[2]] == e[3] for e in ref)
        else:
            if heap.top() is None:
                assert ref_pop() is None
                continue
            bounds = [e[:3] for e in heap.heap[1:3]]
            ts, ns, ids, gs = heap.segment(min(bounds) if bounds else None)
            if not len(ids):  # the next entry is a copy of the head (the same element twice)
                assert heap.heap[0][:3] == min(bounds)
                continue
            assert ids[0] == heap.top()[2]
            ok = np.flatnonzero(many(ids, ts, ns, gs))[:arg]
            got = ids[ok].tolist()
            heap.consume(int(ok[-1]) + 1 if len(ok) == arg else len(ids))
            expect = [ref_pop()[2] for _ in got]
            assert got == expect
            for i in got:
                gen[i] += 1
    while True:  # drain both in step
        top = heap.top()
        assert top == ref_pop()
        if top is None:
            break
        heap.pop()
        gen[top[2]] += 1

@pytest.mark.parametrize("two_groups", [False, True])
@pytest.mark.parametrize("decode", [0, 5])
def test_bulk_large_eviction_keeps_the_one_at_a_time_order(two_groups, decode):
    """Pages released in runs at different times (some hit in between, so their run entries
    hold stale elements), in one group of one page per large page or with a sliding group of
    two pages per large page beside it (their orders interleave): ``evict_large_many`` frees
    the same large pages in the same order as repeated ``evict_large``, leaving the same state."""
    groups = [group("full", full(), 1)]
    if two_groups:
        groups = [group("full", full(), 2), group("swa", sliding(8), 1, first_layer=2)]
    mgr = make_manager(model(*groups), 400 if decode else 200)
    assert mgr.alloc.small_per_large == ([1, 2] if two_groups else [1])
    for rid, base in enumerate((0, 1000, 2000, 3000)):
        mgr.add_request(rid, list(range(base, base + 40)))
        mgr.lookup(rid)
        run(mgr, rid, 40, [7])
    for tok in range(decode):  # each decode step releases one window page alone (a single heap entry)
        for rid in range(4):
            run(mgr, rid, 1, [8 + tok])
    for rid in (2, 0, 3, 1):
        mgr.free(rid)
    mgr.add_request("hit", list(range(1000, 1040)) + [5])  # pins pages of request 1's runs
    assert mgr.lookup("hit") == 40
    run(mgr, "hit", 1, [9])
    mgr.free("hit")
    mgr.check_integrity()
    twin = copy.deepcopy(mgr)
    n = 120 if two_groups else 150
    bulk = mgr.alloc.evict_large_many(n)
    one = [twin.alloc.evict_large() for _ in range(n)]
    assert bulk == one
    mgr.check_integrity()
    twin.check_integrity()
    assert snapshot(mgr) == snapshot(twin)


def test_queued_pushes_wait_for_a_reader_and_made_keys_come_from_then():
    """A push is replayed by the first reader; ``push_made``'s keys are computed then, for only
    the elements the owner still finds valid, and pop in the order of eager pushes."""
    gen = [0] * 8
    heap = RunHeap(lambda i, t, n, g: gen[i] == g, lambda i, t, n, g: np.array(gen)[i] == g)
    calls = []

    def make():
        calls.append(1)
        live = [i for i in (5, 6, 7) if gen[i] == 0]
        return [1] * len(live), [-i for i in live], live, [0] * len(live)

    heap.push([2, 0], [0, 0], [1, 2], [0, 0])
    heap.push_made(make, 3)
    heap.push_singles([(1, -9, 3, -1)])
    assert heap.heap == [] and not calls  # nothing replayed yet
    gen[6] = 1  # stale before any read: its key is never computed
    out = []
    while heap.top() is not None:
        out.append(heap.pop()[:3])
    assert calls == [1]
    assert out == [(0, 0, 2), (1, -9, 3), (1, -7, 7), (1, -5, 5), (2, 0, 1)]
