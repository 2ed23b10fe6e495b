"""The scan-resistant eviction order (``eviction="reuse"``): one-off pages first (LRU), then
pages reused at least twice, the most recently released first, so a cyclic working set larger
than the pool keeps a resident subset that hits instead of thrashing."""

from __future__ import annotations

from conftest import cached_keys, full, group, make_manager, model, serve, sliding

from jenga.core.evict.evictor import PROTECTED


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


def protected_setup():
    """8 pages; prefix [1, 2] served twice (its pages 0, 1 are reused: protected; pages 2, 3
    are one-off), then request r running on the free pages 4..7."""
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="reuse")
    serve(mgr, "x", [1, 2, 3], [0])  # pages 0, 1, 2
    serve(mgr, "x2", [1, 2, 4], [0])  # hits 0, 1; its own page 3
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.add_request("r", [20, 21, 22, 23, 24])
    assert mgr.lookup("r") == 0
    assert mgr.allocate("r", 4).groups[0].page_ids == [4, 5, 6, 7]
    mgr.append_tokens("r", [])
    return mgr


def test_admission_does_not_evict_reused_pages_while_others_run():
    mgr = protected_setup()
    mgr.add_request("z", [30, 31, 32])
    assert mgr.lookup("z") == 0
    # one page of headroom per running request (r) stays among the evictable one-off pages 2, 3
    assert not mgr.can_allocate("z", 2)
    assert mgr.allocate("z", 2) is None
    assert mgr.allocate("z", 1).groups[0].page_ids == [2]  # one-off pages, oldest first, are fine
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.check_integrity()


def test_without_headroom_admission_may_take_every_one_off_page():
    mgr = protected_setup()
    mgr.admission.margin = 0
    mgr.add_request("z", [30, 31, 32])
    assert mgr.lookup("z") == 0
    assert not mgr.can_allocate("z", 3)  # only by evicting page 0 or 1 of the reused prefix
    assert mgr.allocate("z", 3) is None
    assert mgr.allocate("z", 2).groups[0].page_ids == [2, 3]
    mgr.check_integrity()


def test_running_requests_may_still_evict_reused_pages():
    mgr = protected_setup()
    mgr.add_request("z", [30, 31])
    mgr.lookup("z")
    mgr.allocate("z", 1)  # page 2
    mgr.allocate("r", 1)  # r grows into page 3: only protected pages are left
    t = mgr.allocate("z", 1)  # z grows (not an admission): it takes the tail of the prefix
    assert t.groups[0].page_ids == [2, 1]
    assert sorted(mgr.evictor.protected[0]) == [0]
    mgr.check_integrity()


def test_a_request_alone_may_evict_reused_pages():
    mgr = protected_setup()
    mgr.free("r")  # nobody else holds pages now
    mgr.add_request("z", [30, 31, 32, 33, 34, 35, 36, 37])
    assert mgr.lookup("z") == 0
    t = mgr.allocate("z", 8)
    assert t is not None and sorted(t.groups[0].page_ids) == list(range(8))
    assert not mgr.evictor.protected[0]
    mgr.check_integrity()


def test_a_hit_on_the_reused_prefix_is_admitted():
    mgr = protected_setup()
    mgr.add_request("y", [1, 2, 9])
    assert mgr.lookup("y") == 2  # holds pages 0, 1: no longer evictable, so not in the way
    assert mgr.allocate("y", 1).groups[0].page_ids == [0, 1, 2]
    mgr.check_integrity()


def test_a_lookup_let_go_before_its_allocate_is_not_a_use():
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="reuse")
    serve(mgr, "x", [1, 2, 3], [0])
    for i in range(3):  # a waiting request looked up and sent back, step after step
        mgr.add_request(f"w{i}", [1, 2, 5])
        assert mgr.lookup(f"w{i}") == 2
        mgr.free(f"w{i}")
    assert [mgr.index.uses_of(0, p) for p in (0, 1)] == [1, 1]
    assert not mgr.evictor.protected[0]
    mgr.check_integrity()


def test_protected_pages_over_their_share_of_the_pool_no_longer_hold_admission_back():
    mgr = protected_setup()  # pages 0, 1 protected: a quarter of the 8-page pool
    mgr.admission.protected_share = 0.2
    mgr.add_request("z", [30, 31, 32])
    assert mgr.lookup("z") == 0
    assert mgr.can_allocate("z", 3)
    assert mgr.allocate("z", 3).groups[0].page_ids == [2, 3, 1]  # one-off first, then the newest protected
    mgr.check_integrity()


def test_admission_leaves_room_for_its_next_chunk_when_its_prompt_was_seen_and_outgrows_a_window():
    # full + sliding (window 2) layers; prefix [1, 2, 3, 4] served twice (protected: full pages
    # 0..3 and its window page 8), article [11..14] once (one-off), r running on 2 free pages
    spec = model(group("full", full(), 1), group("swa", sliding(2), 1, first_layer=1))
    mgr = make_manager(spec, 20, eviction="reuse")
    serve(mgr, "x", [1, 2, 3, 4, 5], [0])
    serve(mgr, "x2", [1, 2, 3, 4, 6], [0])
    serve(mgr, "b", [11, 12, 13, 14, 15], [0])
    mgr.add_request("r", [40, 41])
    assert mgr.lookup("r") == 0
    assert mgr.allocate("r", 2) is not None
    assert [sorted(mgr.evictor.protected[g]) for g in range(2)] == [[0, 1, 2, 3], [8]]
    # z asks the article again (seen: it hits 4 tokens) with a 7-token prompt, longer than the
    # window: a 2-token chunk [4, 6) is followed by [6, 7), one more full page (the window holds
    # its 2 pages either way); the unprotected pages fit the chunk and the margin, not that page
    mgr.add_request("z", [11, 12, 13, 14, 16, 17, 18])
    assert mgr.lookup("z") == 4
    assert not mgr.can_allocate("z", 2)
    assert mgr.admission.next_chunk(mgr.requests["z"], 6) == [1, 0]  # chunk [4, 6)
    assert mgr.allocate("z", 2) is None
    mgr.check_integrity()
    assert mgr.allocate("z", 1) is not None  # [4, 5), then [5, 6): both fit beside the protected pages
    assert [sorted(mgr.evictor.protected[g]) for g in range(2)] == [[0, 1, 2, 3], [8]]
    mgr.check_integrity()


def test_without_a_window_shorter_than_the_prompt_no_next_chunk_is_reserved():
    mgr = protected_setup()  # full attention only
    mgr.add_request("z", [1, 2, 9, 9, 9])
    assert mgr.lookup("z") == 2  # seen, but every layer reads the whole prompt
    assert not mgr.admission.windowed(mgr.requests["z"])
    assert mgr.can_allocate("z", 1)
