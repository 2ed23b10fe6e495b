"""The scan-resistant eviction order (``eviction="reuse"``): one-off pages first (LRU), then
pages reused at least twice, the most recently released first, so a cyclic working set larger
than the pool keeps a resident subset that hits instead of thrashing."""

from __future__ import annotations

from conftest import cached_keys, full, group, make_manager, model, serve

from jenga.prefix.reuse_evictor import PROTECTED


def cyclic_hits(eviction: str) -> list[int]:
    """4 articles of 3 tokens, one question token each, 4 rounds; the pool holds 8 pages."""
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction=eviction)
    hits = []
    for r in range(4):
        for a in range(4):
            hits.append(serve(mgr, f"a{a}q{r}", [10 * a, 10 * a + 1, 10 * a + 2, 100 + 10 * r + a], [1]))
    mgr.check_integrity()
    return hits


def test_lru_thrashes_on_a_cyclic_trace_larger_than_the_pool():
    assert cyclic_hits("lru") == [0] * 16


def test_reuse_keeps_a_resident_subset_of_the_cycle():
    # round 0: LRU among one-off pages; round 1: recomputed articles count 2 uses (the index
    # remembers evicted keys) and the newest of them goes first, so articles 0 and 3 and
    # article 1's first page stay; from round 2 on they hit
    assert cyclic_hits("reuse") == [0] * 8 + [3, 1, 0, 3, 1, 0, 3, 1]


def test_one_off_pages_go_first_oldest_first_then_reused_newest_first():
    mgr = make_manager(model(group("full", full(), 1)), 6, eviction="reuse")
    serve(mgr, "x", [1, 2], [0])  # pages 0, 1; released at time 1
    serve(mgr, "y", [3, 4], [0])  # pages 2, 3; time 2
    serve(mgr, "x2", [1, 2, 5], [0])  # hits pages 0, 1 (used twice now); its own page 4; time 3
    assert cached_keys(mgr, 0) == {0: (PROTECTED - 3, -1), 1: (PROTECTED - 3, -2), 2: (2, -1), 3: (2, -2),
                                   4: (3, -3)}
    # a 4-page request: the free page 5, then one-off pages oldest first (tail first on a tie)
    mgr.add_request("z", [7, 8, 9, 6])
    assert mgr.lookup("z") == 0
    assert mgr.allocate("z", 4).groups[0].page_ids == [5, 3, 2, 4]
    assert sorted(cached_keys(mgr, 0)) == [0, 1]  # the reused pages outlive them all
    mgr.check_integrity()
