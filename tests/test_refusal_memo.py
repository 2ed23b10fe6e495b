"""A sure refusal of an admission, remembered with everything it read (``Admission.hit_cannot_fit``,
``refusal_key``), answers again only while that value is the same: after any change of the pool,
the protected pages, the admitted count, the request's own planning state or the question, the
answer is the one computed afresh."""

from __future__ import annotations

import random

import pytest
from conftest import full, group, make_manager, model, sliding

from jenga.core.manager.manager import KVCacheManager
from jenga.core.pagesize import with_base_page

MODELS = (model(group("full", full(), 1), max_len=512),
          model(group("full", full(), 1), group("slide", sliding(8), 2, first_layer=1), max_len=512))


def _fresh(mgr, rid, end, step) -> bool:
    """``hit_cannot_fit`` computed, not remembered."""
    adm = mgr.admission
    return adm._hit_cannot_fit(mgr.requests[rid], end, adm.admitted, step)


def _ask(mgr, rid, n, step, seen: dict) -> None:
    """Ask the memoized refusal for waiting ``rid`` and compare it with a fresh one."""
    adm, req = mgr.admission, mgr.requests[rid]
    end = req.start + n
    key = adm.refusal_key(req, end, adm.admitted, step)
    remembered = key is not None and key == req.refusal
    got = adm.hit_cannot_fit(req, end, adm.admitted, step)
    assert got == _fresh(mgr, rid, end, step), (rid, n, step, remembered)
    seen["remembered" if remembered else "computed"] += 1
    last = seen.setdefault("last", {})
    if last.get((rid, step)) and not got:
        seen["changed"] += 1  # refused before, fits now: the memo was let go of
    last[rid, step] = got


def _manager(spec, num_large: int, eviction: str, admission: str) -> KVCacheManager:
    budget = (num_large + 1) * with_base_page(spec, 2).large_page_bytes  # as conftest's make_manager
    return KVCacheManager(spec, budget, tokens_per_page=2, fit_pages=False, window_slack=0, out_of_window_age=0,
                          eviction=eviction, admission=admission)


@pytest.mark.parametrize("eviction", ["lru", "reuse"])
@pytest.mark.parametrize("admission", ["protect", "ordered"])
def test_a_remembered_refusal_answers_as_a_fresh_one_after_every_change(eviction, admission):
    seen = {"remembered": 0, "computed": 0, "changed": 0}
    for spec in MODELS:
        for seed in range(6):
            rng = random.Random(seed)
            mgr = _manager(spec, 10, eviction, admission)
            prompts = [[rng.randrange(1, 30) for _ in range(rng.randrange(4, 40))] for _ in range(5)]
            waiting, running, n = [], [], 0
            for _ in range(160):
                op = rng.random()
                if op < 0.25 and len(waiting) + len(running) < 6:
                    rid = n = n + 1
                    base = rng.choice(prompts)
                    mgr.add_request(rid, base[:rng.randrange(2, len(base) + 1)] + [rng.randrange(1, 30)
                                                                                     for _ in range(rng.randrange(0, 6))])
                    waiting.append(rid)
                elif op < 0.45 and waiting:  # the head looked up (again) and asked whether it fits
                    rid = waiting[0]
                    if rng.random() < 0.5:
                        mgr.lookup(rid, max_tokens=rng.choice([None, 0, 8]))
                    req = mgr.requests[rid]
                    left = len(req.tokens) - req.start
                    for step in (None, 4):
                        _ask(mgr, rid, left + rng.randrange(0, 3) * 8, step, seen)
                    if mgr.can_allocate(rid, left, step=4) and mgr.allocate(rid, left) is not None:
                        mgr.append_tokens(rid, [rng.randrange(1, 30)])
                        waiting.remove(rid)
                        running.append(rid)
                elif op < 0.7 and running:  # a decode step of a running request
                    rid = rng.choice(running)
                    if mgr.allocate(rid, 1) is not None:
                        mgr.append_tokens(rid, [rng.randrange(1, 30)])
                elif op < 0.8 and running:
                    rid = rng.choice(running)
                    mgr.free(rid)
                    running.remove(rid)
                elif op < 0.85 and len(waiting) > 1:  # a waiting request (maybe holding a hit) leaves
                    rid = waiting.pop(rng.randrange(1, len(waiting)))
                    mgr.free(rid)
                elif waiting:  # another waiting request looked up: the head's answer may not change
                    rid = rng.choice(waiting)
                    mgr.lookup(rid)
                for rid in waiting:
                    req = mgr.requests[rid]
                    if req.looked_up is not None:
                        _ask(mgr, rid, len(req.tokens) - req.start, 4, seen)
            mgr.check_integrity()
    assert seen["remembered"] > 50, seen  # the memo answered, and was let go of where a refusal turned
    assert seen["computed"] > 50, seen
    assert seen["changed"] > 0, seen


def test_a_refusal_is_asked_again_without_planning():
    spec = model(group("full", full(), 1), max_len=512)
    mgr = make_manager(spec, 16, tokens_per_page=2)
    mgr.add_request("a", list(range(1, 20)))
    mgr.lookup("a")
    assert mgr.allocate("a", 19) is not None
    mgr.add_request("b", list(range(40, 70)))
    mgr.lookup("b")
    mgr.check_integrity()  # anything else: the lookup's deferred hit is held (no memo while deferred)
    assert not mgr.can_allocate("b", 30, step=8)
    planned = []
    pol = mgr.policies[0]
    pol.peak_plan = lambda *a, inner=pol.peak_plan: planned.append(a) or inner(*a)
    assert not mgr.can_allocate("b", 30, step=8)
    assert not planned, "a refusal asked again with nothing changed was planned again"
    mgr.free("a")  # the pool changed: asked afresh
    assert mgr.can_allocate("b", 30, step=8)
    assert planned


def _refused(mgr, rid, end, step=None) -> bool:
    """The memoized answer for waiting ``rid``, checked against a fresh one."""
    adm = mgr.admission
    got = adm.hit_cannot_fit(mgr.requests[rid], end, adm.admitted, step)
    assert got == _fresh(mgr, rid, end, step)
    return got


def test_pages_a_running_request_frees_let_a_refused_admission_in():
    # no prefix cache: the pages a sliding window leaves go back to the free pool, nothing is
    # cached, and the running request stays admitted (only the free counts change)
    spec = model(group("slide", sliding(4), 1), max_len=512)
    mgr = make_manager(spec, 12, tokens_per_page=2, caching=False)
    mgr.add_request("r", list(range(1, 21)))
    mgr.lookup("r")
    assert mgr.allocate("r", 20) is not None  # 10 of 12 pages
    mgr.add_request("w", list(range(30, 46)))
    mgr.lookup("w")
    assert _refused(mgr, "w", 16) and _refused(mgr, "w", 16)  # 8 pages, 2 free
    mgr.append_tokens("r", [5])  # the window moves on: 8 pages free again
    assert not _refused(mgr, "w", 16)


def test_the_last_admitted_request_leaving_lets_protected_pages_go():
    # protected pages (reused at least twice) hold an admission back while another request is
    # admitted; that one holds no page, so only the admitted count changes when it leaves
    spec = model(group("full", full(), 1), max_len=512)
    mgr = make_manager(spec, 12, tokens_per_page=2, eviction="reuse")
    hot = list(range(1, 10))  # 4 full pages, cached and reused
    for i in range(3):
        mgr.add_request(("hot", i), hot)
        mgr.allocate(("hot", i), 9 - mgr.lookup(("hot", i)))
        mgr.append_tokens(("hot", i), [99])
        mgr.free(("hot", i))
    assert mgr.evictor.protected_bytes() > 0
    mgr.add_request("idle", [50, 51])
    mgr.lookup("idle")
    assert mgr.allocate("idle", 0) is not None and mgr.admission.admitted == 1
    mgr.add_request("w", list(range(60, 80)))
    mgr.lookup("w")
    mgr.check_integrity()
    assert _refused(mgr, "w", 20) and _refused(mgr, "w", 20)  # 10 pages: 8 free, 4 cached but protected
    mgr.free("idle")
    assert mgr.admission.admitted == 0
    assert not _refused(mgr, "w", 20)  # alone, it may evict them


def test_a_new_hit_on_pages_another_request_holds_lets_a_refused_admission_in():
    # the new hit's pages are held already (by the running request): only the waiting request's
    # own planning state changes
    spec = model(group("full", full(), 1), max_len=512)
    mgr = make_manager(spec, 12, tokens_per_page=2)
    prefix = list(range(1, 17))  # 8 pages
    mgr.add_request("r", prefix + [90])
    mgr.lookup("r")
    assert mgr.allocate("r", 17) is not None  # 9 pages, 3 free
    mgr.add_request("w", prefix + [91, 92])
    mgr.lookup("w", max_tokens=0)
    mgr.check_integrity()
    assert _refused(mgr, "w", 18) and _refused(mgr, "w", 18)  # 9 pages
    mgr.lookup("w")
    mgr.check_integrity()
    assert mgr.requests["w"].hit == 16
    assert not _refused(mgr, "w", 18)  # 1 page


def test_a_refusal_of_a_whole_sequence_is_not_a_refusal_of_its_steps():
    spec = model(group("slide", sliding(4), 1), max_len=512)
    mgr = make_manager(spec, 6, tokens_per_page=2)
    mgr.add_request("w", list(range(1, 21)))
    mgr.lookup("w")
    mgr.check_integrity()
    assert _refused(mgr, "w", 20) and _refused(mgr, "w", 20)  # 10 pages at once
    assert not _refused(mgr, "w", 20, step=4)  # a window and a step at a time


def test_protected_pages_passing_their_share_let_a_refused_admission_in():
    # a cached prefix reused again becomes protected (the same pages cached, the same free ones):
    # past half the pool, protected pages no longer hold admissions back
    spec = model(group("full", full(), 1), max_len=512)
    mgr = make_manager(spec, 12, tokens_per_page=2, eviction="reuse")

    def serve(rid, prompt):
        mgr.add_request(rid, prompt)
        assert mgr.allocate(rid, len(prompt) - mgr.lookup(rid)) is not None
        mgr.append_tokens(rid, [99])
        mgr.free(rid)

    a, b = list(range(1, 10)), list(range(20, 27))  # 4 and 3 cached pages
    serve("a0", a)
    serve("a1", a)
    serve("b0", b)
    page = mgr.pool.page_bytes[0]
    assert mgr.evictor.protected_bytes() == 4 * page
    mgr.add_request("idle", [50, 51])
    mgr.lookup("idle")
    assert mgr.allocate("idle", 0) is not None
    mgr.add_request("w", list(range(60, 80)))
    mgr.lookup("w")
    mgr.check_integrity()
    counts = mgr.alloc.free_counts(), mgr.evictor.supply_counts()[0]
    assert _refused(mgr, "w", 20) and _refused(mgr, "w", 20)  # 10 pages: 5 free, 7 cached, 4 of them protected
    serve("b1", b)
    assert (mgr.alloc.free_counts(), mgr.evictor.supply_counts()[0]) == counts
    assert mgr.evictor.protected_bytes() == 7 * page  # more than half the pool
    assert not _refused(mgr, "w", 20)


@pytest.mark.parametrize("eviction", ["lru", "reuse"])
def test_the_pool_counts_name_every_value_a_refusal_reads(eviction):
    # ``free_counts`` and ``supply_counts`` are keys: equal counts, equal answers, over random
    # traffic on a pool whose large pages hold several small pages of one group and one of another
    spec = model(group("full", full(), 1), group("full2", full(), 2, first_layer=1), max_len=512)
    mgr = make_manager(spec, 16, tokens_per_page=2, eviction=eviction)
    assert max(mgr.pool.small_per_large) > 1
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 20) for _ in range(rng.randrange(4, 40))] for _ in range(6)]
    answers: dict = {}
    live = []
    for i in range(400):
        rid = ("r", i)
        mgr.add_request(rid, rng.choice(prompts)[:rng.randrange(2, 40)] + [rng.randrange(1, 20)])
        n = len(mgr.requests[rid].tokens)
        if mgr.allocate(rid, n - mgr.lookup(rid)) is not None:
            mgr.append_tokens(rid, [7])
        live.append(rid)
        while live and (rng.random() < 0.5 or len(live) > 4):
            mgr.free(live.pop(rng.randrange(len(live))))
        mgr.check_integrity()
        alloc, ev = mgr.alloc, mgr.evictor
        for key, value in (((0, alloc.free_counts()), (alloc.free_bytes(), alloc.hidden_free_bytes())),
                           ((1, ev.supply_counts()), (ev.protected_supply(), ev.protected_bytes(),
                                                      [len(k) for k in ev.keys]))):
            value = repr(value)
            assert answers.setdefault(key, value) == value, key
    assert len(answers) > 40
