"""LCM allocator: exact page ids for the paper's toy and the request-aware order (§4)."""

from __future__ import annotations

import pytest
from conftest import (
    TOY_TOKEN_BYTES,
    cached_keys,
    make_manager,
    page_ids,
    run,
    snapshot,
    toy_model,
    two_full_model,
)

from jenga.core.alloc.allocator import CACHED, FREE, USED, LargePageAllocator, PageViews

SELF, CROSS = 0, 1  # group indices of toy_model()


# ------------------------------------------------------------------ sizes
def test_paper_toy_sizes():
    spec = toy_model()
    self_g, cross_g = spec.groups
    assert self_g.layer_page_bytes == cross_g.layer_page_bytes == TOY_TOKEN_BYTES
    assert (self_g.page_bytes, cross_g.page_bytes) == (384, 256)
    assert spec.large_page_bytes == 768
    mgr = make_manager(spec, 4)
    assert mgr.alloc.small_per_large == [2, 3]
    assert mgr.large_page_bytes == 768
    assert mgr.stats().total_bytes == 4 * 768


def test_budget_keeps_one_slack_large_page():
    mgr = make_manager(toy_model(), 3)
    assert mgr.memory_bytes == 4 * 768 and mgr.alloc.num_large == 3


# ----------------------------------------------------- the bare allocator
def test_allocator_placement_and_pool_return():
    a = LargePageAllocator(PageViews.of([384, 256], 3))
    assert a.large_page_bytes == 768 and a.small_per_large == [2, 3]
    # group 1 (k=3) for tag "x": slots of large 0 in order, then a new large page
    assert [a.allocate(1, "x", True) for _ in range(4)] == [0, 1, 2, 3]
    assert a.group_of == [1, 1, -1] and a.num_free_large == 1
    assert [a.large_of(1, p) for p in (0, 2, 3)] == [0, 0, 1]
    # group 0 (k=2) takes the last large page: pages 4, 5
    assert [a.allocate(0, "y", True) for _ in range(2)] == [4, 5]
    assert a.num_free_large == 0
    # large 1 holds only page 3: freeing it returns the large page to the pool at once
    a.release(1, 3)
    assert a.group_of[1] == -1 and a.num_free_large == 1
    # a large page with one page still used stays carved
    a.release(1, 0)
    a.release(1, 1)
    assert a.group_of[0] == 1
    a.release(1, 2)
    assert a.group_of[0] == -1 and a.num_free_large == 2
    # memory moves between groups: group 0 now gets the former group-1 large pages 0 and 1
    assert [a.allocate(0, "z", True) for _ in range(4)] == [0, 1, 2, 3]
    assert a.group_of == [0, 0, 0]
    a.check_integrity()


def test_allocator_without_evictor_order_is_1_2_4():
    a = LargePageAllocator(PageViews.of([384, 256], 3))  # group 0: k = 2
    assert a.allocate(0, "r1", True) == 0  # 2: new large page 0
    assert a.allocate(0, "r2", True) == 2  # 2: new large page 1
    assert a.allocate(0, "r1", True) == 1  # 1: own large page first (not page 3)
    assert a.allocate(0, "r3", False) == 3  # 4: quota spent, a free slot in r2's large page
    assert a.allocate(0, "r3", True) == 4  # 2
    assert a.allocate(0, "r1", True) == 5  # r1 owns no slot: step 4 (no free large page)
    with pytest.raises(AssertionError):
        a.allocate(0, "r1", True)
    a.check_integrity()


def test_allocator_states_and_fully_evictable_set():
    a = LargePageAllocator(PageViews.of([256, 384], 2))  # group 0: k = 3; no evictor attached
    pages = [a.allocate(0, "r", True) for _ in range(3)]
    assert pages == [0, 1, 2]
    a.to_cached(0, 0)
    assert a.num_e == 0  # pages 1, 2 still used
    a.release(0, 1)
    a.to_cached(0, 2)
    assert a.num_e == 1 and a.in_e[0]
    assert bytes(a.state[0][:3]) == bytes([CACHED, FREE, CACHED])
    # the free slot of a fully evictable large page is hidden; the page counts as whole
    sup = a.supply()
    assert sup.free_small == (0, 0) and sup.cached_small == (0, 0) and sup.whole_large == 2
    assert a.hidden_free == [1, 0]
    a.touch_cached(0, 2)  # a prefix hit: leaves E, slot 1 visible again
    assert a.num_e == 0 and a.supply().free_small == (1, 0) and a.supply().cached_small == (1, 0)
    assert a.state[0][2] == USED
    a.check_integrity()


# ----------------------------------------- the request-aware order (manager)
def test_order_step1_own_large_page_then_step2_new_large_page():
    mgr = make_manager(toy_model(), 4)
    for rid, tok in (("r1", 1), ("r2", 2)):
        mgr.add_request(rid, [tok, tok])
    run(mgr, "r1", 1)
    run(mgr, "r2", 1)
    assert page_ids(mgr, "r1", SELF) == [0]  # large 0
    assert page_ids(mgr, "r2", SELF) == [2]  # step 2: a new large page (1), not r1's free slot 1
    run(mgr, "r1", 1)
    run(mgr, "r2", 1)
    assert page_ids(mgr, "r1", SELF) == [0, 1]  # step 1: own large page, although page 3 is free too
    assert page_ids(mgr, "r2", SELF) == [2, 3]
    assert mgr.alloc.tag_of[:2] == ["r1", "r2"]


def test_order_step2_new_large_page_before_evicting():
    mgr = make_manager(toy_model(), 2)
    mgr.add_request("old", [1, 2])
    run(mgr, "old", 2, [3])
    mgr.free("old")
    assert cached_keys(mgr, SELF) == {0: (1, -1), 1: (1, -2)}
    mgr.add_request("new", [7])
    run(mgr, "new", 1)
    assert page_ids(mgr, "new", SELF) == [2]
    assert mgr.stats().evicted_pages == 0


def test_order_step3_evicts_fully_evictable_large_page_before_step4():
    mgr = make_manager(toy_model(), 2)
    mgr.add_request("old", [1, 2])
    run(mgr, "old", 2, [3])
    mgr.free("old")  # large 0 fully evictable
    mgr.add_request("r2", [7])
    run(mgr, "r2", 1)
    assert page_ids(mgr, "r2", SELF) == [2]  # large 1, page 3 still free
    mgr.add_request("r3", [8])
    run(mgr, "r3", 1)
    # step 3 comes before step 4: the cached large page 0 is evicted whole, page 3 stays free
    assert page_ids(mgr, "r3", SELF) == [0]
    assert mgr.stats().evicted_pages == 2 and cached_keys(mgr, SELF) == {}
    assert mgr.alloc.tag_of == ["r3", "r2"]
    mgr.add_request("again", [1, 2, 3])
    assert mgr.lookup("again") == 0


def test_order_step4_free_slot_in_another_requests_large_page():
    mgr = make_manager(toy_model(), 2)
    for rid, tok in (("r1", 1), ("r2", 2), ("r3", 3), ("r4", 4)):
        mgr.add_request(rid, [tok])
    run(mgr, "r1", 1)
    run(mgr, "r2", 1)
    run(mgr, "r3", 1)  # no free nor evictable large page: lowest large page with a free slot
    run(mgr, "r4", 1)
    assert [page_ids(mgr, r, SELF) for r in ("r1", "r2", "r3", "r4")] == [[0], [2], [1], [3]]
    assert mgr.alloc.tag_of == ["r1", "r2"]  # step 4 does not re-tag
    mgr.add_request("r5", [5])
    assert mgr.allocate("r5", 1) is None


def test_order_step5_evicts_one_small_page():
    mgr = make_manager(toy_model(), 2)
    mgr.add_request("A", [1, 2])
    run(mgr, "A", 2, [3])
    mgr.add_request("B", [1, 9])
    assert mgr.lookup("B") == 1  # holds page 0
    run(mgr, "B", 1)
    assert page_ids(mgr, "B", SELF) == [0, 2]
    mgr.free("A")  # page 1 cached, page 0 still used by B: large 0 is not fully evictable
    assert cached_keys(mgr, SELF) == {1: (1, -2)} and mgr.alloc.num_e == 0
    mgr.add_request("C", [5])
    run(mgr, "C", 1)
    assert page_ids(mgr, "C", SELF) == [3]  # step 4 (a free slot) before step 5
    mgr.add_request("D", [6])
    run(mgr, "D", 1)
    assert page_ids(mgr, "D", SELF) == [1]  # step 5: evict the cached small page 1
    assert mgr.stats().evicted_pages == 1 and cached_keys(mgr, SELF) == {}
    mgr.add_request("A2", [1, 2, 3])
    assert mgr.lookup("A2") == 1


def test_order_step3_picks_the_oldest_large_page():
    mgr = make_manager(toy_model(), 3)
    for rid, prompt in (("x", [1, 2]), ("y", [3, 4]), ("z", [5, 6])):
        mgr.add_request(rid, prompt)
        run(mgr, rid, 2, [0])
    mgr.free("y")  # last access 2
    mgr.free("x")  # last access 1
    mgr.add_request("n", [7])
    run(mgr, "n", 1)
    assert page_ids(mgr, "n", SELF) == [0]  # x's large page 0 is older than y's large page 1
    assert sorted(cached_keys(mgr, SELF)) == [2, 3]


def test_finished_request_returns_whole_large_pages_without_caching():
    mgr = make_manager(toy_model(), 3, caching=False)
    mgr.add_request("a", list(range(3)))
    mgr.add_request("b", list(range(3)))
    run(mgr, "a", 1)
    run(mgr, "b", 1)
    run(mgr, "a", 2)
    run(mgr, "b", 2)
    # each request fills its own large page first: freeing a returns large 0 and 2 whole
    assert page_ids(mgr, "a", SELF) == [0, 1, 4]
    assert page_ids(mgr, "b", SELF) == [2, 3, 5]
    mgr.free("a")
    assert mgr.alloc.num_free_large == 1  # large 0; large 2 still has b's page 5
    assert mgr.alloc.group_of == [-1, SELF, SELF]


# ------------------------------------------------- memory moves between groups
def test_large_page_moves_between_groups():
    mgr = make_manager(toy_model(), 3, caching=False)
    mgr.add_request("text", [1, 2, 3, 4])
    run(mgr, "text", 4)
    assert page_ids(mgr, "text", SELF) == [0, 1, 2, 3]
    assert mgr.alloc.group_of == [SELF, SELF, -1]
    mgr.free("text")
    assert mgr.alloc.group_of == [-1, -1, -1] and mgr.stats().free_bytes == 3 * 768
    mgr.add_request("img", [1], images=[(0, 6, "cat")])
    t = run(mgr, "img", 1)
    assert t.groups[SELF].page_ids == [0]
    assert t.groups[CROSS].pages == {0: [3, 4, 5, 6, 7, 8]}  # large 1 and 2, formerly self pages
    assert t.groups[CROSS].to_fill == set()  # committed by append_tokens
    assert mgr.alloc.group_of == [SELF, CROSS, CROSS]
    mgr.check_integrity()


def test_cached_large_page_moves_to_another_group_after_eviction():
    mgr = make_manager(toy_model(), 2)
    mgr.add_request("text", [1, 2, 3, 4])
    run(mgr, "text", 4, [5])
    mgr.free("text")
    assert mgr.alloc.group_of == [SELF, SELF] and mgr.alloc.num_e == 2
    mgr.add_request("img", [9], images=[(0, 3, "cat")])
    t = run(mgr, "img", 1)
    # step 3 evicts the large page with the smaller key (max over its pages) first: large 1
    # holds the tail (1, -3), (1, -4) < large 0's (1, -1) -> self page 2; then cross takes
    # the evicted large 0 -> pages 0, 1, 2
    assert t.groups[SELF].page_ids == [2]
    assert t.groups[CROSS].pages == {0: [0, 1, 2]}
    assert mgr.alloc.group_of == [CROSS, SELF]
    assert mgr.stats().evicted_pages == 4


# ------------------------------------------------------ all or nothing
def test_all_or_nothing_across_groups():
    mgr = make_manager(two_full_model(), 3)  # a: k=3, b: k=2
    mgr.add_request("r1", list(range(3)))
    run(mgr, "r1", 3)
    assert page_ids(mgr, "r1", 0) == [0, 1, 2]  # large 0
    assert page_ids(mgr, "r1", 1) == [2, 3, 4]  # large 1 and 2; b page 5 free
    mgr.add_request("r2", [7, 8])
    before = snapshot(mgr)
    # group b has a free page, group a has none and no large page is left: nothing is taken
    assert mgr.allocate("r2", 1) is None
    assert snapshot(mgr) == before
    assert mgr.allocate("r2", 2) is None
    assert snapshot(mgr) == before
    mgr.free("r1")
    assert mgr.allocate("r2", 2) is not None
    mgr.check_integrity()


def test_quota_min_uses_free_slots_when_whole_pages_are_short():
    mgr = make_manager(two_full_model(), 3)
    mgr.add_request("r1", [1])
    run(mgr, "r1", 1)  # a: large 0 (pages 0..2), b: large 1 (pages 2, 3)
    mgr.add_request("r2", [2, 3, 4])
    # r2 needs 3 a-pages (2 free slots in r1's large page) and 3 b-pages (1 free slot):
    # max quota = 1 + 2 = 3 > 1 free large page; min quota = 1 + 1 = 2 > 1 -> None
    assert mgr.allocate("r2", 3) is None
    # 2 tokens: min quota a = 0 (2 free slots), b = ceil((2 - 1) / 2) = 1 -> fits
    t = mgr.allocate("r2", 2)
    assert t.groups[0].page_ids == [1, 2]
    assert t.groups[1].page_ids == [4, 5]  # a new large page 2 (quota 1), then its own slot
    mgr.check_integrity()


def _admit_state_hybrid_prompts(num_large: int, prompt_len: int) -> list[tuple[list, int]]:
    """Attention pages a third of a large page, a state page a whole one: prompts of ``prompt_len``
    distinct tokens admitted one after another until one does not fit; each admitted one's
    attention page ids and state page."""
    from conftest import full, group, mamba, model
    spec = model(group("full", full(), 1), group("mamba", mamba(16, state_elems=384), 1, first_layer=1))
    mgr = make_manager(spec, num_large, tokens_per_page=2)
    assert mgr.alloc.small_per_large == [3, 1]
    return [(mgr.requests[i].tables.groups[0].page_ids, mgr.requests[i].tables.groups[1].work_page)
            for i in _admit_until_full(mgr, prompt_len)]


def _admit_until_full(mgr, prompt_len: int) -> list[int]:
    """Prompts of ``prompt_len`` distinct tokens admitted one after another until one does not fit
    (at most 12); the admitted ones' ids."""
    admitted = []
    for i in range(12):
        mgr.add_request(i, [100 + prompt_len * i + j for j in range(prompt_len)])
        mgr.lookup(i)
        if mgr.allocate(i, prompt_len) is None:
            mgr.free(i)
            break
        admitted.append(i)
        mgr.check_integrity()
    return admitted


def test_one_page_prompts_share_large_pages_where_a_state_page_needs_a_whole_one():
    """A one-page prompt that took a fresh large page for its attention page left two slots no state
    page can use (each request took two large pages: 4 of 8).  Where some group's page is a whole
    large page, such a prompt fills other requests' large pages first (``Admission.prefer_shared``):
    three requests' attention pages per large page, 6 of 8 admitted."""
    got = _admit_state_hybrid_prompts(8, 2)
    assert [pages for pages, _ in got] == [[0], [1], [2], [12], [13], [14]]
    assert [state for _, state in got] == [1, 2, 3, 5, 6, 7]


def test_multi_page_prompts_fill_shared_large_pages_of_three_where_a_state_page_needs_a_whole_one():
    """Prompts of two attention pages: each took a fresh large page for them and left its third slot
    free, where no state page fits (5 requests in 10 large pages).  Where a state group's page is a
    whole large page, a token group of at most three pages per large page fills other requests'
    large pages first (``Admission.prefer_shared``): 6 admitted."""
    got = _admit_state_hybrid_prompts(10, 4)
    # before: [[0, 1], [6, 7], [12, 13], [18, 19], [24, 25]], state pages in large pages 1, 3, 5, 7, 9
    assert [pages for pages, _ in got] == [[0, 1], [2, 6], [7, 8], [15, 16], [17, 21], [22, 23]]
    assert [state for _, state in got] == [1, 3, 4, 6, 8, 9]


def _admit_two_page_prompts(kind: str, num_large: int) -> list[tuple[list, list]]:
    """Full-attention pages a third of a large page, a ``kind`` group's (chunked or sliding, window
    64) a whole one: four-token prompts (two pages each) admitted one after another until one does
    not fit; each admitted one's page ids in both groups."""
    from conftest import chunked, full, group, model, sliding
    other = chunked(64) if kind == "chunked" else sliding(64)
    mgr = make_manager(model(group("full", full(), 1), group(kind, other, 3, first_layer=1)), num_large,
                       tokens_per_page=2)
    assert mgr.alloc.small_per_large == [3, 1]
    return [(mgr.requests[i].tables.groups[0].page_ids, mgr.requests[i].tables.groups[1].page_ids)
            for i in _admit_until_full(mgr, 4)]


def test_full_attention_pages_fill_shared_large_pages_where_a_chunk_page_needs_a_whole_one():
    """Llama-4 shape: a chunked group's page is a whole large page, full attention's a third.  A
    chunk group keeps a request's pages as a state group does (``Policy.slides`` is false), so the
    full-attention pages fill other requests' large pages first (``Admission.prefer_shared``), and
    the slots a request's last large page leaves free are used (request 1 takes slot 2 of large
    page 0, request 2 large page 3's other two); a sliding window keeps the old rule: each request's
    full-attention pages in a large page of their own, until the pool runs out."""
    got = _admit_two_page_prompts("chunked", 11)
    assert got == [([0, 1], [1, 2]), ([2, 9], [4, 5]), ([10, 11], [6, 7]), ([24, 25], [9, 10])]
    assert _admit_two_page_prompts("sliding", 11) == [([0, 1], [1, 2]), ([9, 10], [4, 5]), ([18, 19], [7, 8]),
                                                      ([2, 11], [9, 10])]
