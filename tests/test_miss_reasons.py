"""Prefix misses by cause (``jenga.core.manager.miss_reasons``): each missed prompt token a hit
could have covered is counted once per request, under the cause that cut the hit."""

from __future__ import annotations

from conftest import evict_page, full, group, make_manager, mamba, model, serve, sliding

P = list(range(100, 120))  # 20 tokens, one per page


def full_swa():
    return model(group("full", full(), 1), group("swa", sliding(4), 1, first_layer=1))


def misses(mgr) -> dict:
    return {k: v for k, v in mgr.stats().prefix_miss_tokens.items() if v}


def test_cold_other_salt_and_counted_once():
    mgr = make_manager(full_swa(), 64, eviction="reuse")
    assert serve(mgr, "a", P, [1]) == 0
    assert misses(mgr) == {"never_cached": 19}  # never the last token
    mgr.add_request("b", P + [5])
    for _ in range(3):  # a request waiting for memory is looked up again: counted at its allocate
        assert mgr.lookup("b") == 20
    mgr.allocate("b", 1)
    mgr.free("b")
    assert serve(mgr, "c", P, [1], salt="tenant-2") == 0
    assert misses(mgr) == {"never_cached": 19, "other_salt": 19}
    mgr.check_integrity()


def test_window_evicted_and_evicted_under_pressure():
    mgr = make_manager(full_swa(), 64, eviction="reuse")
    serve(mgr, "a", P, [1])
    window = {-k[1]: p for p, k in mgr.evictor.keys[1].items()}
    evict_page(mgr, 1, window[18])  # token 17: in the windows before 18, 19 and 20
    assert serve(mgr, "b", P + [5], [1]) == 17  # tokens 14..16, out of the window, still cached
    assert misses(mgr)["window_evicted"] == 3
    fulls = {-k[1]: p for p, k in mgr.evictor.keys[0].items()}
    evict_page(mgr, 0, fulls[11])  # full attention from token 10 on: gone under pressure
    mgr.add_request("c", P + [6])
    assert mgr.lookup("c") <= 10
    hit = mgr.lookup("c")
    mgr.allocate("c", 21 - hit)
    assert misses(mgr)["evicted"] == 20 - max(hit, 10)
    mgr.check_integrity()


def test_no_state_checkpoint_at_the_full_prefix():
    mgr = make_manager(model(group("full", full(), 1), group("mamba", mamba(8), 1, first_layer=1)), 64)
    serve(mgr, "a", list(range(10)) + [100, 101, 102, 103, 104], [1])  # checkpoints at 8 and 15
    assert serve(mgr, "b", list(range(10)) + [200, 201, 202, 203], [1]) == 8  # full attention reaches 10
    assert misses(mgr) == {"never_cached": 14 + 3, "no_checkpoint": 2}
