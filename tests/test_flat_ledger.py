"""The ledger's numpy paths for long runs leave exactly the state of its element-by-element
paths (``BULK`` raised so that the twin never takes them)."""

from __future__ import annotations

import copy

import pytest
from conftest import full, group, make_manager, model, run, snapshot

import jenga.core.manager.ledger


def scenario(mgr):
    """A 100-page prefix cached; B's lookup hit on it is held (another request allocates) and let
    go on free after C, which held 80 of its pages, left (released keys recorded, some pages stay USED)."""
    prefix = list(range(1, 101))
    mgr.add_request("a", prefix + [7])
    mgr.lookup("a")
    run(mgr, "a", 101, [8])
    mgr.free("a")
    mgr.add_request("c", prefix[:80] + [9])
    assert mgr.lookup("c") == 80
    run(mgr, "c", 1, [5])
    mgr.add_request("b", prefix + [11])
    assert mgr.lookup("b") == 100
    mgr.add_request("d", [500, 501, 502])
    mgr.lookup("d")
    run(mgr, "d", 3, [4])  # holds b's pending hit
    assert mgr.requests["b"].hit_holds
    mgr.free("c")  # c's keys for the shared pages are recorded: b still holds them
    mgr.free("b")  # b's pins undone: one long hold_run entry
    mgr.check_integrity()
    return snapshot(mgr)


@pytest.mark.parametrize("pages", [1, 2])
def test_long_unhold_and_drop_equal_the_per_page_rule(monkeypatch, pages):
    spec = model(group("full", full(), pages))
    fast = make_manager(spec, 400)
    slow = copy.deepcopy(fast)
    want_fast = scenario(fast)
    monkeypatch.setattr(jenga.core.manager.ledger, "BULK", 10**9)
    assert scenario(slow) == want_fast
