"""The next-use predictor (``jenga.core.prefix.next_use``) and the evictor it drives
(``eviction="predict"``): pages a live request will read are protected whatever their use
count; reused pages with no live user are protected only while departed prefixes have tended
to return."""

from __future__ import annotations

import pytest
from conftest import cached_keys, full, group, make_manager, model, serve

import jenga.core.manager.manager as manager_module
from jenga.core.evict.evictor import PROTECTED
from jenga.core.evict.predicted import DEPARTED, PredictedOptions
from jenga.core.prefix.next_use import NextUse
from jenga.errors import InvalidArgumentError


def test_return_rate_counts_departures_and_returns_per_block():
    nu = NextUse()
    assert nu.return_rate == 0.5 and nu.keeps_departed()  # no evidence: keep, as the reuse evictor does
    nu.arrive("a", [b"p", b"q"])
    nu.arrive("b", [b"p", b"r"])
    assert nu.live == {b"p": 2, b"q": 1, b"r": 1}
    nu.admitted("a")  # running: no future use of what it passes
    assert nu.live == {b"p": 1, b"r": 1}
    nu.leave("a")
    assert nu.departures == 1  # q; b still holds p
    nu.leave("b")
    assert nu.live == {} and nu.departures == 3
    nu.arrive("c", [b"p", b"s"])  # p comes back, s is new
    assert nu.returns == 1
    nu.leave("c")
    assert (nu.returns, nu.departures) == (1, 5) and nu.return_rate == 2 / 7 and not nu.keeps_departed()
    nu.leave("c")  # twice, or never arrived: nothing
    nu.arrive("e", [])
    assert nu.live == {}


def test_a_preempted_request_waits_again():
    nu = NextUse()
    nu.arrive("a", [b"p"])
    nu.admitted("a")
    assert nu.live == {}
    nu.arrive("a", [b"p", b"q"])  # preempted: its prompt's hashes as held, counted once
    assert nu.live == {b"p": 1} and nu.departures == 0
    nu.arrive("a", [b"p"])
    assert nu.live == {b"p": 1}


def _pages(mgr, pages):
    return [mgr.index.keys[0][p] for p in pages]


def test_reused_pages_of_a_departed_prefix_are_kept_only_while_departed_prefixes_return():
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict")
    nu = mgr.evictor.next_use
    serve(mgr, "x", [1, 2, 3], [0])  # pages 0, 1, 2; released at time 1
    serve(mgr, "x2", [1, 2, 4], [0])  # hits 0, 1: reused; the prior return rate keeps them
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    assert cached_keys(mgr, 0)[0] == (PROTECTED - DEPARTED - 2, -1)
    for i in range(3):  # three blocks departed, none came back
        nu.arrive(f"d{i}", [bytes([i])])
        nu.leave(f"d{i}")
    serve(mgr, "x3", [1, 2, 5], [0])
    assert sorted(mgr.evictor.protected[0]) == []  # LRU with the one-off pages now
    assert cached_keys(mgr, 0)[0] == (3, -1)
    mgr.check_integrity()


def test_a_page_a_live_request_will_read_is_protected_at_one_use_and_outlives_the_rest():
    # reused pages only kept on the return rate: x's one-off page stays LRU (pages used once: below)
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                       eviction_options=PredictedOptions(used_once=False))
    nu = mgr.evictor.next_use
    serve(mgr, "x", [1, 2, 3], [0], free=False)
    nu.arrive("waiting", _pages(mgr, [0, 1]))  # a queued request starting with x's first two pages
    mgr.free("x")
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    assert cached_keys(mgr, 0)[0] == (PROTECTED - 1, -1) and cached_keys(mgr, 0)[2] == (1, -3)
    serve(mgr, "y", [7, 8], [0])  # pages 3, 4, one-off
    mgr.add_request("z", [20, 21, 22, 23, 24, 25, 26])  # 7 pages: 3 free, then one-off, then the protected
    assert mgr.lookup("z") == 0
    assert mgr.allocate("z", 7).groups[0].page_ids == [5, 6, 7, 2, 4, 3, 1]  # alone, it may take one
    mgr.check_integrity()


def test_the_reuse_order_is_unchanged_without_a_predictor_fed():
    keys = {}
    for ev in ("reuse", "predict"):
        mgr = make_manager(model(group("full", full(), 1)), 8, eviction=ev)
        hits = [serve(mgr, f"a{a}q{r}", [10 * a, 10 * a + 1, 10 * a + 2, 100 + 10 * r + a], [1])
                for r in range(4) for a in range(4)]
        keys[ev] = hits
    assert keys["predict"] == keys["reuse"]


def test_without_hold_live_a_queued_readers_pages_are_evicted_last_but_hold_no_admission_back():
    nu = NextUse()  # the scheduler serves queued hits first
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                       eviction_options=PredictedOptions(nu, hold_live=False, used_once=False))
    serve(mgr, "x", [1, 2, 3], [0], free=False)
    nu.arrive("waiting", _pages(mgr, [0, 1]))
    mgr.free("x")
    assert sorted(mgr.evictor.protected[0]) == []  # no hold
    assert cached_keys(mgr, 0)[0] == (PROTECTED - 1, -1)  # still last to go
    mgr.check_integrity()


def test_a_reused_page_whose_prefix_a_running_request_holds_is_no_departed_prefix():
    """Class 3 keeps departed prefixes on the learned return rate.  A page released while a request
    the scheduler runs still holds its block (a Mamba checkpoint that request passed) has not
    departed and is no future use of it: it is not protected, and holds no admission back (Falcon-H1-7B
    RAG prompts at a quarter of the H100 budget: such a 1,568-token page, protected at the first
    releases under the prior rate, held admissions back, p99 TTFT 1.7 s against vLLM-best's 0.6 s).
    Once the prefix departs, the same page is kept as before (reused pages only: x's one-off pages
    stay LRU; pages used once are the next test's)."""
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                       eviction_options=PredictedOptions(used_once=False))
    nu = mgr.evictor.next_use
    serve(mgr, "x", [1, 2, 3], [0])
    keys = _pages(mgr, [0, 1])
    nu.arrive("r", keys)
    nu.admitted("r")  # running, holding x's first two blocks
    serve(mgr, "x2", [1, 2, 4], [0])  # hits pages 0, 1: reused, released while r runs
    assert sorted(mgr.evictor.protected[0]) == [] and nu.keeps_departed()
    nu.leave("r")  # departed (2 departures) ...
    nu.arrive("s", keys)  # ... and came back (2 returns): rate 3 / 6 keeps departed prefixes
    nu.leave("s")
    serve(mgr, "x3", [1, 2, 5], [0])
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.check_integrity()


def test_pages_used_once_are_kept_where_a_scheduler_feeds_the_predictor():
    """A chat's next turn reads what its previous turn wrote once.  Fed nothing (no departure is
    ever seen, the prior would keep every page), the predictor keeps reused pages only, as the reuse
    evictor did; fed, pages used once of a departed prefix are kept too on the same return rate
    (class 3, protected), and ``used_once=False`` keeps reused pages only."""
    def run(used_once: bool, fed: bool):
        nu = NextUse()
        mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                           eviction_options=PredictedOptions(nu, used_once=used_once))
        serve(mgr, "t1", [1, 2, 3], [0])  # turn 1: pages 0, 1, 2, used once
        assert sorted(mgr.evictor.protected[0]) == []
        if fed:  # (else fed nothing: the prior rate, one in two, keeps departed prefixes)
            nu.arrive("t1", _pages(mgr, [0, 1, 2]))
            nu.leave("t1")  # its prefix departed (3 departures) ...
            nu.arrive("t2", _pages(mgr, [0, 1, 2]))  # ... and the next turn came back (3 returns)
            nu.admitted("t2")
            nu.leave("t2")  # and departed again (6 departures): rate 4 / 8 keeps departed prefixes
        assert nu.keeps_departed() and nu.keeps_used_once() is fed
        serve(mgr, "t3", [1, 2, 3, 4, 5], [0])  # hits 0-2 (reused now); pages 3, 4 written once
        protected = sorted(mgr.evictor.protected[0])
        classes = mgr.evictor.classes(0, [3, 4])
        mgr.check_integrity()
        return protected, classes

    assert run(True, False) == ([0, 1, 2], [0, 0])  # fed nothing: the prior keeps reused pages only
    assert run(True, True) == ([0, 1, 2, 3, 4], [3, 3])
    assert run(False, True) == ([0, 1, 2], [0, 0])


def test_a_held_prefixs_reused_page_is_protected_when_its_miss_costs_more_than_a_step():
    """A reused page whose block a running request still holds (a Mamba checkpoint it resumed from)
    keeps that whole prefix reusable: with the scheduler's step budget known (``step_tokens``) it is
    protected when it ends past that budget (a miss there costs its reader steps more; Falcon-H1-7B
    articles at a quarter of the H100 budget: 0.87x -> 1.36x vLLM-best), not when a miss fits one step."""
    nu = NextUse()
    mgr = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                       eviction_options=PredictedOptions(nu, step_tokens=1, used_once=False))
    serve(mgr, "x", [1, 2, 3], [0])
    nu.arrive("r", _pages(mgr, [0, 1]))
    nu.admitted("r")  # running, holding x's first two blocks
    serve(mgr, "x2", [1, 2, 4], [0])  # hits pages 0 (ends at token 1) and 1 (at 2) while r runs
    assert sorted(mgr.evictor.protected[0]) == [1]
    assert cached_keys(mgr, 0)[1][0] == PROTECTED - DEPARTED - 2 and cached_keys(mgr, 0)[0][0] == 2
    mgr.check_integrity()


def test_the_options_reach_the_evictor_as_it_is_built():
    """A scheduler's predictor, admission order and step budget are handed in with the manager
    (``eviction_options``); nothing is set on the evictor afterwards."""
    nu = NextUse()
    ev = make_manager(model(group("full", full(), 1)), 8, eviction="predict",
                      eviction_options=PredictedOptions(nu, hold_live=False, step_tokens=64)).evictor
    assert ev.next_use is nu and ev.hold_live is False and ev.step_tokens == 64 and ev.used_once is True
    plain = make_manager(model(group("full", full(), 1)), 8, eviction="predict").evictor  # the defaults
    assert plain.next_use is not nu and plain.hold_live is True and plain.step_tokens is None


@pytest.mark.parametrize("eviction, options, problem", [
    ("reuse", PredictedOptions(), "eviction 'reuse' takes no options, got PredictedOptions"),
    ("lru", PredictedOptions(), "eviction 'lru' takes no options"),
    ("predict", {"hold_live": False}, "eviction 'predict' takes PredictedOptions options, got dict"),
])
def test_options_another_order_takes_are_refused_before_anything_is_built(monkeypatch, eviction, options, problem):
    def built(*args, **kwargs):
        raise AssertionError("the parts were built")

    monkeypatch.setattr(manager_module, "build_parts", built)
    with pytest.raises(InvalidArgumentError, match=problem):
        make_manager(model(group("full", full(), 1)), 8, eviction=eviction, eviction_options=options)


@pytest.mark.parametrize("fields, problem", [
    (dict(hold_live="no"), "hold_live must be a bool"),
    (dict(hold_live=1), "hold_live must be a bool"),
    (dict(used_once="yes"), "used_once must be a bool"),
    (dict(step_tokens=0), "step_tokens must be >= 1"),
    (dict(step_tokens=2.5), "step_tokens must be an int"),
    (dict(next_use={}), "next_use must be a NextUse, got dict"),
])
def test_bad_options_are_refused_with_the_field_named(fields, problem):
    with pytest.raises(InvalidArgumentError, match=problem):
        PredictedOptions(**fields)
    assert PredictedOptions(step_tokens=8192).step_tokens == 8192
