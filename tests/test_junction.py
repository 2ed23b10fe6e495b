"""Recompute under shared pages (``jenga.core.manager.junction``): a request whose state hit lies
below the cached attention prefix (the junction) holds the cached attention pages up to the
junction and writes K/V only from there (``TokenTable.write_from``); exact page ids on a tiny
hybrid (2-token pages, state checkpoints every 4 tokens), against vLLM's protocol
(``CopyForwardMambaSpec``), which keeps fresh pages."""

from __future__ import annotations

from conftest import cached_keys, full, group, make_manager, mamba, model, random_lookups

from jenga.baselines import make_manager as make_baseline
from jenga.core.specs import CopyForwardMambaSpec

P = list(range(10))  # the shared prefix: 5 attention pages; state checkpoints at 4 and 8 only


def hybrid(state=None):
    return model(group("full", full(), 1), group("mamba", state or mamba(4), 1, first_layer=1))


def first_writer(mgr):
    """a: P + 6 tokens, one step; freed (its pages cached: attention 0..7, checkpoints 4, 8, 12, 16)."""
    mgr.add_request("a", P + [100, 101, 102, 103, 104, 105])
    assert mgr.lookup("a") == 0
    t = mgr.allocate("a", 16)
    assert (t.groups[0].page_ids, t.groups[0].write_from) == (list(range(8)), 0)
    mgr.append_tokens("a", [1])
    mgr.free("a")


def test_state_hit_below_the_junction_shares_the_attention_pages_up_to_it():
    mgr = make_manager(hybrid(), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    assert mgr.lookup("b") == 8 and mgr.requests["b"].junction == 10  # no state at 10 yet
    t = mgr.allocate("b", 12)  # tokens [8, 20): 8, 9 recomputed for the state layers only
    att, st = t.groups
    assert att.page_ids == [0, 1, 2, 3, 4, 10, 11, 12, 13, 14]  # a's page 4 (tokens 8, 9) shared
    assert att.write_from == 10 and t.num_computed == 8  # computed from 8, K/V written from 10
    assert [mgr.ref[0][p] for p in range(5)] == [1] * 5
    assert (st.work_page, st.read_page, st.checkpoints) == (30, 18, {10: 31})  # junction checkpoint
    mgr.check_integrity()
    mgr.append_tokens("b", [2])
    mgr.check_integrity()
    mgr.free("b")
    mgr.add_request("c", P + list(range(300, 310)))
    assert mgr.lookup("c") == 10  # b's junction checkpoint
    t = mgr.allocate("c", 10)
    assert t.groups[0].page_ids[:5] == [0, 1, 2, 3, 4] and t.groups[0].write_from == 10
    mgr.check_integrity()


def test_vllm_protocol_keeps_fresh_pages_for_the_recomputed_tokens():
    """vLLM's worker writes the K/V of every computed token: the attention group holds only
    the common hit and takes fresh pages from it (the page for tokens 8, 9 is a copy)."""
    state = CopyForwardMambaSpec("toy", shapes=((64,),), dtypes=("bf16",), checkpoint_interval=4)
    mgr = make_manager(hybrid(state), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    assert mgr.lookup("b") == 8 and mgr.requests["b"].junction == 10
    t = mgr.allocate("b", 12)
    assert t.groups[0].page_ids == [0, 1, 2, 3, 11, 12, 13, 14, 15, 16] and t.groups[0].write_from == 8
    assert mgr.ref[0][4] == 0  # a's page 4 stays cached, unheld
    mgr.check_integrity()


def test_uniform_baseline_keeps_fresh_pages():
    spec = hybrid()
    mgr = make_baseline("uniform", spec, 1 << 20, tokens_per_page=2)
    assert not mgr.junction.ahead


def test_no_hit_at_all_shares_the_whole_cached_attention_prefix():
    """A state with no checkpoint in the prefix (interval 16): the hit is 0, the attention
    group still holds a's pages up to the junction 10 and writes from there."""
    mgr = make_manager(hybrid(mamba(16)), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    assert mgr.lookup("b") == 0 and mgr.requests["b"].junction == 10
    t = mgr.allocate("b", 20)
    assert t.groups[0].page_ids[:5] == [0, 1, 2, 3, 4] and t.groups[0].write_from == 10
    assert t.groups[0].page_ids[5:] == [9, 10, 11, 12, 13]  # large page 8 is carved for state (a's 16)
    assert (t.groups[1].work_page, t.groups[1].checkpoints) == (28, {10: 29})
    mgr.check_integrity()


def test_a_dropped_step_keeps_the_shared_pages_registered():
    """b freed after its allocate, before the commit: the pages it would have filled (from 10)
    leave the index; a's shared pages below the junction stay registered and cached."""
    mgr = make_manager(hybrid(), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    mgr.lookup("b")
    t = mgr.allocate("b", 12)
    pages = list(t.groups[0].page_ids)
    mgr.free("b")
    mgr.check_integrity()
    assert all(mgr.index.is_registered(0, p) for p in pages[:5])
    assert not any(mgr.index.is_registered(0, p) for p in pages[5:])
    mgr.add_request("c", P + [7])
    assert mgr.lookup("c") == 8 and mgr.requests["c"].junction == 10


def test_a_state_hit_below_the_junction_ends_its_step_on_the_junction():
    """b resumes a's state at 8 below its junction 10: ``chunk_tokens`` ends its first step
    at 10, so the work page becomes the junction checkpoint (no second state page in the
    step); the next step copies it into a fresh work page and lets go of it (cached,
    unreferenced, evictable); c hits it."""
    mgr = make_manager(hybrid(), 64, tokens_per_page=2)
    first_writer(mgr)
    assert sorted(cached_keys(mgr, 1)) == [16, 17, 18, 19]  # a's checkpoints 4, 8, 12, 16
    mgr.add_request("b", P + list(range(200, 210)))
    assert mgr.lookup("b") == 8 and mgr.requests["b"].junction == 10
    assert mgr.chunk_tokens("b", 12) == 2
    t = mgr.allocate("b", 2)
    att, st = t.groups
    assert (att.page_ids, att.write_from) == ([0, 1, 2, 3, 4], 10)
    assert (st.work_page, st.read_page, st.checkpoints) == (20, 18, {})  # no junction page
    assert (mgr.ref[1][20], mgr.ref[1][18]) == (1, 0) and 18 in cached_keys(mgr, 1)  # read: copied
    mgr.check_integrity()
    mgr.append_tokens("b", [])
    mgr.check_integrity()
    gs = mgr.requests["b"].groups[1]
    assert (gs.work, gs.read, gs.read_pos, gs.checkpoints) == (None, 20, 10, {})  # work page = checkpoint 10
    assert mgr.ref[1][20] == 1 and 20 not in cached_keys(mgr, 1)
    assert mgr.chunk_tokens("b", 10) == 10  # the rest of the prompt: one step
    t = mgr.allocate("b", 10)
    assert t.groups[0].page_ids == [0, 1, 2, 3, 4, 11, 12, 13, 14, 15]
    assert (t.groups[1].work_page, t.groups[1].read_page, t.groups[1].checkpoints) == (21, 20, {})
    assert (mgr.ref[1][21], mgr.ref[1][20]) == (1, 0)
    assert sorted(cached_keys(mgr, 1)) == [16, 17, 18, 19, 20]  # the junction checkpoint: evictable
    mgr.check_integrity()
    mgr.append_tokens("b", [2])
    mgr.check_integrity()
    mgr.free("b")
    mgr.add_request("c", P + list(range(300, 310)))
    assert mgr.lookup("c") == 10 and mgr.requests["c"].groups[1].read == 20


def test_the_step_ends_on_the_junction_only_after_a_state_hit_of_a_short_prompt():
    """No state hit (interval 16: hit 0), a long prompt (8+ intervals) and vLLM's protocol
    keep the full step (the junction checkpoint gets its own page)."""
    mgr = make_manager(hybrid(mamba(16)), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    assert (mgr.lookup("b"), mgr.requests["b"].junction, mgr.chunk_tokens("b", 12)) == (0, 10, 12)
    mgr = make_manager(hybrid(), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 230)))  # 40 tokens = 10 intervals
    assert (mgr.lookup("b"), mgr.requests["b"].junction, mgr.chunk_tokens("b", 12)) == (8, 10, 12)
    state = CopyForwardMambaSpec("toy", shapes=((64,),), dtypes=("bf16",), checkpoint_interval=4)
    mgr = make_manager(hybrid(state), 64, tokens_per_page=2)
    first_writer(mgr)
    mgr.add_request("b", P + list(range(200, 210)))
    assert (mgr.lookup("b"), mgr.requests["b"].junction, mgr.chunk_tokens("b", 12)) == (8, 10, 12)


def test_a_state_another_request_of_the_step_writes_gets_no_second_page():
    """b and c (no state hit, junction 10) run in one step: b takes the junction checkpoint
    page 29, c none (b writes that state); committed, d hits b's page.  A dropped step
    (b freed before its commit) leaves the state to the next writer."""
    def two_writers():
        mgr = make_manager(hybrid(mamba(16)), 64, tokens_per_page=2)
        first_writer(mgr)
        states = []
        for r, base in (("b", 200), ("c", 300)):
            mgr.add_request(r, P + list(range(base, base + 10)))
            assert (mgr.lookup(r), mgr.requests[r].junction, mgr.chunk_tokens(r, 20)) == (0, 10, 20)
            st = mgr.allocate(r, 20).groups[1]
            states.append((st.work_page, st.read_page, st.checkpoints))
            mgr.check_integrity()
        assert states == [(28, None, {10: 29}), (40, None, {})]
        return mgr

    mgr = two_writers()
    mgr.append_tokens("c", [5])
    mgr.append_tokens("b", [5])
    mgr.check_integrity()
    assert sorted(cached_keys(mgr, 1)) == [16, 29]
    mgr.add_request("d", P + list(range(400, 410)))
    assert mgr.lookup("d") == 10 and mgr.requests["d"].groups[1].read == 29
    mgr = two_writers()
    mgr.free("b")
    mgr.check_integrity()
    mgr.add_request("e", P + list(range(500, 510)))
    assert mgr.lookup("e") == 0
    assert mgr.allocate("e", 20).groups[1].checkpoints == {10: 28}  # its own page again
    mgr.check_integrity()


def test_vllm_protocol_writes_every_checkpoint_of_its_own():
    state = CopyForwardMambaSpec("toy", shapes=((64,),), dtypes=("bf16",), checkpoint_interval=16)
    mgr = make_manager(hybrid(state), 64, tokens_per_page=2)
    first_writer(mgr)
    for r, base in (("b", 200), ("c", 300)):
        mgr.add_request(r, P + list(range(base, base + 10)))
        mgr.lookup(r)
        assert list(mgr.allocate(r, 20).groups[1].checkpoints) == [10, 16, 20]  # c too
    mgr.check_integrity()


def test_the_junction_from_the_lookup_bound_is_the_full_attention_fixed_point():
    """``_find_junction`` takes the junction from ``_hash_for_lookup``'s bound instead of looking
    the page keys up again: on random prompts (shared prefixes of 0-40 tokens, some with
    ``max_tokens``, with live, cached and evicted pages) it equals the full-attention groups'
    own fixed point."""
    import random

    mgr = make_manager(hybrid(), 40, tokens_per_page=2)

    def check(req, prompt, cap, hit, bound):
        want = mgr.prefix_lookup.fixed_point(req, bound, mgr.junction.policies)
        assert req.junction == (want // 2 * 2 if want > hit else 0), (req.request_id, prompt, cap)
        return req.junction > 0

    checked = random_lookups(mgr, random.Random(3), check)
    assert checked > 20, f"only {checked} lookups found a junction (the test exercises little)"
