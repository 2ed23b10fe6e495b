"""``lookup``'s fixed point takes the bounding full-attention group's answer from
``_hash_for_lookup``'s bound (every page of that group below the bound is cached, so its
``longest_prefix`` of any ``cand`` at or below it is ``cand`` rounded down to its pages) instead
of looking its page keys up again: the hit equals the general fixed point on full state."""

from __future__ import annotations

import random

import pytest
from conftest import full, group, make_manager, mamba, model, sliding


def hybrid():
    return model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1))


def windowed():
    return model(group("full", full(), 2), group("swa", sliding(6), 1, first_layer=2))


def three_kinds():
    return model(group("full", full(), 1), group("swa", sliding(6), 1, first_layer=1),
                 group("mamba", mamba(4), 1, first_layer=2))


@pytest.mark.parametrize("spec", [hybrid, windowed, three_kinds])
def test_the_lookup_hit_is_the_general_fixed_point(spec):
    rng = random.Random(5)
    mgr = make_manager(spec(), 40, tokens_per_page=2)
    assert mgr._full_bound is not None
    prefixes = [[rng.randrange(1, 30) for _ in range(rng.randrange(0, 40))] for _ in range(5)]
    live, hits = [], 0
    for rid in range(150):
        prompt = rng.choice(prefixes) + [rng.randrange(1, 30) for _ in range(rng.randrange(1, 9))]
        mgr.add_request(rid, prompt)
        cap = rng.choice([None, None, rng.randrange(0, 48)])
        req = mgr.requests[rid]
        top = min(len(prompt) - 1, len(prompt) // 2 * 2)
        top = top if cap is None else max(0, min(top, cap))
        hit = mgr.lookup(rid, max_tokens=cap)
        bound = mgr._hash_for_lookup(req, top)
        assert hit == mgr._fixed_point(req, bound, mgr.policies), (rid, prompt, cap)
        hits += hit > 0
        if mgr.allocate(rid, len(prompt) - hit) is None:
            mgr.free(rid)
            continue
        mgr.append_tokens(rid, [1])
        live.append(rid)
        while len(live) > rng.randrange(1, 5):
            mgr.free(live.pop(rng.randrange(len(live))))
        mgr.check_integrity()
    assert hits > 20, f"only {hits} lookups hit (the test exercises little)"
