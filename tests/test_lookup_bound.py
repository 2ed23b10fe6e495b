"""``lookup``'s fixed point takes the bounding full-attention group's answer from
``_hash_for_lookup``'s bound (every page of that group below the bound is cached, so its
``longest_prefix`` of any ``cand`` at or below it is ``cand`` rounded down to its pages) instead
of looking its page keys up again: the hit equals the general fixed point on full state."""

from __future__ import annotations

import random

import pytest
from conftest import full, group, make_manager, mamba, model, random_lookups, sliding


def hybrid():
    return model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1))


def windowed():
    return model(group("full", full(), 2), group("swa", sliding(6), 1, first_layer=2))


def three_kinds():
    return model(group("full", full(), 1), group("swa", sliding(6), 1, first_layer=1),
                 group("mamba", mamba(4), 1, first_layer=2))


@pytest.mark.parametrize("spec", [hybrid, windowed, three_kinds])
def test_the_lookup_hit_is_the_general_fixed_point(spec):
    mgr = make_manager(spec(), 40, tokens_per_page=2)
    assert mgr.hasher.bound is not None

    def check(req, prompt, cap, hit, bound):
        assert hit == mgr.prefix_lookup.fixed_point(req, bound, mgr.policies), (req.request_id, prompt, cap)
        return hit > 0

    hits = random_lookups(mgr, random.Random(5), check)
    assert hits > 20, f"only {hits} lookups hit (the test exercises little)"
