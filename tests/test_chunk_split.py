"""The chunk split (``KVCacheManager.chunk_tokens``, ``jenga.core.manager.cache_control``): a step crossing a
state group's prompt-end checkpoint ends on it, so the step's work page becomes that
checkpoint (one state page live, not two); exact on a tiny hybrid with 4-token pages."""

from __future__ import annotations

import pytest
from conftest import full, group, make_manager, mamba, model

from jenga.errors import InvalidArgumentError, UnknownRequestError
from jenga.sched.sampling_params import SamplingParams
from jenga.sched.scheduler import Scheduler
from jenga.sched.sequence import Sequence

PROMPT = list(range(100, 119))  # 19 tokens: the prompt-end checkpoint is at 16 (4-token pages)


def hybrid():
    return model(group("full", full(), 1), group("mamba", mamba(8), 1, first_layer=1))


def test_a_step_crossing_the_prompt_end_checkpoint_ends_on_it():
    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    mgr.add_request("a", PROMPT)
    assert mgr.lookup("a") == 0
    assert [mgr.chunk_tokens("a", n) for n in (0, 1, 10, 15, 16, 17, 19)] == [0, 1, 10, 15, 16, 16, 16]
    mgr.allocate("a", 10)
    mgr.append_tokens("a", [])
    assert [mgr.chunk_tokens("a", n) for n in (5, 6, 7, 9)] == [5, 6, 6, 6]
    mgr.allocate("a", 6)
    mgr.append_tokens("a", [])
    assert mgr.chunk_tokens("a", 3) == 3  # past the checkpoint: the prompt's last tokens
    mgr.allocate("a", 3)
    mgr.append_tokens("a", [7])
    assert mgr.chunk_tokens("a", 1) == 1  # decode
    mgr.check_integrity()


def test_split_step_holds_one_state_page_where_the_unsplit_one_holds_two():
    """Exact pages of the state group: the unsplit step [0, 19) holds the work page and
    checkpoints 8 and 16; the split step [0, 16) holds the work page and 8 only, its work
    page becomes checkpoint 16 at the commit, and the step [16, 19) copies it into a fresh
    work page and lets go of it (cached)."""
    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    mgr.add_request("u", PROMPT)
    mgr.lookup("u")
    st = mgr.allocate("u", 19).groups[1]
    assert (st.work_page, st.read_page, st.checkpoints) == (20, None, {8: 21, 16: 22})
    mgr.free("u")

    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    mgr.add_request("a", PROMPT)
    mgr.lookup("a")
    n = mgr.chunk_tokens("a", 19)
    st = mgr.allocate("a", n).groups[1]
    assert (n, st.work_page, st.read_page, st.checkpoints) == (16, 16, None, {8: 17})
    mgr.append_tokens("a", [])
    assert (st.work_page, st.read_page) == (16, 16) and mgr.index.is_registered(1, 16)
    st = mgr.allocate("a", mgr.chunk_tokens("a", 3)).groups[1]
    assert (st.work_page, st.read_page, st.checkpoints) == (18, 16, {})
    assert mgr.ref[1][16] == 0 and mgr.ref[1][18] == 1  # checkpoint 16 let go of, cached
    mgr.check_integrity()
    mgr.append_tokens("a", [7])
    mgr.free("a")
    mgr.add_request("b", PROMPT + [1, 2])
    assert mgr.lookup("b") == 16  # the checkpoint the work page became
    mgr.check_integrity()


def test_after_a_hit_the_first_step_ends_on_the_prompt_end():
    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    mgr.add_request("a", PROMPT[:9])
    mgr.lookup("a")
    mgr.allocate("a", 9)
    mgr.append_tokens("a", [1])
    mgr.free("a")
    mgr.add_request("b", PROMPT)
    assert mgr.lookup("b") == 8
    assert [mgr.chunk_tokens("b", n) for n in (7, 8, 9, 11)] == [7, 8, 8, 8]


@pytest.mark.parametrize("case", ["no state group", "no caching", "aligned prompt", "prompt under a page"])
def test_nothing_to_align_leaves_the_chunk_unchanged(case):
    spec = model(group("full", full(), 1)) if case == "no state group" else hybrid()
    mgr = make_manager(spec, 64, tokens_per_page=4, caching=case != "no caching")
    prompt = {"aligned prompt": PROMPT[:16], "prompt under a page": PROMPT[:3]}.get(case, PROMPT)
    mgr.add_request("a", prompt)
    mgr.lookup("a")
    assert mgr.chunk_tokens("a", len(prompt)) == len(prompt)


def test_bad_arguments_are_refused():
    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    with pytest.raises(UnknownRequestError):
        mgr.chunk_tokens("nobody", 4)
    mgr.add_request("a", PROMPT)
    for bad in (-1, 2.0, True):
        with pytest.raises(InvalidArgumentError):
            mgr.chunk_tokens("a", bad)


def test_the_engine_scheduler_ends_the_prefill_step_on_the_checkpoint():
    mgr = make_manager(hybrid(), 64, tokens_per_page=4)
    sched = Scheduler(mgr, max_num_batched_tokens=64)
    seq = Sequence("a", PROMPT, SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add(seq)
    got = []
    while sched.has_unfinished:
        plan = sched.schedule()
        got.append([(s.start, s.num_tokens, s.sample) for s in plan.scheduled])
        sched.update(plan, [5 if s.sample else None for s in plan.scheduled])
    assert got == [[(0, 16, False)], [(16, 3, True)], [(19, 1, True)]]
    mgr.check_integrity()
