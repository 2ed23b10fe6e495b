"""A seeded slice of the operation fuzz (``tests/op_fuzz.py``): every manager (jenga, paged, static,
uniform, the multi-model pool) on six layer mixes, jenga's host tier (demotion, promotion, host
eviction counted), speculative lookahead; ``check_integrity()`` after every operation and each operation's
contract.  ``JENGA_FUZZ_OPS`` operations in all (default 90,000, in two halves xdist can spread; with
the vLLM adapter fuzz's 10,000, ``tests/test_vllm_adapter_fuzz.py``, 10^5 in ``make test``);
``python benchmarks/op_fuzz_long.py`` is the long run."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
from op_fuzz import MANAGERS, Fuzz, configurations, fuzz, run_one

from jenga.core.tier.host_tier import HostTier

OPS = int(float(os.environ.get("JENGA_FUZZ_OPS", "90000")))
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_operation_fuzz(seed):
    done, violations, seen = fuzz(OPS // 2, seed, runs_of=250)
    assert not violations, "\n".join(violations[:3])
    assert done == OPS // 2 and seen["ops"] == done
    # what the slice exercised: every manager, hits, failed allocations, host copies, kept drafts
    assert all(seen[f"runs:{m}"] > 0 for m in MANAGERS), dict(seen)
    assert seen["hit"] > 0 and seen["none"] > 0 and seen["copies"] > 0 and seen["kept drafts"] > 0, dict(seen)
    # the host tier's moves both ways, and its own evictions
    assert seen["host demoted"] > 0 and seen["host promoted"] > 0 and seen["host evicted"] > 0, dict(seen)


def test_the_configurations_cover_every_manager_the_host_tier_and_lookahead():
    confs = configurations()
    assert {c[0] for c in confs} == set(MANAGERS)
    assert any(c[2] for c in confs) and any(c[3] for c in confs)


def _break_host_eviction(host, how: str) -> None:
    """Make ``host``'s own evictions (``HostTier``: a host page evicted to make room) skip a step:
    ``"hash"`` keeps the evicted page's key in the host index, ``"slot"`` never frees its slot."""
    ev = host.evictor
    if how == "hash":
        drop = ev.drop_many

        def keep_keys(group, pages):
            ev.index.drop_many = lambda g, ps: None
            try:
                drop(group, pages)
            finally:
                del ev.index.drop_many
        ev.drop_many = keep_keys
    else:
        host.alloc.evict_cached = lambda g, p: None
        host.alloc.evict_whole_many = lambda g, larges: None


@pytest.mark.parametrize("how", ["hash", "slot"])
def test_the_host_fuzz_sees_a_broken_host_eviction(monkeypatch, how):
    """The host-tier runs evict host pages; a host eviction that keeps its key or its slot is a violation."""
    def host_runs():
        violations, seen = [], Counter()
        for i, (name, spec, host, k) in enumerate(c for c in configurations() if c[2]):
            run_one(Fuzz(name, spec, i, host=host, k=k), 300, f"{name} {spec} k={k}", name, "", host, k, violations, seen)
        return violations, seen

    violations, seen = host_runs()
    assert not violations and seen["host evicted"] > 0, (violations[:1], dict(seen))
    init = HostTier.__init__

    def broken(self, *args, **kw):
        init(self, *args, **kw)
        _break_host_eviction(self, how)
    monkeypatch.setattr(HostTier, "__init__", broken)
    violations, _ = host_runs()
    assert violations, f"a host eviction that keeps its {how} went unseen"


def test_a_fuzz_whose_every_run_fails_its_first_operation_ends_and_reports_each(monkeypatch):
    """A run that raises at its first check still counts the operation it started, so the loop moves
    on: ``fuzz`` ends with one violation per run instead of rebuilding managers forever."""
    import jenga.core.manager.manager as manager_mod

    def broken(self):
        raise AssertionError("broken check")

    import time

    monkeypatch.setattr(manager_mod.KVCacheManager, "check_integrity", broken)
    done, violations, _ = fuzz(6, seed=0, runs_of=2, deadline=time.time() + 20)  # the deadline ends a stuck loop
    assert done == 6 and len(violations) == 6 and all("broken check" in v for v in violations)


def test_the_long_fuzz_goes_on_from_a_slice_and_the_two_runs_add_up_to_one(capsys):
    """``--first-slice K`` runs slices K.. only (the rest of a run ``--hours`` stopped): their
    operations are the whole run's less the first K - 1 slices'."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("op_fuzz_long", ROOT / "benchmarks" / "op_fuzz_long.py")
    long = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(long)
    argv = ["--ops", "6000", "--parts", "managers", "--slice-ops", "2000", "--jobs", "2"]
    assert long.main([*argv, "--first-slice", "2"]) == 0
    rest = capsys.readouterr().out
    assert re.search(r"^all\s+4,000 ops 0 violations", rest, re.M), rest
    with pytest.raises(SystemExit):
        long.main([*argv, "--first-slice", "4"])  # three slices of 2,000
