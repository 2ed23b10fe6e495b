"""The per-kind capabilities: ``Policy`` (the page lifecycle) stays small, every registered kind has
its footprint and tier rules, and the simulator's costing reads the footprint's window rule."""

from __future__ import annotations

import numpy as np
import pytest

from jenga.core.policy.base import Policy
from jenga.core.policy.footprint import FOOTPRINTS, TokenFootprint, footprint_for
from jenga.core.policy.registry import POLICIES
from jenga.core.policy.tier_rules import TIER_RULES
from jenga.core.specs import ChunkedLocalSpec, FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec
from jenga.sim.costing import group_costs


def public_methods(cls: type) -> list[str]:
    return sorted(n for n, v in vars(cls).items() if not n.startswith("_") and callable(v) and not isinstance(v, type))


def test_policy_has_at_most_15_public_methods():
    """The lifecycle only: sizes live on ``Footprint``, host-tier questions on ``TierRules``."""
    methods = public_methods(Policy)
    assert len(methods) <= 15, methods


def test_every_registered_kind_has_a_footprint_and_tier_rules():
    for spec_type in POLICIES:
        assert any(c in FOOTPRINTS for c in spec_type.__mro__), spec_type
        assert any(c in TIER_RULES for c in spec_type.__mro__), spec_type


@pytest.mark.parametrize("spec", [FullAttentionSpec("m", "bf16", 1, 8), SlidingWindowSpec("m", "bf16", 1, 8, window=70),
                                  ChunkedLocalSpec("m", "bf16", 1, 8, chunk=48)])
def test_the_costing_reads_the_token_range_the_footprint_names(spec):
    """What a simulated step reads in a token group is ``[first_needed(end - q), end)``, the
    footprint's own rule (its array form agrees with the one the policy calls per request)."""
    group = LayerGroup("g", spec, (0,), tokens_per_page=16)
    fp = footprint_for(0, group, 16)
    assert isinstance(fp, TokenFootprint)
    end = np.arange(1, 400, dtype=np.int64)
    q = np.minimum((end * 7) % 61 + 1, end)
    [cost] = group_costs(ModelSpec("toy", (group,), max_model_len=1 << 20))
    expect = [e - fp.first_needed(e - k) for e, k in zip(end.tolist(), q.tolist(), strict=True)]
    assert cost.reads(end, q, np.zeros_like(end)).tolist() == expect


def _core_classes(module_names: list[str]) -> list[type]:
    import importlib
    import inspect
    out = []
    for name in module_names:
        module = importlib.import_module(name)
        out += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
    return out


def test_baselines_override_no_private_method_of_a_core_class():
    """The baselines compose: they inject a public rule (``Checkpoints``, a policy subclass of
    public methods) and shadow no underscore method a ``jenga.core`` class defines."""
    from pathlib import Path

    import jenga.baselines
    mods = [f"jenga.baselines.{p.stem}" for p in sorted(Path(jenga.baselines.__file__).parent.glob("*.py"))
            if p.stem != "__init__"]
    shadowed = []
    for cls in _core_classes(mods):
        core = [b for b in cls.__mro__[1:] if b.__module__.startswith("jenga.core.")]
        for name in vars(cls):
            if name.startswith("_") and not name.startswith("__") and callable(vars(cls)[name]) \
                    and any(name in vars(b) for b in core):
                shadowed.append(f"{cls.__name__}.{name}")
    assert not shadowed, shadowed
