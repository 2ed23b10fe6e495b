"""A lookup asked again with nothing it reads changed keeps its hit and holds (the head of a
scheduler's waiting queue, looked up every step it cannot be admitted), and does exactly what
letting go of the hit and finding it again would: the same pages, the same eviction order."""

from __future__ import annotations

import copy
import random

from conftest import full, group, make_manager, model, sliding

PREFIX = list(range(1, 41))  # 40 tokens: 20 pages of 2


def _manager(eviction: str):
    spec = model(group("full", full(), 1), group("full2", full(), 1, first_layer=1))
    mgr = make_manager(spec, 72, tokens_per_page=2, eviction=eviction)
    mgr.add_request("a", PREFIX + [90, 91])
    assert mgr.lookup("a") == 0
    mgr.allocate("a", len(PREFIX) + 2)
    mgr.append_tokens("a", [92])
    mgr.free("a")  # its pages stay cached
    return mgr


def _fill_and_drain(mgr, rng: random.Random) -> list:
    """Requests of fresh prompts until the pool evicts; every page id each one got, in order."""
    got = []
    for rid in range(12):
        prompt = [rng.randrange(100, 200) for _ in range(rng.randrange(6, 20))]
        mgr.add_request(("f", rid), prompt)
        hit = mgr.lookup(("f", rid))
        t = mgr.allocate(("f", rid), len(prompt) - hit)
        got.append(None if t is None else [list(g.page_ids) for g in t.groups])
        if t is None:
            mgr.free(("f", rid))
        elif rid % 3:
            mgr.append_tokens(("f", rid), [7])
            mgr.free(("f", rid))
        mgr.check_integrity()
    return got


def test_a_lookup_asked_again_keeps_its_holds_and_changes_nothing_a_fresh_one_would_not():
    for eviction in ("lru", "reuse"):
        mgr = _manager(eviction)
        mgr.add_request("r", PREFIX[:30] + [95, 96, 97])
        first = mgr.lookup("r")
        assert first == 30
        mgr.check_integrity()  # anything else: the deferred hit is held now
        assert mgr.ledger.deferred is None and mgr.requests["r"].hit_holds
        twin = copy.deepcopy(mgr)
        unholds = []
        mgr.ledger.unhold = lambda log, inner=mgr.ledger.unhold, seen=unholds: seen.append(log) or inner(log)
        assert mgr.lookup("r") == first and not unholds, "the same lookup again let go of its hit"
        twin.requests["r"].looked_up = None  # the twin lets go and finds it again
        assert twin.lookup("r") == first
        for m in (mgr, twin):
            m.check_integrity()
        tables = [m.allocate("r", 3) for m in (mgr, twin)]
        assert [list(g.page_ids) for g in tables[0].groups] == [list(g.page_ids) for g in tables[1].groups]
        assert _fill_and_drain(mgr, random.Random(3)) == _fill_and_drain(twin, random.Random(3)), eviction
        assert mgr.stats().evicted_pages > 0, "nothing evicted: the eviction order went unchecked"


def test_a_lookup_after_the_index_changed_finds_the_new_hit():
    mgr = _manager("lru")
    prompt = PREFIX + [50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60]
    mgr.add_request("r", prompt)
    assert mgr.lookup("r") == len(PREFIX)
    mgr.add_request("b", prompt[:-1])  # computes further along the same prompt: new pages join the index
    mgr.lookup("b")
    mgr.allocate("b", len(prompt) - 1 - len(PREFIX))
    mgr.append_tokens("b", [1])
    twin = copy.deepcopy(mgr)
    twin.requests["r"].looked_up = None
    fresh = twin.lookup("r")
    assert fresh > len(PREFIX)
    assert mgr.lookup("r") == fresh, "a lookup after the index changed kept the old hit"
    mgr.check_integrity()


def test_a_lookup_after_moving_its_junction_checkpoint_puts_it_back():
    mgr = _manager("lru")
    mgr.add_request("r", PREFIX[:30] + [95, 96, 97])
    hit = mgr.lookup("r")
    req = mgr.requests["r"]
    req.junction_checkpoint = 0  # as move_junction_checkpoint leaves it
    assert mgr.lookup("r") == hit and req.junction_checkpoint is None


def test_waiting_requests_hits_are_let_go_of_but_the_one_kept():
    """``release_waiting_hits``: the hits of requests looked up and not allocated are let go of (their
    pages cached again, evictable), but ``keep``'s and an allocated request's; a new lookup finds them."""
    mgr = make_manager(model(group("full", full(), 1)), 16, tokens_per_page=2)
    prefix = list(range(8))
    mgr.add_request("a", prefix + [50])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.append_tokens("a", [1])
    mgr.free("a")
    for rid in ("b", "c", "d"):
        mgr.add_request(rid, prefix + [60 + len(rid)])
        assert mgr.lookup(rid) == 8
    mgr.allocate("d", 1)
    cached = mgr.stats().cached_bytes
    assert mgr.release_waiting_hits(keep="b") == 1  # c's; d is allocated, b kept
    assert (mgr.requests["b"].hit, mgr.requests["c"].hit) == (8, 0)
    mgr.check_integrity()
    assert mgr.stats().cached_bytes == cached  # c's pages are also held by b and d: still not evictable
    assert mgr.release_waiting_hits() == 1  # b's
    mgr.check_integrity()
    assert mgr.lookup("c") == 8


def test_the_newest_waiting_hits_that_read_their_whole_prefix_come_first():
    """``waiting_hits(whole_prefix=True)`` (what the vLLM adapter lets go of, one at a time, before
    vLLM preempts a running request): the waiting hits whose next token reads every token before
    it, the latest added first.  A sliding-window hit past its window is left out (it resumes from
    the window: losing its last pages loses the whole hit); ``release_waiting_hits`` takes all."""
    mgr = make_manager(model(group("sliding", sliding(6), 1), group("full", full(), 1, first_layer=1)), 24,
                       tokens_per_page=2)
    prefix = list(range(1, 13))
    mgr.add_request("a", prefix + [50])
    mgr.lookup("a")
    mgr.allocate("a", 13)
    mgr.append_tokens("a", [1])
    mgr.free("a")
    for rid, n in (("s", 4), ("l", 10), ("m", 4)):
        mgr.add_request(rid, prefix[:n] + [60, 61])
        assert mgr.lookup(rid) == n
    hits = lambda: [mgr.requests[r].hit for r in ("s", "l", "m")]  # noqa: E731
    assert hits() == [4, 10, 4]
    assert mgr.waiting_hits() == ["m", "l", "s"]
    assert mgr.waiting_hits(whole_prefix=True) == ["m", "s"]  # l is newer than s but reads from its window only
    mgr.shrink_hit("m", 0)
    assert hits() == [4, 10, 0]
    mgr.check_integrity()
    assert mgr.waiting_hits(whole_prefix=True) == ["s"]
    mgr.shrink_hit("s", 0)
    assert hits() == [0, 10, 0]
    assert mgr.waiting_hits(whole_prefix=True) == []
    assert mgr.release_waiting_hits() == 1  # any kind: l
    assert hits() == [0, 0, 0]
    mgr.check_integrity()
