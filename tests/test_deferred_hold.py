"""The deferred hold's shortcut refuses only allocations that holding the hit first would refuse."""

from __future__ import annotations

import copy
import random

from conftest import full, group, make_manager, model, sliding

from jenga.core.manager.manager import KVCacheManager


def _checked(mgr: KVCacheManager, seen: list) -> None:
    """Wrap ``Admission.hit_cannot_fit``: whenever it refuses, a copy that holds the hit and plans
    the same allocation exactly must find no quota either."""
    inner = mgr.admission.hit_cannot_fit

    def hit_cannot_fit(req, end, allocated, step=None):
        refused = inner(req, end, allocated, step)
        if refused:
            twin = copy.deepcopy(mgr)
            treq = twin.requests[req.request_id]
            twin.ledger.settle()
            need, _log = twin.admission.plan(treq, end, list(zip(twin.policies, treq.groups, strict=True)), step)
            assert twin.admission.quota_of(treq, need, end, allocated) is None, "pre-check refused an allocation that fits"
            seen.append((req.request_id, step))
        return refused

    mgr.admission.hit_cannot_fit = hit_cannot_fit


def test_precheck_refuses_only_what_the_exact_check_refuses():
    spec = model(group("full", full(), 1), group("swa", sliding(8), 1, first_layer=1))
    rng = random.Random(7)
    for eviction in ("reuse", "lru"):
        mgr = make_manager(spec, 60, tokens_per_page=2, eviction=eviction)
        seen: list = []
        _checked(mgr, seen)
        prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
        running: list = []
        for rid in range(120):
            prompt = rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
            mgr.add_request(rid, prompt)
            hit = mgr.lookup(rid)
            if mgr.allocate(rid, len(prompt) - hit) is None:
                mgr.free(rid)  # refused: let go, as a scheduler does
            else:
                mgr.append_tokens(rid, [rng.randrange(1, 50)])
                running.append(rid)
            while len(running) > rng.randrange(2, 8):
                mgr.free(running.pop(rng.randrange(len(running))))
            mgr.check_integrity()
        assert seen, f"{eviction}: the pre-check never refused (the test exercises nothing)"


def test_whole_sequence_check_refuses_without_holding_only_what_the_exact_check_refuses():
    """``can_allocate(step=...)`` (a scheduler's whole-prompt admission check, asked again each
    step for the request at the head of its queue) answers a sure refusal without holding the
    lookup's deferred hit, and only then: the same answers as holding it and planning exactly."""
    spec = model(group("full", full(), 1), group("swa", sliding(8), 1, first_layer=1))
    rng = random.Random(11)
    for eviction in ("reuse", "lru"):
        mgr = make_manager(spec, 60, tokens_per_page=2, eviction=eviction)
        seen: list = []
        _checked(mgr, seen)
        prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
        running: list = []
        for rid in range(120):
            prompt = rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 40))]
            mgr.add_request(rid, prompt)
            hit = mgr.lookup(rid)
            step = rng.choice([2, 4, 64])
            fits = mgr.can_allocate(rid, len(prompt) - hit, step=step)
            assert mgr.ledger.deferred is None or mgr.ledger.deferred.request_id == rid
            if not fits or mgr.allocate(rid, len(prompt) - hit) is None:
                mgr.free(rid)
            else:
                mgr.append_tokens(rid, [rng.randrange(1, 50)])
                running.append(rid)
            while len(running) > rng.randrange(2, 8):
                mgr.free(running.pop(rng.randrange(len(running))))
            mgr.check_integrity()
        assert any(step for _, step in seen), f"{eviction}: the pre-check never refused a whole-sequence check"


def test_precheck_refuses_a_held_hit_only_what_the_exact_check_refuses():
    """The head of a scheduler's waiting queue that does not fit stays there, looked up again each
    step: the lookup keeps its hit, held since another request's call settled it
    (``PrefixLookup.find``).  Its whole-prompt check and its allocate then answer a sure refusal
    without planning (nothing of a held hit is cached: referenced pages are never evictable), and
    only then: the same answers as planning exactly."""
    spec = model(group("full", full(), 1), group("swa", sliding(8), 1, first_layer=1))
    rng = random.Random(5)
    for eviction in ("reuse", "lru"):
        mgr = make_manager(spec, 60, tokens_per_page=2, eviction=eviction)
        seen: list = []
        _checked(mgr, seen)
        held: list = []
        inner = mgr.admission.hit_cannot_fit

        def note_held(req, end, allocated, step=None, inner=inner, held=held):
            refused = inner(req, end, allocated, step)
            if refused and req.hit and req.deferred_holds is None:
                held.append((req.request_id, step))
            return refused

        mgr.admission.hit_cannot_fit = note_held
        prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
        waiting = list(range(150))
        prompts = {rid: rng.choice(prefixes) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))]
                   for rid in waiting}
        running: list = []
        for _ in range(900):  # a step: decodes allocate (settling a deferred hit), the head, commits
            for r in list(running):
                if mgr.allocate(r, 1) is None:
                    mgr.free(r)
                    running.remove(r)
            if waiting:
                rid = waiting[0]
                if rid not in mgr.requests:
                    mgr.add_request(rid, prompts[rid])
                hit = mgr.lookup(rid)  # the same lookup again keeps its hit (held, or deferred)
                n = len(prompts[rid]) - hit
                if mgr.can_allocate(rid, n, step=rng.choice([2, 4, 64])) and mgr.allocate(rid, n) is not None:
                    running.append(waiting.pop(0))
            for r in list(running):
                mgr.append_tokens(r, [rng.randrange(1, 50)])
                if rng.random() < 0.1:
                    mgr.free(r)
                    running.remove(r)
            mgr.check_integrity()
        assert held, f"{eviction}: the pre-check never refused a held hit (the test exercises nothing)"
        assert any(step for _, step in held) and len(seen) >= len(held)


def test_precheck_counts_the_cached_pages_of_a_long_hit_run_exactly():
    """A hit run longer than ``BULK`` pages is counted in one numpy gather: its cached (zero
    reference) pages, not the ones a live request still holds.  Where the free pages alone
    hold the new pages, the precheck answers before counting anything."""
    from jenga.core.flat_arrays import BULK

    spec = model(group("full", full(), 1))
    mgr = make_manager(spec, 400, tokens_per_page=2)
    prompt = list(range(1, 2 * (BULK + 40) + 2))
    mgr.add_request("a", prompt)
    mgr.lookup("a")
    mgr.allocate("a", len(prompt))
    mgr.append_tokens("a", [7])
    mgr.add_request("b", prompt[:2 * BULK])  # b keeps the first BULK - 1 pages referenced
    mgr.allocate("b", 2 * BULK - mgr.lookup("b"))
    mgr.free("a")
    mgr.add_request("c", prompt[:-1] + [9])
    hit = mgr.lookup("c")
    req = mgr.requests["c"]
    (group_, pages), = req.deferred_holds
    assert len(pages) > BULK and hit == 2 * len(pages)
    alloc, ref = mgr.ledger.alloc, mgr.ledger.ref[group_]
    free = alloc.num_free_large + alloc.free_small[group_]  # one page per large page here
    unheld = sum(ref[p] == 0 for p in pages)
    assert 0 < unheld < len(pages) and len(mgr.ledger.evictor.keys[group_]) == unheld  # the hit's cached pages
    assert not mgr.admission.hit_cannot_fit(req, hit + 2 * free, mgr.num_allocated)  # free pages alone hold it: nothing counted
    assert req.deferred_cached_bytes is None
    # one page more: only the cached pages outside the hit could give it, and there are none
    assert mgr.admission.hit_cannot_fit(req, hit + 2 * free + 2, mgr.num_allocated)
    assert req.deferred_cached_bytes == unheld * alloc.page_bytes[group_]
    mgr.check_integrity()


def test_a_probe_leaves_another_requests_deferred_hit_deferred():
    """``cached_tokens`` (a scheduler ordering its waiting queue) reads the index only: the hit a
    lookup just deferred stays deferred (not held, then let go of by that request's next lookup),
    and the probe answers what a lookup then finds."""
    spec = model(group("full", full(), 1), group("swa", sliding(8), 1, first_layer=1))
    mgr = make_manager(spec, 60, tokens_per_page=2)
    prefix = list(range(3, 23))
    mgr.add_request("a", prefix + [30, 31])
    mgr.allocate("a", 22)
    mgr.append_tokens("a", [40])
    mgr.free("a")
    mgr.add_request("b", prefix + [32, 33])
    mgr.add_request("c", prefix + [34, 35, 36])
    assert mgr.lookup("b") > 0
    assert mgr.ledger.deferred is mgr.requests["b"]
    probed = mgr.cached_tokens("c")
    assert mgr.ledger.deferred is mgr.requests["b"], "the probe held another request's deferred hit"
    mgr.free("b")
    assert mgr.lookup("c") == probed > 0


def test_each_call_that_reads_or_moves_pages_holds_a_deferred_hit_at_its_entry():
    """A lookup's hit stays deferred until the next call that reads or moves pages, which holds it
    first (``KVCacheManager._settle``); the deferred request's own ``free`` and ``lookup`` let it
    go without holding it.  ``cached_tokens`` reads the index only and leaves it deferred (the
    probe test above)."""
    spec = model(group("full", full(), 1))
    prompt = list(range(1, 33))
    calls = {
        "append_tokens": lambda m: m.append_tokens("run", [5]),
        "allocate": lambda m: m.allocate("run", 1),
        "free": lambda m: m.free("run"),
        "can_allocate": lambda m: m.can_allocate("run", 1),
        "lookup": lambda m: (m.add_request("other", prompt[:9]), m.lookup("other")),
        "stats": lambda m: m.stats(),
        "used_bytes": lambda m: m.used_bytes,
    }
    for name, call in calls.items():
        mgr = make_manager(spec, 60, tokens_per_page=2)
        mgr.add_request("first", prompt)
        mgr.allocate("first", len(prompt))
        mgr.append_tokens("first", [3])
        mgr.free("first")  # its pages stay cached
        mgr.add_request("run", [40, 41, 42, 43])
        mgr.allocate("run", 4)
        mgr.append_tokens("run", [44])
        mgr.add_request("hit", prompt[:20] + [45])
        assert mgr.lookup("hit") == 20
        req = mgr.requests["hit"]
        assert mgr.ledger.deferred is req and not req.hit_holds
        call(mgr)
        assert mgr.ledger.deferred is not req and req.hit_holds, f"{name} left the hit deferred"
        mgr.check_integrity()
    for own in ("free", "lookup"):  # the deferred request's own calls let its hit go unheld
        mgr = make_manager(spec, 60, tokens_per_page=2)
        mgr.add_request("first", prompt)
        mgr.allocate("first", len(prompt))
        mgr.append_tokens("first", [3])
        mgr.free("first")
        mgr.add_request("hit", prompt[:20] + [45])
        mgr.lookup("hit")
        req = mgr.requests["hit"]
        mgr.free("hit") if own == "free" else mgr.lookup("hit", max_tokens=10)
        assert not req.hit_holds or own == "lookup", own
        assert mgr.ledger.deferred is (None if own == "free" else req), own
        mgr.check_integrity()
