"""What a serving scheduler needs beside the lifecycle: placeholders, rejected drafts,
shrinking a hit, the admission query, reset_prefix_cache, KV events, used bytes."""

from __future__ import annotations

import pytest
from conftest import full, group, make_manager, mamba, model, page_ids, serve, sliding, snapshot

from jenga.baselines import MANAGER_NAMES
from jenga.baselines import make_manager as make_named
from jenga.core.prefix.events import AllBlocksCleared, BlockRemoved, BlockStored
from jenga.errors import InvalidArgumentError, SequenceTooLongError


def one_full(max_len: int = 64):
    return model(group("f", full(), 1), max_len=max_len)


def full_mamba(every: int = 4):
    return model(group("f", full(), 1), group("m", mamba(every), 1, first_layer=1))


# ------------------------------------------------------------ placeholders
def test_async_placeholders_get_pages_and_join_the_index_once_known():
    mgr = make_manager(one_full(), 8, tokens_per_page=2)
    mgr.add_request("r", [0, 1, 2, 3])
    assert mgr.allocate("r", 4).groups[0].page_ids == [0, 1]
    # step 2 is scheduled before step 1's sampled token (position 4) is known
    before = snapshot(mgr)
    with pytest.raises(InvalidArgumentError, match="placeholders"):
        mgr.allocate("r", 1)
    assert snapshot(mgr) == before
    t = mgr.allocate("r", 1, num_placeholders=1)
    assert t.groups[0].page_ids == [0, 1, 2] and (t.num_computed, t.num_new) == (0, 5)
    mgr.append_tokens("r", [9])  # step 1's token; steps 1 and 2 count as computed
    assert mgr.requests["r"].num_computed == 5 and len(mgr.index.table[0]) == 2
    mgr.allocate("r", 1, num_placeholders=1)  # position 5 (step 2's token, unknown)
    mgr.append_tokens("r", [10])
    assert len(mgr.index.table[0]) == 3  # page 2 = tokens 4, 5 now has known ids
    mgr.check_integrity()
    mgr.free("r")
    mgr.add_request("s", [0, 1, 2, 3, 9, 10, 11])
    assert mgr.lookup("s") == 6 and page_ids(mgr, "s", 0) == [0, 1, 2]
    mgr.check_integrity()


def test_rejected_draft_tokens_are_not_computed_and_keep_their_pages():
    mgr = make_manager(one_full(), 8, tokens_per_page=2)
    mgr.add_request("r", [0, 1, 2])
    mgr.allocate("r", 3)
    mgr.append_tokens("r", [3])
    # verify 1 known token + 3 drafts (their ids are not the sequence's yet)
    t = mgr.allocate("r", 4, num_placeholders=3)
    assert t.groups[0].page_ids == [0, 1, 2, 3]
    with pytest.raises(InvalidArgumentError, match="rejected"):
        mgr.append_tokens("r", [4], num_rejected=5)
    mgr.append_tokens("r", [4, 5], num_rejected=2)  # 1 draft accepted + the bonus token
    req = mgr.requests["r"]
    assert (req.num_computed, req.num_scheduled, len(req.tokens)) == (5, 0, 6)
    t = mgr.allocate("r", 1)  # position 5 again: page 2 is still held, nothing new
    assert t.groups[0].page_ids == [0, 1, 2, 3] and (t.num_computed, t.num_new) == (5, 1)
    mgr.check_integrity()


# ------------------------------------------------------------ shrink_hit
def test_shrink_hit_keeps_the_longest_valid_prefix_and_releases_the_rest():
    mgr = make_manager(one_full(), 8, tokens_per_page=2)
    serve(mgr, "a", list(range(9)), [100])
    keys = dict(mgr.evictor.keys[0])
    mgr.add_request("b", list(range(9)) + [7])
    assert mgr.lookup("b") == 8 and page_ids(mgr, "b", 0) == [0, 1, 2, 3]
    assert mgr.shrink_hit("b", 9) == 8  # above the hit: unchanged
    assert mgr.shrink_hit("b", 5) == 4 and page_ids(mgr, "b", 0) == [0, 1]
    assert mgr.requests["b"].num_computed == 4
    assert {p: keys[p] for p in (2, 3)} == {p: mgr.evictor.keys[0][p] for p in (2, 3)}  # old keys back
    mgr.check_integrity()
    # the same state as a lookup capped at 5 from the start
    other = make_manager(one_full(), 8, tokens_per_page=2)
    serve(other, "a", list(range(9)), [100])
    other.add_request("b", list(range(9)) + [7])
    assert other.lookup("b", max_tokens=5) == 4
    assert snapshot(other) == snapshot(mgr)
    with pytest.raises(InvalidArgumentError):
        mgr.shrink_hit("b", -1)
    t = mgr.allocate("b", 6)
    assert t.groups[0].page_ids == [0, 1, 4, 5, 6]
    with pytest.raises(InvalidArgumentError, match="after its first allocate"):
        mgr.shrink_hit("b", 2)
    mgr.check_integrity()


def test_shrink_hit_rounds_down_to_a_state_checkpoint():
    mgr = make_manager(full_mamba(4), 16, tokens_per_page=2)
    serve(mgr, "a", list(range(13)), [100])
    mgr.add_request("b", list(range(13)) + [5])
    assert mgr.lookup("b") == 12
    assert mgr.shrink_hit("b", 10) == 8  # full pages allow 10, Mamba only checkpoints 4, 8, 12
    assert mgr.requests["b"].groups[1].read_pos == 8
    mgr.check_integrity()


# ------------------------------------------------------------ can_allocate
def test_can_allocate_is_exact_and_changes_nothing():
    mgr = make_manager(one_full(), 4, tokens_per_page=2)  # 4 pages of 2 tokens
    mgr.add_request("a", list(range(5)))
    before = snapshot(mgr)
    assert mgr.can_allocate("a", 8) and not mgr.can_allocate("a", 9)
    assert not mgr.can_allocate("a", 7, num_lookahead=2)
    assert snapshot(mgr) == before
    with pytest.raises(InvalidArgumentError):
        mgr.can_allocate("a", -1)
    with pytest.raises(SequenceTooLongError):
        mgr.can_allocate("a", 65)
    mgr.allocate("a", 5)
    mgr.append_tokens("a", [5])
    assert mgr.can_allocate("a", 3) and not mgr.can_allocate("a", 4)  # 3 pages held, 1 free
    mgr.free("a")
    # cached pages count as reclaimable, and a hit's pages are not counted twice
    mgr.add_request("b", list(range(6)) + [9, 9])
    assert mgr.lookup("b") == 4  # token 4 was computed, token 5 only sampled: 2 full pages
    before = snapshot(mgr)
    assert mgr.can_allocate("b", 4) and not mgr.can_allocate("b", 5)
    assert snapshot(mgr) == before
    assert mgr.allocate("b", 4) is not None and mgr.allocate("b", 0, num_lookahead=1) is None
    mgr.check_integrity()


def test_can_allocate_on_a_sliding_window_counts_what_one_allocate_holds():
    spec = model(group("swa", sliding(4), 1))
    mgr = make_manager(spec, 4, tokens_per_page=2)
    mgr.add_request("a", list(range(8)))
    assert mgr.can_allocate("a", 8) and not mgr.can_allocate("a", 9)


# ------------------------------------------------------------ reset
def test_reset_prefix_cache_refuses_while_pages_are_held_then_frees_everything():
    mgr = make_manager(one_full(), 8, tokens_per_page=2)
    serve(mgr, "a", list(range(9)), [100])
    mgr.add_request("b", list(range(9)))
    assert mgr.lookup("b") == 8
    before = snapshot(mgr)
    assert mgr.reset_prefix_cache() is False and snapshot(mgr) == before
    mgr.free("b")
    assert mgr.stats().cached_bytes > 0
    assert mgr.reset_prefix_cache() is True
    st = mgr.stats()
    assert st.cached_bytes == 0 and st.free_bytes == st.total_bytes and not len(mgr.index)
    mgr.check_integrity()
    mgr.add_request("c", list(range(9)))
    assert mgr.lookup("c") == 0


# ------------------------------------------------------------ events
def test_kv_events_follow_the_prefix_index():
    mgr = make_manager(one_full(), 3, tokens_per_page=2)
    assert mgr.take_events() == []
    mgr.enable_kv_events()
    serve(mgr, "a", [10, 11, 12, 13, 14], [15])
    h = mgr.hasher.memo._memo["a"][1]  # the block hashes of "a"
    assert mgr.take_events() == [BlockStored(0, [h[0]], None, [10, 11], 2, kind="full"),
                                 BlockStored(0, [h[1]], h[0], [12, 13], 2, kind="full")]
    assert mgr.take_events() == []
    serve(mgr, "b", [20, 21, 22, 23, 24, 25], [])  # needs all 3 pages: evicts the cached two, tail first
    ev = mgr.take_events()
    assert ev[:2] == [BlockRemoved(0, [h[1]]), BlockRemoved(0, [h[0]])]
    assert [type(e) for e in ev[2:]] == [BlockStored] * 3
    assert [e.token_ids for e in ev[2:]] == [[20, 21], [22, 23], [24, 25]]
    assert mgr.reset_prefix_cache()
    assert mgr.take_events() == [AllBlocksCleared()]


def test_kv_events_of_state_checkpoints_cover_their_interval():
    mgr = make_manager(full_mamba(4), 16, tokens_per_page=2)
    mgr.enable_kv_events()
    serve(mgr, "a", list(range(9)), [100])
    ev = [e for e in mgr.take_events() if e.group == 1]
    assert [(e.token_ids, e.block_size) for e in ev] == [([0, 1, 2, 3], 4), ([4, 5, 6, 7], 4)]
    assert ev[1].parent_block_hash == ev[0].block_hashes[0]


# ------------------------------------------------------------ every manager
@pytest.mark.parametrize("name", MANAGER_NAMES)
def test_every_manager_serves_the_scheduler_api(name):
    spec = model(group("f", full(), 2), group("swa", sliding(8), 2, first_layer=2), max_len=256)
    mgr = make_named(name, spec, 1 << 16, tokens_per_page=4)
    mgr.enable_kv_events()
    prompt = list(range(30))
    for rid in ("a", "b"):
        mgr.add_request(rid, prompt + [int(rid == "b")])  # bools are not token ids
        hit = mgr.lookup(rid)
        if rid == "b":
            assert hit > 0 and mgr.shrink_hit(rid, hit - 1) < hit
        assert mgr.can_allocate(rid, 31 - mgr.requests[rid].num_computed + 16)
        mgr.allocate(rid, 31 - mgr.requests[rid].num_computed)
        mgr.allocate(rid, 1, num_placeholders=1)  # async: the next step before this one's token
        mgr.append_tokens(rid, [7])
        mgr.append_tokens(rid, [8])
        assert mgr.used_bytes == mgr.stats().used_bytes > 0 and 0 < mgr.usage < 1
        mgr.check_integrity()
    assert mgr.reset_prefix_cache() is False
    mgr.free("a")
    mgr.free("b")
    assert mgr.used_bytes == 0
    assert any(isinstance(e, BlockStored) for e in mgr.take_events())
    assert mgr.reset_prefix_cache() is True and mgr.stats().cached_bytes == 0
    mgr.check_integrity()
