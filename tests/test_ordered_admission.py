"""``KVCacheManager(admission="ordered")``: an admission may evict the pages the reuse evictor
protects, in its order, while other requests run (``jenga.core.manager.ordered_admission``);
the default ``"protect"`` holds it back (``tests/test_reuse_evictor.py``)."""

from __future__ import annotations

import pytest
from conftest import full, group, model, serve

from jenga import KVCacheManager
from jenga.core.pagesize import with_base_page
from jenga.errors import InvalidArgumentError


def protected_setup(rule: str) -> KVCacheManager:
    """``test_reuse_evictor.protected_setup`` with ``admission=rule``: 8 pages; prefix [1, 2]
    served twice (pages 0, 1 protected; pages 2, 3 one-off), request r running on pages 4..7."""
    spec = model(group("full", full(), 1))
    mgr = KVCacheManager(spec, 9 * with_base_page(spec, 1).large_page_bytes, tokens_per_page=1, fit_pages=False,
                         window_slack=0, out_of_window_age=0, eviction="reuse", admission=rule)
    serve(mgr, "x", [1, 2, 3], [0])
    serve(mgr, "x2", [1, 2, 4], [0])
    assert sorted(mgr.evictor.protected[0]) == [0, 1]
    mgr.add_request("r", [20, 21, 22, 23, 24])
    assert mgr.lookup("r") == 0
    assert mgr.allocate("r", 4).groups[0].page_ids == [4, 5, 6, 7]
    mgr.append_tokens("r", [])
    return mgr


def test_ordered_admission_evicts_protected_pages_that_protect_keeps():
    for rule, want in (("protect", None), ("ordered", [2, 3, 1])):
        mgr = protected_setup(rule)
        mgr.add_request("z", [30, 31, 32])
        assert mgr.lookup("z") == 0
        t = mgr.allocate("z", 3)
        if want is None:
            assert t is None and sorted(mgr.evictor.protected[0]) == [0, 1]
        else:  # one-off pages oldest first, then the reused ones, most recently released first (tail first)
            assert t.groups[0].page_ids == want
            assert sorted(mgr.evictor.protected[0]) == [0]
        mgr.check_integrity()


def test_a_lone_request_evicts_alike_under_both_rules():
    got = []
    for rule in ("protect", "ordered"):
        mgr = protected_setup(rule)
        mgr.free("r")
        mgr.add_request("z", [30, 31, 32, 33, 34, 35, 36, 37])
        assert mgr.lookup("z") == 0
        got.append(mgr.allocate("z", 8).groups[0].page_ids)
        mgr.check_integrity()
    assert got[0] == got[1]


def test_unknown_admission_rule_is_refused():
    with pytest.raises(InvalidArgumentError, match="admission rule 'fifo'"):
        KVCacheManager(model(group("full", full(), 1)), "1MiB", admission="fifo")
