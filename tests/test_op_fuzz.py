"""A seeded slice of the operation fuzz (``tests/op_fuzz.py``): every manager (jenga, paged, static,
uniform, the multi-model pool) on six layer mixes, jenga's host tier (demotion, promotion, host
eviction counted), speculative lookahead; ``check_integrity()`` after every operation and each operation's
contract.  ``JENGA_FUZZ_OPS`` operations in all (default 90,000, in two halves xdist can spread; with
the vLLM adapter fuzz's 10,000, ``tests/test_vllm_adapter_fuzz.py``, 10^5 in ``make test``);
``python benchmarks/op_fuzz_long.py`` is the long run."""

from __future__ import annotations

import os

import pytest
from op_fuzz import MANAGERS, configurations, fuzz

OPS = int(float(os.environ.get("JENGA_FUZZ_OPS", "90000")))


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_operation_fuzz(seed):
    done, violations, seen = fuzz(OPS // 2, seed, runs_of=250)
    assert not violations, "\n".join(violations[:3])
    assert done == OPS // 2 and seen["ops"] == done
    # what the slice exercised: every manager, hits, failed allocations, host copies, kept drafts
    assert all(seen[f"runs:{m}"] > 0 for m in MANAGERS), dict(seen)
    assert seen["hit"] > 0 and seen["none"] > 0 and seen["copies"] > 0 and seen["kept drafts"] > 0, dict(seen)
    # the host tier's moves both ways
    assert seen["host demoted"] > 0 and seen["host promoted"] > 0, dict(seen)


def test_the_configurations_cover_every_manager_the_host_tier_and_lookahead():
    confs = configurations()
    assert {c[0] for c in confs} == set(MANAGERS)
    assert any(c[2] for c in confs) and any(c[3] for c in confs)
