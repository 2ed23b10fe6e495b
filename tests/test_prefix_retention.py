"""Prefix retention for partial-memory kinds: Mamba checkpoints at the prompt end and at
shared-prefix junctions, and the sliding window before a shared prefix kept at full priority."""

from __future__ import annotations

from conftest import (
    cached_keys,
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
)

from jenga.core.evict.evictor import PROTECTED

P = list(range(10))  # a shared prefix


def hybrid(every: int = 8):
    return model(group("full", full(), 1), group("mamba", mamba(every), 1, first_layer=1))


def test_junction_checkpoint_lets_the_third_request_hit_the_whole_shared_prefix():
    mgr = make_manager(hybrid(8), 64)
    serve(mgr, "a", P + [100, 101, 102, 103, 104], [1])  # checkpoints: 8 (periodic), 15 (prompt end)
    assert sorted(-k[1] for k in cached_keys(mgr, 1).values()) == [8, 15]
    mgr.add_request("b", P + [200, 201, 202, 203])
    assert mgr.lookup("b") == 8  # full attention could hit 10: the junction
    assert mgr.requests["b"].junction == 10
    t = mgr.allocate("b", 6)
    assert sorted(t.groups[1].checkpoints) == [10]  # the junction; prompt end 14 ends the step: the work page
    mgr.append_tokens("b", [2])
    mgr.free("b")
    assert sorted(-k[1] for k in cached_keys(mgr, 1).values()) == [8, 10, 14, 15]
    at = {-k[1]: p for p, k in cached_keys(mgr, 1).items()}
    mgr.add_request("c", P + [300, 301])
    assert mgr.lookup("c") == 10
    t = mgr.allocate("c", 2)
    assert t.groups[1].read_page == at[10]
    assert t.groups[0].page_ids[:10] == list(range(10))
    mgr.check_integrity()


def test_prompt_shorter_than_the_interval_hits_its_prefix():
    mgr = make_manager(hybrid(512), 64)
    serve(mgr, "a", P + [100], [1])
    serve(mgr, "b", P + [200], [2])  # misses (state only at 11), checkpoints the junction 10
    mgr.add_request("c", P + [300])
    assert mgr.lookup("c") == 10
    mgr.add_request("d", P + [100, 7])
    assert mgr.lookup("d") == 11  # a's prompt end
    mgr.check_integrity()


def full_swa(window: int):
    return model(group("full", full(), 1), group("swa", sliding(window), 1, first_layer=1))


def test_window_before_a_hit_is_released_at_full_priority():
    age = 1000
    mgr = make_manager(full_swa(4), 64, out_of_window_age=age)
    mgr.add_request("a", P + [100, 101, 102, 103, 104, 105])
    win = list(mgr.allocate("a", 16).groups[1].page_ids)
    mgr.append_tokens("a", [1])
    mgr.free("a")
    keys = cached_keys(mgr, 1)
    assert all(keys[win[i]][0] < 0 for i in range(0, 13))  # a knew no shared prefix: all aged
    mgr.add_request("b", P + [200, 201, 202, 203, 204])
    assert mgr.lookup("b") == 10
    run(mgr, "b", 5, [2])  # computed 15: tokens 0..11 left the window
    now = mgr.now
    keys = cached_keys(mgr, 1)
    # the window of the hit (tokens 7, 8, 9) at the current time, b's own token 10, 11 aged
    assert [keys[win[i]] for i in (7, 8, 9)] == [(now, -8), (now, -9), (now, -10)]
    mine = page_ids(mgr, "b", 1)
    assert mine[10] is None and mine[:12] == [None] * 12
    assert all(k[0] == now - age for p, k in keys.items() if p not in win)
    mgr.check_integrity()


def test_window_before_the_junction_is_kept_when_the_hit_failed():
    age = 1000
    mgr = make_manager(full_swa(4), 64, out_of_window_age=age)
    serve(mgr, "a", P + [100, 101, 102, 103, 104, 105], [1])
    for p in list(cached_keys(mgr, 1)):  # evict a's whole sliding window history
        evict_page(mgr, 1, p)
    mgr.add_request("b", P + [200, 201, 202, 203, 204])
    assert mgr.lookup("b") == 0 and mgr.requests["b"].junction == 10
    run(mgr, "b", 15, [2])
    now = mgr.now
    keys = cached_keys(mgr, 1)
    assert sorted(-k[1] for k in keys.values() if k[0] == now) == [8, 9, 10]  # pages 7..9: keep_from(10) = 7
    mgr.free("b")
    mgr.add_request("c", P + [300])
    assert mgr.lookup("c") == 10
    mgr.check_integrity()


def test_long_prompt_keeps_tail_checkpoints_one_two_four_blocks_before_its_end():
    mgr = make_manager(hybrid(8), 256)
    doc = list(range(1000, 1066))  # 66 tokens: a prompt of >= 8 intervals gets tail checkpoints
    serve(mgr, "a", doc + [1, 2, 3, 4], [5])  # prompt end 70: tail at 69, 68, 66
    # a long prompt keeps only the last periodic checkpoint of each step (one step here: 64)
    assert sorted(-k[1] for k in cached_keys(mgr, 1).values()) == [64, 66, 68, 69, 70]
    mgr.add_request("b", doc + [7, 7, 7, 7])
    assert mgr.lookup("b") == 66  # the second question resumes at the document's end
    mgr.free("b")
    before = set(cached_keys(mgr, 1))
    serve(mgr, "c", list(range(2000, 2030)), [1])  # 30 tokens < 8 intervals: periodic and end only
    assert sorted(-k[1] for p, k in cached_keys(mgr, 1).items() if p not in before) == [8, 16, 24, 30]
    mgr.check_integrity()


def test_tail_checkpoints_only_where_the_uncached_part_of_the_prompt_is_long():
    """Tails serve a later prompt branching shortly before this one's end inside a long new
    part (another question on a document nobody asked about yet).  A long prompt that continues
    a cached prefix with a short new part (the next turn of a conversation) gets its branch
    points only; a long new part after a cached prefix (a system prompt) keeps its tails."""
    mgr = make_manager(hybrid(8), 256)
    doc = list(range(1000, 1066))

    def new_checkpoints(rid, prompt) -> tuple[int, list[int]]:
        before = set(cached_keys(mgr, 1))
        hit = serve(mgr, rid, prompt, [5])
        return hit, sorted(-k[1] for p, k in cached_keys(mgr, 1).items() if p not in before)

    assert new_checkpoints("a", doc + [1, 2, 3, 4]) == (0, [64, 66, 68, 69, 70])
    # the next turn: 11 new tokens after a's prompt-end checkpoint 70; the step's last periodic
    # checkpoint 80 and the prompt end 81 (tails 77, 79 before this rule)
    assert new_checkpoints("b", doc + [1, 2, 3, 4, 5] + [9] * 10) == (70, [80, 81])
    system = list(range(3000, 3010))
    assert new_checkpoints("s", system + [1]) == (0, [8, 11])
    # 66 new tokens after the junction 10: periodic 72, tails 74, 75 (72 is both), the end 76
    assert new_checkpoints("c", system + list(range(4000, 4066))) == (8, [10, 72, 74, 75, 76])
    mgr.check_integrity()


def test_periodic_checkpoints_of_a_prompt_go_first_its_branch_points_stay():
    mgr = make_manager(hybrid(8), 64, out_of_window_age=1000)
    serve(mgr, "a", P + [100, 101, 102, 103, 104], [1])  # periodic 8, prompt end 15
    times = {-k[1]: k[0] for k in cached_keys(mgr, 1).values()}
    assert sorted(times) == [8, 15]
    assert times[8] < 0 < times[15]  # 8 is released aged (evicted before any other cached page)
    mgr.add_request("b", P + [200, 201, 202, 203])
    assert mgr.lookup("b") == 8  # still a valid hit while it lasts
    mgr.free("b")
    mgr.check_integrity()


def test_band_below_the_prompt_end_window_is_released_at_full_priority_not_held():
    """``window_slack`` tokens below the prompt end's window leave the request (they are not
    held: no waste) but enter the cache with the current time, not aged: a second question on
    the same prefix, ending earlier, still finds its whole window after the aged pages went."""
    age = 1000

    def first_question(slack: int):
        mgr = make_manager(full_swa(4), 64, out_of_window_age=age, window_slack=slack)
        mgr.add_request("a", P + [100, 101, 102])  # prompt end 13: its window is tokens 10..12
        win = list(mgr.allocate("a", 13).groups[1].page_ids)
        mgr.append_tokens("a", [1])
        times = [mgr.now]
        for tok in (2, 3, 4, 5):  # computed 14..17: tokens 10, 11, 12, 13 leave the window
            run(mgr, "a", 1, [tok])
            times.append(mgr.now)
        return mgr, win, times

    mgr, win, times = first_question(3)
    keys, held = cached_keys(mgr, 1), page_ids(mgr, "a", 1)
    assert held[:14] == [None] * 14  # nothing below the window is held
    # pages 0..6 aged; 7..9 (the band: the window of a prompt ending up to 3 tokens earlier)
    # and 10..12 (the prompt end's window, released one per decode step) with the time they
    # left (plain LRU reads ``UNTIL_FREE + now`` as now); 13 (an output token) aged
    assert [keys[win[i]] for i in range(13)] == [(times[0] - age, -(i + 1)) for i in range(7)] + \
        [(times[0], -(i + 1)) for i in range(7, 10)] + [(times[i - 9], -(i + 1)) for i in range(10, 13)]
    assert all(k[0] == times[4] - age for p, k in keys.items() if p not in win)  # token 13's page
    mgr.free("a")
    mgr.check_integrity()
    # at free the retained window takes the request's last access, like the pages it held
    keys = cached_keys(mgr, 1)
    assert [keys[win[i]] for i in range(13)] == \
        [(times[0] - age, -(i + 1)) for i in range(7)] + [(times[4], -(i + 1)) for i in range(7, 13)]

    def second_hit(mgr) -> int:
        aged = [p for p, (t, _) in cached_keys(mgr, 1).items() if t < 0]
        for _ in aged:  # memory pressure takes exactly the aged pages first
            assert mgr.alloc.evict_large() in aged
        mgr.add_request("b", P + [200])
        return mgr.lookup("b")

    assert second_hit(mgr) == 10  # the whole prefix: its window 7..9 stayed
    assert second_hit(first_question(0)[0]) == 0  # without the band those pages were aged


def test_one_state_page_per_step_periodic_only_where_it_can_pay():
    """Exact pages: a short prompt nothing of which is cached checkpoints every interval; the
    checkpoint its step ends on (16, also its prompt end) is the work page itself.  A short
    prompt continuing a cached prefix gets its junction only (no periodic 12, 16); its hit's
    checkpoint is let go of (cached, unreferenced) as soon as its step is allocated."""
    mgr = make_manager(hybrid(4), 64)
    mgr.add_request("a", P + [100, 101, 102, 103, 104, 105])
    assert mgr.lookup("a") == 0
    st = mgr.allocate("a", 16).groups[1]
    assert (st.work_page, st.read_page, st.checkpoints) == (16, None, {4: 17, 8: 18, 12: 19})
    mgr.append_tokens("a", [1])
    assert (st.work_page, st.read_page) == (16, 16) and mgr.index.is_registered(1, 16)
    mgr.free("a")
    assert sorted((-k[1], p) for p, k in cached_keys(mgr, 1).items()) == [(4, 17), (8, 18), (12, 19), (16, 16)]
    mgr.add_request("b", P + list(range(200, 210)))
    assert mgr.lookup("b") == 8 and mgr.requests["b"].junction == 10
    st = mgr.allocate("b", 12).groups[1]
    # the attention group shares a's cached pages up to the junction 10 (tokens 8, 9 are
    # recomputed for the state only, jenga.core.manager.junction): one fresh attention page fewer
    assert (st.work_page, st.read_page, st.checkpoints) == (30, 18, {10: 31})
    assert mgr.ref[1][18] == 0 and cached_keys(mgr, 1)[18] == (2, -8)  # let go of, at full priority
    mgr.check_integrity()
    mgr.append_tokens("b", [2])
    mgr.free("b")
    assert sorted((-k[1], p) for p, k in cached_keys(mgr, 1).items()) == \
        [(4, 17), (8, 18), (10, 31), (12, 19), (16, 16), (20, 30)]
    mgr.check_integrity()


def test_long_prompt_checkpoints_the_last_periodic_position_of_each_step():
    mgr = make_manager(hybrid(8), 256)
    mgr.add_request("c", list(range(1000, 1066)) + [1, 2, 3, 4])  # 70 tokens >= 8 intervals
    mgr.lookup("c")
    got = []
    for n in (30, 30, 10):
        got.append(dict(mgr.allocate("c", n).groups[1].checkpoints))
        mgr.append_tokens("c", [5] if n == 10 else [])
    # steps [0, 30), [30, 60), [60, 70): periodic 24, 56, 64; tails 66, 68, 69; the end 70 ends the step
    assert got == [{24: 31}, {56: 62}, {64: 73, 66: 74, 68: 75, 69: 76}]
    mgr.free("c")
    assert sorted(-k[1] for k in cached_keys(mgr, 1).values()) == [24, 56, 64, 66, 68, 69, 70]
    mgr.check_integrity()


def test_a_prefix_and_its_retained_window_are_evicted_together():
    """After the free, the prompt end's window (released while the request decoded) carries
    the request's last access like its full-attention pages: the aligned order then takes
    both groups' pages of one prefix length together, the longest first, so the window is
    never gone while the full-attention pages it makes usable stay."""
    mgr = make_manager(full_swa(4), 64, out_of_window_age=1000, window_slack=3)
    serve(mgr, "a", P + [100, 101, 102], [1, 2, 3, 4, 5])  # computed 17 when freed
    assert all(mgr.alloc.small_per_large[g] == 1 for g in (0, 1))
    before = {(g, p): k for g in (0, 1) for p, k in cached_keys(mgr, g).items()}
    order = []
    while (large := mgr.alloc.evict_large()) is not None:
        gone = [gp for gp in before if gp[1] == large and gp[1] not in cached_keys(mgr, gp[0])]
        assert len(gone) == 1
        order.append((gone[0][0], -before[gone[0]][1]))
        before.pop(gone[0])
    aged = [(1, plen) for plen in range(7, 0, -1)] + [(1, 14)]  # out-of-window pages first, oldest first
    assert order[:len(aged)] == aged
    rest = order[len(aged):]  # then one time for everything else: longest prefix first, full group first
    assert rest == [(0, 17), (1, 17), (0, 16), (1, 16), (0, 15), (1, 15), (0, 14)] + \
        [(g, plen) for plen in range(13, 7, -1) for g in (0, 1)] + [(0, plen) for plen in range(7, 0, -1)]



def test_window_of_a_held_prefix_outlives_every_other_reused_page():
    """Reuse order: a request decoding on a reused prefix lets the window before its hit go
    (released at ``UNTIL_FREE + now``) while it still holds that prefix.  Class 3 evicts the
    newest first, so that window must not count as new (it went first: the prefix, cached at
    the free, hit nothing after) nor carry an older time (then every prefix cached since stayed
    longer); it goes after every other reused page, and at the free takes the request's time."""
    mgr = make_manager(full_swa(4), 64, out_of_window_age=1000, eviction="reuse")
    c, y = list(range(300, 310)), list(range(500, 510))
    serve(mgr, "c0", c + [1], [1])
    serve(mgr, "y1", y + [2], [1])
    serve(mgr, "y2", y + [3], [1])  # y's prefix: reused, class 3 (pages 22..31, window 40..42)
    mgr.add_request("c", c + [4, 5, 6])
    assert mgr.lookup("c") == 10
    mgr.allocate("c", 3)
    mgr.append_tokens("c", [7])
    for tok in (8, 9):  # computed 15: the window of the hit (tokens 7..9, pages 18..20) left
        run(mgr, "c", 1, [tok])
    assert page_ids(mgr, "c", 1)[:12] == [None] * 12 and page_ids(mgr, "c", 0)[:10] == list(range(10))
    keys = cached_keys(mgr, 1)
    assert [keys[p][0] for p in (18, 19, 20)] == [PROTECTED] * 3
    order = []
    while (large := mgr.alloc.evict_large()) is not None:
        order.append(large)  # every group has one page per large page: the page ids
    # aged pages (c0's, then y1's), one-off pages (prompt tails, outputs) LRU; then y's reused
    # prefix (full and window aligned, longest first); c's hit window last
    assert order == list(range(17, 10, -1)) + list(range(39, 32, -1)) + [10, 21, 32, 43, 44, 45, 49, 50] + \
        [31, 42, 30, 41, 29, 40] + list(range(28, 21, -1)) + [20, 19, 18]
    mgr.check_integrity()


def test_a_conversations_earlier_windows_go_before_its_newest_tail():
    """A chat growing by turns: each turn hits the previous one's whole sequence.  The windows
    before the earlier turns' branch points (turn 2's hit at 11, its prompt end, turn 1's end)
    are aged by turn 3's hit past them, so they leave right after the pages that left the window
    and before turn 3's tail, the window the next turn needs.  (They used to be kept as reused
    pages, after every other page, the full-attention prefix included.)"""
    mgr = make_manager(full_swa(4), 64, out_of_window_age=1000, eviction="reuse")
    t1 = list(range(100, 110))
    t2 = t1 + [1, 2, 200, 201, 202]
    t3 = t2 + [3, 4, 300, 301, 302]
    assert serve(mgr, "t1", t1, [1, 2]) == 0
    assert serve(mgr, "t2", t2, [3, 4]) == 11
    assert serve(mgr, "t3", t3, [5, 6]) == 16
    end = [{p: -k[1] for p, k in cached_keys(mgr, g).items()} for g in (0, 1)]
    order = []
    while (large := mgr.alloc.evict_large()) is not None:  # one page per large page: page ids
        order.append(("swa", end[1][large]) if large in end[1] else ("full", end[0][large]))
        mgr.check_integrity()
    swa = [e for g, e in order if g == "swa"]
    # aged (out of the window), then the earlier turns' windows (8..13), the newest tail (17..21)
    # aligned with the full prefix, the hit window at 16 (14..16), the full prefix last
    assert swa == [7, 6, 5, 4, 3, 2, 1, 8, 12, 13, 11, 10, 9, 17, 21, 20, 19, 18, 16, 15, 14]
    assert order[14:] == [("full", 21), ("swa", 21), ("full", 20), ("swa", 20), ("full", 19), ("swa", 19),
                          ("full", 18), ("swa", 18), ("full", 17), ("full", 16), ("swa", 16), ("full", 15),
                          ("swa", 15), ("full", 14), ("swa", 14)] + [("full", e) for e in range(13, 0, -1)]


def test_the_window_before_a_branch_point_two_requests_hit_is_not_aged_by_a_deeper_hit():
    """RAG prompts: a system prompt, then retrieved chunks.  Many requests leave the system prompt
    at its end (all hit there: the window before it has ``SHARED_BRANCH_USES`` uses); one more
    continues the first one's chunk, past that window.  The window stays where the free left it (the
    request's last access), not aged to go first: the next prompt with a new first chunk needs it, as
    the chain of a conversation's turns (one hit each,
    ``test_a_conversations_earlier_windows_go_before_its_newest_tail``) and an article asked a few
    questions do not."""
    from jenga.core.policy.token import SlidingPolicy

    mgr = make_manager(full_swa(4), 256, out_of_window_age=1000, eviction="reuse")
    s = list(range(100, 110))  # the system prompt; its window: tokens 6..9, swa pages at ends 7..10
    a = s + list(range(200, 206))
    assert serve(mgr, "r1", a + [1], [1]) == 0
    for i in range(SlidingPolicy.SHARED_BRANCH_USES - 1):  # the compute above and these hits
        assert serve(mgr, f"b{i}", s + list(range(300 + 10 * i, 306 + 10 * i)), [1]) == 10
    end = {p: -k[1] for p, k in cached_keys(mgr, 1).items()}
    window = sorted(p for p, e in end.items() if 7 <= e <= 10)
    before = {p: cached_keys(mgr, 1)[p][0] for p in window}
    mgr.add_request("r4", a + [2, 3])
    assert mgr.lookup("r4") == 16  # past the system prompt's window
    after = {p: cached_keys(mgr, 1)[p][0] for p in window}
    assert len(window) == 4 and after == before, (before, after)
    mgr.check_integrity()
