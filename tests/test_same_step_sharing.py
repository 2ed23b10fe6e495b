"""Pages are findable from allocation on: a request admitted later in the same step shares
pages another request is filling in that step (the engine writes the whole batch's K/V before
attention in each layer); a page whose fill is aborted (a free or a rejection before the
commit) leaves the index and is never served."""

from __future__ import annotations

import pytest
from conftest import full, group, make_manager, mamba, model, sliding, snapshot

from jenga.errors import InvalidArgumentError

P = list(range(1, 9))  # 8 shared tokens


def one_full():
    return model(group("full", full(), 1))


def test_second_request_of_the_same_step_hits_pages_being_filled():
    mgr = make_manager(one_full(), 32)
    mgr.add_request("a", P + [50, 51])
    assert mgr.lookup("a") == 0
    a = mgr.allocate("a", 10).groups[0].page_ids  # the step computes all 10 tokens of a
    assert a == list(range(10))
    mgr.add_request("b", P + [60])  # admitted in the same step, before a's tokens are committed
    assert mgr.lookup("b") == 8
    b = mgr.allocate("b", 1).groups[0].page_ids
    assert b == a[:8] + [10]
    mgr.append_tokens("a", [7])
    mgr.append_tokens("b", [8])
    assert mgr.stats().waste_duplicate_bytes == 0
    mgr.check_integrity()


def test_only_known_tokens_of_the_scheduled_range_are_registered():
    mgr = make_manager(one_full(), 32, tokens_per_page=4)
    mgr.add_request("a", P + [50, 51])  # blocks [0,4) [4,8) known; [8,10) partial
    mgr.lookup("a")
    mgr.allocate("a", 6)  # first chunk: only block [0,4) is scheduled completely
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 4
    mgr.free("b")
    mgr.check_integrity()


def test_aborted_fill_is_never_served():
    mgr = make_manager(one_full(), 32)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.free("a")  # preempted before its step ran: pages 0..7 were registered, never written
    assert len(mgr.index) == 0
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 0
    mgr.check_integrity()


def test_chunk_committed_then_next_chunk_aborted_keeps_the_written_pages():
    mgr = make_manager(one_full(), 32)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    mgr.allocate("a", 4)
    mgr.append_tokens("a", [])  # tokens 0..3 written
    mgr.allocate("a", 5)
    mgr.free("a")  # the second chunk never ran
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 4
    mgr.check_integrity()


def test_rejected_tokens_leave_the_index():
    mgr = make_manager(one_full(), 32)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.append_tokens("a", [], num_rejected=5)  # only tokens 0..3 were computed
    assert mgr.requests["a"].num_computed == 4
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 4
    mgr.free("b")
    mgr.allocate("a", 5)  # computed again, in pages it holds (no new page: registered at commit)
    mgr.add_request("c", P + [70])
    assert mgr.lookup("c") == 4
    mgr.free("c")
    mgr.append_tokens("a", [3])
    mgr.add_request("c", P + [70])
    assert mgr.lookup("c") == 8
    mgr.check_integrity()


def test_abort_of_a_fill_another_request_already_holds_is_refused_unchanged():
    mgr = make_manager(one_full(), 32)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 8  # b holds a's pages being filled
    before = snapshot(mgr)
    with pytest.raises(InvalidArgumentError, match="already shared"):
        mgr.free("a")
    with pytest.raises(InvalidArgumentError, match="already shared"):
        mgr.append_tokens("a", [], num_rejected=9)
    assert snapshot(mgr) == before
    mgr.free("b")  # b leaves first: then a's abort is fine
    mgr.free("a")
    assert len(mgr.index) == 0
    mgr.check_integrity()


def test_sliding_window_pages_are_shared_in_the_same_step():
    mgr = make_manager(model(group("full", full(), 1), group("swa", sliding(4), 1, first_layer=1)), 64)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    ta = mgr.allocate("a", 9)
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 8
    tb = mgr.allocate("b", 1)
    assert tb.groups[1].page_ids[5:8] == ta.groups[1].page_ids[5:8]  # the window token 8 reads
    mgr.append_tokens("a", [1])
    mgr.append_tokens("b", [2])
    mgr.check_integrity()


def test_state_checkpoints_are_found_only_once_written():
    # a state page is written during the scan, not before attention: it stays commit-time
    mgr = make_manager(model(group("full", full(), 1), group("mamba", mamba(4), 1, first_layer=1)), 64)
    mgr.add_request("a", P + [50])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.add_request("b", P + [60])
    assert mgr.lookup("b") == 0  # the attention pages are there, no checkpoint yet
    mgr.free("b")
    mgr.append_tokens("a", [1])
    mgr.add_request("c", P + [60])
    assert mgr.lookup("c") == 8
    mgr.check_integrity()
