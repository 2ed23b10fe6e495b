"""KVCacheManager: per-kind page lifetimes, prefix hits, rollback, typed errors, integrity."""

from __future__ import annotations

import pytest
from conftest import (
    cached_keys,
    chunked,
    evict_page,
    full,
    group,
    make_manager,
    mamba,
    model,
    page_ids,
    run,
    serve,
    sliding,
    snapshot,
    toy_model,
    two_full_model,
    vision,
)

from jenga.core.manager.manager import KVCacheManager
from jenga.core.request import ImageRef
from jenga.core.tables import ImageTable, StateTable, TokenTable
from jenga.errors import (
    DuplicateRequestError,
    InsufficientMemoryError,
    InvalidArgumentError,
    JengaError,
    SequenceTooLongError,
    UnknownRequestError,
)


def full_swa(window: int, max_len: int = 4096):
    return model(group("full", full(), 1), group("swa", sliding(window), 1, first_layer=1), max_len=max_len)


# ----------------------------------------------------------- page lifetimes
def test_full_attention_pages_grow_and_stay():
    mgr = make_manager(two_full_model(), 8, tokens_per_page=2)
    mgr.add_request("r", list(range(5)))
    t = mgr.allocate("r", 5)
    assert isinstance(t.groups[0], TokenTable) and t.groups[0].tokens_per_page == 2
    assert (t.num_computed, t.num_new, t.num_lookahead) == (0, 5, 0)
    # 2 tokens per page: a pages are 512 B (k = 3), b pages 768 B (k = 2)
    assert mgr.alloc.small_per_large == [3, 2]
    assert t.groups[0].page_ids == [0, 1, 2] and t.groups[1].page_ids == [2, 3, 4]
    mgr.append_tokens("r", [5])
    assert (t.num_computed, t.num_new) == (5, 0)
    t = mgr.allocate("r", 1)  # token 5 fits in page 2
    assert t.groups[0].page_ids == [0, 1, 2] and (t.num_computed, t.num_new) == (5, 1)
    mgr.append_tokens("r", [6])
    t = mgr.allocate("r", 1)
    assert t.groups[0].page_ids == [0, 1, 2, 9] and t.groups[1].page_ids == [2, 3, 4, 5]
    mgr.check_integrity()


def test_lookahead_reserves_pages_beyond_the_new_tokens():
    mgr = make_manager(two_full_model(), 8)
    mgr.add_request("r", [1, 2])
    t = mgr.allocate("r", 2, num_lookahead=3)
    assert (t.num_new, t.num_lookahead) == (2, 3)
    assert len(t.groups[0].page_ids) == 5 and len(t.groups[1].page_ids) == 5
    mgr.append_tokens("r", [3])
    t = mgr.allocate("r", 1, num_lookahead=3)  # covers up to 2 + 1 + 3 = 6
    assert len(t.groups[0].page_ids) == 6
    t2 = mgr.allocate("r", 0)  # no lookahead: nothing new, pages stay
    assert len(t2.groups[0].page_ids) == 6 and t2.num_lookahead == 0
    mgr.check_integrity()


def test_sliding_window_pages_released_when_they_leave_the_window():
    mgr = make_manager(full_swa(4), 64, tokens_per_page=2)
    swa = 1
    mgr.add_request("r", list(range(10)))
    t = mgr.allocate("r", 6)  # chunked prefill: tokens 0..5
    assert t.groups[swa].page_ids == [3, 4, 5]
    mgr.append_tokens("r", [])
    # token 6 reads positions 3..6 (W = 4 includes itself): page 0 (tokens 0, 1) leaves
    assert page_ids(mgr, "r", swa) == [None, 4, 5]
    t = mgr.allocate("r", 4)
    assert t.groups[swa].page_ids == [None, 4, 5, 8, 9]
    mgr.append_tokens("r", [10])
    assert page_ids(mgr, "r", swa) == [None, None, None, 8, 9]  # token 10 reads 7..10
    # during decode a page is released at the first page end after it left the window
    # (batched with the registration commit): page 3 (tokens 6, 7) leaves the window of
    # token 11 but goes at 12 computed tokens; page 4 (8, 9) at 14
    expected = {11: [None] * 3 + [8, 9, 11], 12: [None] * 4 + [9, 11], 13: [None] * 4 + [9, 11, 13],
                14: [None] * 5 + [11, 13]}
    for n in range(11, 15):
        run(mgr, "r", 1, [n])
        assert page_ids(mgr, "r", swa) == expected[n], n
    assert page_ids(mgr, "r", 0) == [0, 1, 2, 6, 7, 10, 12]  # the full layer keeps everything
    # released pages are cached (registered) and count as evictable, not used
    assert sorted(cached_keys(mgr, swa)) == [3, 4, 5, 8, 9]
    assert mgr.stats().waste_out_of_window_bytes == 0


def test_chunked_local_pages_released_at_chunk_boundaries():
    spec = model(group("full", full(), 1), group("chunk", chunked(4), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    ch = 1
    mgr.add_request("r", list(range(6)))
    run(mgr, "r", 3)
    assert page_ids(mgr, "r", ch) == [3, 4, 5]
    t = mgr.allocate("r", 3)
    assert t.groups[ch].page_ids == [3, 4, 5, 9, 10, 11]
    mgr.append_tokens("r", [6])
    # token 6 is in chunk [4, 8): chunk 0 leaves at once, chunk 1 stays
    assert page_ids(mgr, "r", ch) == [None] * 4 + [10, 11]
    run(mgr, "r", 1, [7])
    assert page_ids(mgr, "r", ch) == [None] * 4 + [10, 11, 13]
    run(mgr, "r", 1, [8])  # 8 computed: the next token starts chunk [8, 12)
    assert page_ids(mgr, "r", ch) == [None] * 8
    run(mgr, "r", 1, [9])
    assert page_ids(mgr, "r", ch) == [None] * 8 + [17]
    assert sorted(cached_keys(mgr, ch)) == [3, 4, 5, 9, 10, 11, 13, 15]


def test_mamba_keeps_one_work_page_and_caches_checkpoints():
    spec = model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    mgr.add_request("a", list(range(10)))
    t = mgr.allocate("a", 10)
    st = t.groups[1]
    assert isinstance(st, StateTable)
    # every 4 tokens; the prompt's end (10) ends the step: the work page itself becomes it
    assert (st.work_page, st.read_page, st.checkpoints) == (10, None, {4: 11, 8: 12})
    mgr.append_tokens("a", [10])
    # page 10 is checkpoint 10 now (registered, held as the next step's copy source)
    assert (st.read_page, st.checkpoints) == (10, {}) and cached_keys(mgr, 1) == {11: (1, -4), 12: (1, -8)}
    assert mgr.index.is_registered(1, 10) and mgr.stats().used_bytes == (len(page_ids(mgr, "a", 0)) + 1) * 128
    # token 10, lookahead 2: a fresh work page; 10 is copied into it, so it is let go of at once
    t = mgr.allocate("a", 1, num_lookahead=2)
    assert (st.work_page, st.read_page, st.checkpoints) == (16, 10, {}) and cached_keys(mgr, 1)[10] == (2, -10)
    mgr.append_tokens("a", [11])
    assert st.read_page is None
    t = mgr.allocate("a", 1)  # token 11: the step ends on the state after 12 tokens
    assert st.checkpoints == {}
    mgr.append_tokens("a", [12])
    assert (st.work_page, st.read_page) == (16, 16) and mgr.index.is_registered(1, 16)
    t = mgr.allocate("a", 1)  # token 12: no checkpoint; 16 let go of, work page 17
    assert (st.work_page, st.read_page, st.checkpoints) == (17, 16, {})
    mgr.append_tokens("a", [13])
    assert mgr.stats().used_bytes == (len(page_ids(mgr, "a", 0)) + 1) * 128
    mgr.free("a")
    # the work page is not a prefix state: it goes straight back to the pool
    assert cached_keys(mgr, 1) == {11: (1, -4), 12: (1, -8), 10: (2, -10), 16: (4, -12)}
    assert mgr.alloc.group_of[17] == -1
    mgr.check_integrity()


def test_mamba_checkpoint_at_the_decode_step_that_reaches_it():
    spec = model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    mgr.add_request("a", list(range(3)))
    t = run(mgr, "a", 3, [3])
    st = t.groups[1]  # the prefill ended on the prompt-end checkpoint 3: its work page 3
    assert (st.checkpoints, st.read_page) == ({}, 3) and mgr.index.is_registered(1, 3)
    t = mgr.allocate("a", 1)  # token 3: the state after 4 tokens ends this step
    assert (st.work_page, st.read_page, st.checkpoints) == (5, 3, {})
    mgr.append_tokens("a", [4])
    assert (st.work_page, st.read_page) == (5, 5) and mgr.index.is_registered(1, 5)
    mgr.free("a")
    assert cached_keys(mgr, 1) == {3: (2, -3), 5: (2, -4)}  # 5 at a's last access (free)


# ----------------------------------------------------------------- hits
def test_full_prefix_hit_reuses_exact_pages_and_counts_hits():
    mgr = make_manager(two_full_model(), 16)
    serve(mgr, "a", [1, 2, 3, 4, 5, 6], [7, 8])
    mgr.add_request("b", [1, 2, 3, 4, 5, 6, 7, 9])
    assert mgr.lookup("b") == 7  # 6 prompt tokens + the decoded 7
    t = mgr.allocate("b", 1)
    assert t.groups[0].page_ids[:7] == [0, 1, 2, 3, 4, 5, 15]  # 15: a's decode step, large 5
    assert t.num_computed == 7 and t.num_new == 1
    st = mgr.stats()
    assert (st.prefix_hit_tokens, st.prefix_query_tokens) == (7, 6 + 8)
    mgr.add_request("c", [1, 2, 3, 99])
    assert mgr.lookup("c") == 3


def test_last_prompt_token_is_never_a_hit():
    mgr = make_manager(two_full_model(), 16)
    serve(mgr, "a", [1, 2, 3, 4], [5, 6])
    mgr.add_request("same", [1, 2, 3, 4])
    assert mgr.lookup("same") == 3
    mgr.add_request("longer", [1, 2, 3, 4, 5])
    assert mgr.lookup("longer") == 4
    mgr.add_request("one", [1])
    assert mgr.lookup("one") == 0
    # with 2 tokens per page the hit is also page aligned: 4 - 1 -> 2
    mgr2 = make_manager(two_full_model(), 16, tokens_per_page=2)
    serve(mgr2, "a", [1, 2, 3, 4], [5])
    mgr2.add_request("same", [1, 2, 3, 4])
    assert mgr2.lookup("same") == 2


def test_sliding_hit_needs_only_the_last_window():
    spec = model(group("swa", sliding(3), 1))
    mgr = make_manager(spec, 9)  # k = 1
    mgr.add_request("a", list(range(8)))
    run(mgr, "a", 8, [8])  # time 1: pages 0..5 leave the window
    run(mgr, "a", 1, [9])  # time 2: page 6 leaves
    assert page_ids(mgr, "a", 0) == [None] * 7 + [7, 8]
    mgr.free("a")  # time 2 on pages 7, 8
    # a 6-page request evicts the 6 oldest pages: exactly tokens 0..5
    mgr.add_request("x", list(range(100, 106)))
    run(mgr, "x", 6)
    assert mgr.stats().evicted_pages == 6
    assert {6, 7, 8} <= set(cached_keys(mgr, 0))  # the rest are x's own out-of-window pages
    mgr.add_request("b", list(range(8)) + [99])
    assert mgr.lookup("b") == 8  # token 8 reads positions 6, 7: both still cached
    t = mgr.allocate("b", 1)
    # token 8 gets a's old page of token 8: (2, -9) is the smallest key left
    assert t.groups[0].page_ids == [None] * 6 + [6, 7, 8]
    mgr.check_integrity()


def test_sliding_hit_with_full_layers_after_early_sliding_pages_evicted():
    mgr = make_manager(full_swa(2), 64)
    serve(mgr, "a", list(range(8)), [8])
    for p in list(cached_keys(mgr, 1)):
        if p < 14:  # sliding pages of tokens 0..5 (full pages are 0..7, sliding 8..15)
            evict_page(mgr, 1, p)
    assert sorted(cached_keys(mgr, 1)) == [14, 15]
    mgr.add_request("b", list(range(8)) + [99])
    assert mgr.lookup("b") == 8  # window of token 8 = tokens 7, 8
    mgr.free("b")
    evict_page(mgr, 1, 15)
    mgr.add_request("c", list(range(8)) + [99])
    assert mgr.lookup("c") == 7  # window of token 7 = page of token 6 (14)
    mgr.check_integrity()


def test_chunked_hit_needs_only_the_current_chunk():
    spec = model(group("full", full(), 1), group("chunk", chunked(4), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    serve(mgr, "a", list(range(10)), [10])
    chunk_pages = sorted(cached_keys(mgr, 1))
    assert len(chunk_pages) == 10
    prompt = list(range(10)) + [50, 51]
    mgr.add_request("b", prompt)
    assert mgr.lookup("b") == 10
    mgr.free("b")
    for p in chunk_pages[:8]:  # chunks [0, 4) and [4, 8)
        evict_page(mgr, 1, p)
    mgr.add_request("c", prompt)
    assert mgr.lookup("c") == 10
    t = mgr.allocate("c", 2)
    assert t.groups[1].page_ids[:10] == [None] * 8 + chunk_pages[8:]
    mgr.free("c")
    evict_page(mgr, 1, chunk_pages[9])
    mgr.add_request("d", prompt)
    assert mgr.lookup("d") == 9
    mgr.free("d")
    evict_page(mgr, 1, chunk_pages[8])
    mgr.add_request("e", prompt)
    assert mgr.lookup("e") == 8  # a chunk boundary needs no chunked page at all


def test_mamba_hits_only_at_checkpoints():
    spec = model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    serve(mgr, "a", list(range(10)), [10])
    ckpt = cached_keys(mgr, 1)
    assert sorted(v[1] for v in ckpt.values()) == [-10, -8, -4]  # every 4, and the prompt end
    at = {-k[1]: p for p, k in ckpt.items()}
    mgr.add_request("e", list(range(9)) + [50])
    assert mgr.lookup("e") == 8  # full could hit 9; the state exists only after 4, 8 and 10
    mgr.free("e")
    mgr.add_request("b", list(range(10)) + [50])
    assert mgr.lookup("b") == 10  # a's prompt end
    t = mgr.allocate("b", 1)
    st = t.groups[1]
    assert st.read_page == at[10] and st.work_page not in ckpt
    assert t.groups[0].page_ids[:10] == list(range(10))
    mgr.append_tokens("b", [1])
    # a's 10 was let go of at the allocate (the step copied it first); the step ended on b's
    # prompt end 11, so b's work page became that checkpoint (its next step's copy source)
    assert at[10] in cached_keys(mgr, 1) and st.read_page == st.work_page == 14
    mgr.add_request("c", list(range(7)) + [77])
    assert mgr.lookup("c") == 4
    mgr.add_request("d", list(range(3)) + [77])
    assert mgr.lookup("d") == 0


def test_cross_attention_pages_shared_by_image_across_texts():
    mgr = make_manager(toy_model(), 8)
    cat = ImageRef(0, 3, "cat")
    mgr.add_request("a", [1, 2], images=[cat])
    t = run(mgr, "a", 2, [3])
    assert isinstance(t.groups[1], ImageTable)
    assert t.groups[1].pages == {0: [3, 4, 5]}
    mgr.add_request("b", [7, 8, 9], images=[cat, ImageRef(3, 2, "dog")])
    assert mgr.lookup("b") == 0  # the text differs
    t = mgr.allocate("b", 3)
    assert t.groups[1].pages == {0: [3, 4, 5], 1: [12, 13]}  # cat shared while a is live
    assert t.groups[1].to_fill == {1}  # only the dog runs through the encoder
    assert mgr.ref[1][3] == 2
    mgr.append_tokens("b", [4])
    mgr.free("a")
    mgr.free("b")
    mgr.add_request("c", [5], images=[ImageRef(0, 2, "dog")])
    t = mgr.allocate("c", 1)
    assert t.groups[1].pages == {0: [12, 13]} and t.groups[1].to_fill == set()
    mgr.check_integrity()


def test_vision_embeddings_released_after_consumption_and_reused():
    spec = model(group("full", full(), 1), group("vis", vision(64), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    mgr.add_request("a", list(range(8)), images=[(2, 3, "cat")])
    t = run(mgr, "a", 2)  # tokens 0, 1: the image starts at 2
    assert t.groups[1].pages == {}
    t = mgr.allocate("a", 2)  # tokens 2, 3: the image's pages, to be filled by the encoder
    assert t.groups[1].pages == {0: [4, 5, 6]} and t.groups[1].to_fill == {0}
    mgr.append_tokens("a", [])
    assert t.groups[1].pages == {0: [4, 5, 6]}  # token 4 still reads the embedding
    run(mgr, "a", 2)  # tokens 4, 5: the image is consumed
    assert t.groups[1].pages == {}
    assert sorted(cached_keys(mgr, 1)) == [4, 5, 6]
    assert mgr.stats().used_bytes == 6 * 128  # only the 6 full-attention pages
    mgr.add_request("b", [50, 51, 52, 53, 54], images=[(1, 3, "cat")])
    assert mgr.lookup("b") == 0
    t = mgr.allocate("b", 5)
    assert t.groups[1].pages == {0: [4, 5, 6]} and t.groups[1].to_fill == set()
    mgr.append_tokens("b", [1])
    assert t.groups[1].pages == {}
    mgr.check_integrity()


def test_can_allocate_with_a_deferred_hit_and_cached_vision_pages_leaks_no_reference():
    # b's lookup hit (tokens 0-2) is deferred; planning its image (cached by a) holds the image's
    # pages inside the plan's log, and the hit is held first: each probe gives back all it held
    spec = model(group("full", full(), 1), group("vis", vision(64), 1, first_layer=1))
    mgr = make_manager(spec, 64)
    serve(mgr, "a", list(range(8)), [8], images=[(4, 3, "cat")])
    mgr.add_request("b", [0, 1, 2, 99, 4, 5, 6, 7], images=[(4, 3, "cat")])
    assert mgr.lookup("b") == 3
    for _ in range(3):
        assert mgr.can_allocate("b", 5)
        mgr.check_integrity()
    t = mgr.allocate("b", 5)
    assert t.groups[1].to_fill == set() and len(t.groups[1].pages[0]) == 3  # a's cached image pages
    mgr.append_tokens("b", [1])
    mgr.free("b")
    mgr.check_integrity()
    assert mgr.stats().used_bytes == 0


def test_model_level_hit_is_the_longest_prefix_every_group_accepts():
    spec = model(group("full", full(), 1), group("swa", sliding(2), 1, first_layer=1),
                 group("mamba", mamba(4), 1, first_layer=2))
    mgr = make_manager(spec, 64)
    serve(mgr, "a", list(range(10)), [10])
    swa = {-k[1] - 1: p for p, k in cached_keys(mgr, 1).items()}  # token position -> page
    ckpt = {-k[1]: p for p, k in cached_keys(mgr, 2).items()}
    assert sorted(swa) == list(range(10)) and sorted(ckpt) == [4, 8, 10]
    evict_page(mgr, 2, ckpt[10])  # without a's prompt-end state, Mamba hits only at 4 and 8
    prompt = list(range(10)) + [50]
    mgr.add_request("b", prompt)
    assert mgr.lookup("b") == 8  # full and sliding accept 10, Mamba only 8
    mgr.free("b")
    evict_page(mgr, 1, swa[7])
    # Mamba 8 -> sliding rejects 8 (needs token 7), accepts 7 -> Mamba 4 -> sliding 4 ok
    mgr.add_request("c", prompt)
    assert mgr.lookup("c") == 4
    mgr.free("c")
    evict_page(mgr, 2, ckpt[4])
    mgr.add_request("d", prompt)
    assert mgr.lookup("d") == 0
    mgr.check_integrity()


def test_cache_salt_isolates_tenants():
    mgr = make_manager(two_full_model(), 32)
    serve(mgr, "a", [1, 2, 3, 4], [5], salt="tenant-1")
    for rid, salt, hit in (("b", "tenant-2", 0), ("c", None, 0), ("d", "tenant-1", 4)):
        mgr.add_request(rid, [1, 2, 3, 4, 9], cache_salt=salt)
        assert mgr.lookup(rid) == hit, rid
        mgr.free(rid)


def test_no_prefix_caching_means_no_hits_and_no_cached_pages():
    mgr = make_manager(full_swa(2), 32, caching=False)
    serve(mgr, "a", [1, 2, 3, 4], [5, 6])
    assert mgr.stats().cached_bytes == 0 and mgr.stats().used_bytes == 0
    mgr.add_request("b", [1, 2, 3, 4, 5])
    assert mgr.lookup("b") == 0


def test_lookup_pins_pages_until_free_or_relookup():
    mgr = make_manager(two_full_model(), 16)
    serve(mgr, "a", [1, 2, 3], [4, 5])
    keys = [cached_keys(mgr, g) for g in (0, 1)]
    mgr.add_request("b", [1, 2, 3, 4, 5])
    assert mgr.lookup("b") == 4
    pinned = page_ids(mgr, "b", 0)
    assert pinned == [0, 1, 2, 9]  # token 3 was computed by a's decode step (large 3)
    assert cached_keys(mgr, 0) == {} and [mgr.ref[0][p] for p in pinned] == [1, 1, 1, 1]
    assert mgr.lookup("b") == 4  # the same pages, pinned once
    assert [mgr.ref[0][p] for p in pinned] == [1, 1, 1, 1]
    mgr.check_integrity()
    mgr.free("b")  # never allocated: the pins go back with their old keys
    assert [cached_keys(mgr, g) for g in (0, 1)] == keys
    assert keys[0] == {0: (2, -1), 1: (2, -2), 2: (2, -3), 9: (2, -4)}
    mgr.add_request("c", [1, 2, 3, 4, 5])
    assert mgr.lookup("c") == 4
    mgr.free("c")  # one lookup, then free: keys restored exactly (sign of the length included)
    assert [cached_keys(mgr, g) for g in (0, 1)] == keys
    mgr.check_integrity()
    mgr.check_integrity()


# ------------------------------------------------------- None changes nothing
def test_allocate_none_changes_nothing_even_after_holding_cached_pages():
    mgr = make_manager(toy_model(), 4)
    cat = ImageRef(0, 3, "cat")
    serve(mgr, "a", [1, 2], [3, 4], images=[cat])
    mgr.add_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9], images=[cat])
    assert mgr.lookup("b") == 3  # pins three self pages
    before = snapshot(mgr)
    assert mgr.allocate("b", 6) is None  # plan held the cached cat pages, then gave up
    assert snapshot(mgr) == before
    mgr.check_integrity()
    t = mgr.allocate("b", 2)
    assert t.groups[1].pages == {0: [3, 4, 5]} and t.groups[1].to_fill == set()
    mgr.check_integrity()


def test_allocate_none_leaves_live_requests_untouched():
    mgr = make_manager(full_swa(2), 8)
    mgr.add_request("a", list(range(4)))
    run(mgr, "a", 4, [4])
    mgr.add_request("b", list(range(10, 20)))
    before = snapshot(mgr)
    assert mgr.allocate("b", 10) is None
    assert snapshot(mgr) == before
    assert mgr.allocate("b", 1) is not None  # evicts a's out-of-window pages
    mgr.check_integrity()


# --------------------------------------------------------------- errors
def _assert_raises_unchanged(mgr, exc, fn, *args, **kw):
    before = snapshot(mgr)
    with pytest.raises(exc) as info:
        fn(*args, **kw)
    assert isinstance(info.value, JengaError)
    assert snapshot(mgr) == before
    mgr.check_integrity()


def test_bad_input_raises_typed_errors_and_changes_nothing():
    mgr = make_manager(model(group("full", full(), 1), group("m", mamba(2), 1, first_layer=1), max_len=8), 16)
    mgr.add_request("a", [1, 2, 3])
    assert mgr.lookup("a") == 0
    run(mgr, "a", 2)
    u = _assert_raises_unchanged
    u(mgr, UnknownRequestError, mgr.allocate, "zz", 1)
    u(mgr, UnknownRequestError, mgr.lookup, "zz")
    u(mgr, UnknownRequestError, mgr.append_tokens, "zz", [1])
    u(mgr, UnknownRequestError, mgr.free, "zz")
    u(mgr, DuplicateRequestError, mgr.add_request, "a", [1])
    u(mgr, InvalidArgumentError, mgr.add_request, "e", [])
    u(mgr, SequenceTooLongError, mgr.add_request, "long", list(range(9)))
    u(mgr, InvalidArgumentError, mgr.add_request, "img", [1, 2], images=[(3, 1, "x")])
    u(mgr, InvalidArgumentError, mgr.add_request, "img", [1, 2], images=[(0, 0, "x")])
    u(mgr, InvalidArgumentError, mgr.allocate, "a", -1)
    u(mgr, InvalidArgumentError, mgr.allocate, "a", 1, num_lookahead=-1)
    u(mgr, InvalidArgumentError, mgr.allocate, "a", 2)  # only token 2 is known
    u(mgr, InvalidArgumentError, mgr.lookup, "a")  # after allocate
    u(mgr, SequenceTooLongError, mgr.allocate, "a", 1, num_lookahead=6)  # 2 + 1 + 6 > 8
    run(mgr, "a", 1, [4, 5, 6, 7, 8])  # 3 computed, 8 known
    mgr.append_tokens("a", [])
    u(mgr, SequenceTooLongError, mgr.append_tokens, "a", [9, 10])  # 10 token ids > 8 + 1
    mgr.free("a")
    u(mgr, UnknownRequestError, mgr.allocate, "a", 1)  # freed
    u(mgr, UnknownRequestError, mgr.free, "a")
    assert mgr.stats().used_bytes == 0


def test_unknown_request_error_is_a_key_error_with_a_readable_message():
    mgr = make_manager(two_full_model(), 4)
    with pytest.raises(KeyError, match="unknown request id 'nope'"):
        mgr.allocate("nope", 1)


def test_constructor_errors():
    spec = two_full_model()
    with pytest.raises(InsufficientMemoryError):
        KVCacheManager(spec, 768, tokens_per_page=1, fit_pages=False)  # no room for the slack page
    with pytest.raises(InvalidArgumentError):
        KVCacheManager(spec, 10_000, tokens_per_page=0, fit_pages=False)
    with pytest.raises(InvalidArgumentError):
        KVCacheManager(spec, 0, tokens_per_page=1, fit_pages=False)


# ------------------------------------------------------------ integrity
def test_check_integrity_catches_a_corrupted_refcount():
    mgr = make_manager(two_full_model(), 8)
    serve(mgr, "a", [1, 2, 3], [4], free=False)
    mgr.check_integrity()
    mgr.ref[0][1] += 1
    with pytest.raises(AssertionError, match="refcount"):
        mgr.check_integrity()
    mgr.ref[0][1] -= 1
    mgr.check_integrity()


def test_check_integrity_catches_a_page_shared_without_the_index():
    mgr = make_manager(two_full_model(), 8)
    mgr.add_request("a", [1, 2])
    mgr.add_request("b", [3, 4])
    run(mgr, "a", 2)
    run(mgr, "b", 2)
    mgr.requests["b"].groups[0].pages[0] = mgr.requests["a"].groups[0].pages[0]
    with pytest.raises(AssertionError):
        mgr.check_integrity()


def test_check_integrity_catches_allocator_counter_drift():
    mgr = make_manager(two_full_model(), 8)
    serve(mgr, "a", [1, 2, 3], [4], free=False)
    mgr.alloc.used_small[1] += 1
    with pytest.raises(AssertionError):
        mgr.check_integrity()


def test_stats_add_up():
    mgr = make_manager(full_swa(2), 16, tokens_per_page=2)
    mgr.add_request("a", list(range(7)))
    run(mgr, "a", 7, [7])
    st = mgr.stats()
    assert st.total_bytes == st.used_bytes + st.cached_bytes + st.free_bytes
    # full: 4 pages held, 7 tokens needed; sliding: pages of tokens 6 (and the lookahead slot)
    assert st.needed_bytes == 7 * 128 + 1 * 128
    assert st.used_bytes == (4 + 1) * 256
    assert st.waste_partial_page_bytes == st.used_bytes - st.needed_bytes
    assert st.num_requests == 1


# ------------------------------------------- pins undone after others moved
def test_pin_released_after_the_writer_left():
    """b pins a's pages while a is live (no evictor key to restore); a frees first; then
    b frees without allocating: the pages must become cached, not stay USED forever."""
    mgr = make_manager(two_full_model(), 16)
    mgr.add_request("a", [1, 2, 3, 4, 5])
    run(mgr, "a", 4)  # tokens 0..3 registered, a still live
    mgr.add_request("b", [1, 2, 3, 4, 9])
    assert mgr.lookup("b") == 4
    mgr.free("a")  # a's drop leaves the pages referenced by b's pins
    mgr.check_integrity()
    mgr.free("b")
    mgr.check_integrity()
    assert mgr.stats().used_bytes == 0
    # the pages carry a's release key (time 1, position) as if b never looked
    assert cached_keys(mgr, 0) == {0: (1, -1), 1: (1, -2), 2: (1, -3), 3: (1, -4)}


def test_two_pins_on_one_cached_page_released_in_any_order():
    mgr = make_manager(two_full_model(), 16)
    serve(mgr, "a", [1, 2, 3], [4, 5])
    keys = cached_keys(mgr, 0)
    for first, second in (("x", "y"), ("y", "x")):
        mgr.add_request("x", [1, 2, 3, 4, 6])
        mgr.add_request("y", [1, 2, 3, 4, 7])
        assert mgr.lookup("x") == 4  # takes the pages out of the evictor
        assert mgr.lookup("y") == 4  # a second reference, no key
        mgr.free(first)
        mgr.check_integrity()
        mgr.free(second)
        mgr.check_integrity()
        assert cached_keys(mgr, 0) == keys


def test_same_image_twice_in_one_request():
    mgr = make_manager(toy_model(), 16)
    serve(mgr, "a", [1, 2], [3], images=[ImageRef(0, 3, "cat")])
    mgr.add_request("b", [5, 6, 7], images=[ImageRef(0, 3, "cat"), ImageRef(1, 3, "cat")])
    t = mgr.allocate("b", 3)
    assert t.groups[1].pages == {0: [3, 4, 5], 1: [3, 4, 5]} and t.groups[1].to_fill == set()
    assert mgr.ref[1][3] == 2
    mgr.check_integrity()  # one reference per occurrence is legitimate
    mgr.append_tokens("b", [1])
    mgr.free("b")
    mgr.check_integrity()
    assert sorted(cached_keys(mgr, 1)) == [3, 4, 5]


def test_window_slack_keeps_a_second_question_hitting():
    """A question ending a little earlier than the first one on the same article still finds
    its whole window: the band below the first request's prompt-end window is released at full
    priority, not aged (window_slack)."""
    from jenga.core.manager.manager import KVCacheManager
    from jenga.core.specs import FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec

    spec = ModelSpec("qa", (LayerGroup("full", FullAttentionSpec("m", "bf16", 1, 8), (0,)),
                            LayerGroup("sliding", SlidingWindowSpec("m", "bf16", 1, 8, window=64), (1, 2))),
                     max_model_len=4096)
    article = list(range(1000, 1400))

    def second_hit(slack: int) -> int:
        mgr = KVCacheManager(spec, 1 << 20, tokens_per_page=16, fit_pages=False, window_slack=slack)
        mgr.add_request("q1", article + list(range(40)))  # a 40-token question
        assert mgr.allocate("q1", 440) is not None
        mgr.append_tokens("q1", [7])
        mgr.free("q1")
        # memory pressure takes exactly the pages that left the window early (aged, first out)
        aged = [p for p, (t, _) in mgr.evictor.keys[1].items() if t < 0]
        assert mgr.alloc.small_per_large[1] == 1  # one sliding page per large page
        for _ in aged:
            assert mgr.alloc.evict_large() in aged
        mgr.check_integrity()
        mgr.add_request("q2", article + list(range(50, 60)))
        return mgr.lookup("q2")

    assert second_hit(64) == 400  # the whole article
    assert second_hit(0) < 400  # q2's window starts below q1's: those pages had left early


def test_readded_request_reuses_block_hashes_only_when_unchanged():
    from jenga.core.manager.manager import KVCacheManager
    from jenga.core.prefix.index import extend_block_hashes, root_hash
    from jenga.core.specs import FullAttentionSpec, LayerGroup, ModelSpec

    spec = ModelSpec("m", (LayerGroup("full", FullAttentionSpec("m", "bf16", 1, 8), (0,)),), max_model_len=4096)
    mgr = KVCacheManager(spec, 1 << 20, tokens_per_page=16, fit_pages=False)

    def add(tokens, salt=None):
        """add_request; the hashes it reused from the memo, then all of them (hashing is lazy:
        lookup and append_tokens hash what they reach, jenga.core.prefix.index)."""
        mgr.add_request("r", tokens, cache_salt=salt)
        req = mgr.requests["r"]
        reused = list(req.hashes)
        mgr.hasher.hash_upto(req, len(tokens) // 16)
        return reused, list(req.hashes)

    prompt = list(range(100))
    assert add(prompt)[0] == []  # nothing hashed before a lookup needs it
    first = list(mgr.requests["r"].hashes)
    mgr.free("r")
    reused, hashes = add(prompt + [5] * 30)  # preempted, back with its generated tokens
    fresh: list[bytes] = []
    extend_block_hashes(fresh, prompt + [5] * 30, 16, root_hash(None))
    assert reused == first and hashes == fresh and fresh[:6] == first
    mgr.free("r")
    reused, hashes = add(prompt, "tenant-b")  # another salt: nothing reused
    salted: list[bytes] = []
    extend_block_hashes(salted, prompt, 16, root_hash("tenant-b"))
    assert reused == [] and hashes == salted and salted[0] != first[0]
    mgr.free("r")
    changed = [7] + prompt[1:]
    reused, hashes = add(changed)  # different tokens: nothing reused
    mine: list[bytes] = []
    extend_block_hashes(mine, changed, 16, root_hash(None))
    assert reused == [] and hashes == mine
