"""CopyForwardMambaPolicy (vLLM's align-mode state protocol): the checkpoint a step ends
on is registered at its commit but stays held by the request (its ``read`` page, the copy
source of the next step) until the following commit.  Exact page ids against MambaPolicy."""

from __future__ import annotations

from conftest import cached_keys, full, group, make_manager, model

from jenga.core.policy.registry import CopyForwardMambaPolicy, MambaPolicy
from jenga.core.specs import CopyForwardMambaSpec, MambaSpec


def manager(cls):
    state = cls("toy", shapes=((64,),), dtypes=("bf16",), checkpoint_interval=64)  # no periodic checkpoint
    return make_manager(model(group("full", full(), 1), group("m", state, 1, first_layer=1), max_len=32), 64)


def steps(mgr, checkpoints):
    """a: prompt of 10 in two steps (6 + 4: the second ends on the prompt-end checkpoint)."""
    mgr.add_request("a", list(range(10)))
    st = mgr.allocate("a", 6).groups[1]
    mgr.append_tokens("a", [])
    mgr.allocate("a", 4)
    assert (st.work_page, st.read_page, st.checkpoints) == (6, None, checkpoints)
    mgr.append_tokens("a", [10])
    return st


def test_policy_is_chosen_by_spec_type():
    assert type(manager(CopyForwardMambaSpec).policies[1]) is CopyForwardMambaPolicy
    assert type(manager(MambaSpec).policies[1]) is MambaPolicy


def test_checkpoint_reached_stays_held_until_the_next_commit():
    plain, fwd = manager(MambaSpec), manager(CopyForwardMambaSpec)
    st_plain, st = steps(plain, {}), steps(fwd, {10: 11})
    # plain (jenga's engine): the step ended on the checkpoint, so its work page 6 became it,
    # held until the next allocate (that step copies it into a fresh work page first)
    assert st_plain.read_page == 6 and cached_keys(plain, 1) == {} and plain.index.is_registered(1, 6)
    plain.allocate("a", 1)
    assert (st_plain.work_page, st_plain.read_page) == (12, 6) and cached_keys(plain, 1) == {6: (3, -10)}
    plain.check_integrity()
    # copy-forward: registered (a hit finds it) but held, so nothing can evict it yet
    assert st.read_page == 11 and st.checkpoints == {} and cached_keys(fwd, 1) == {}
    assert fwd.ref[1][11] == 1
    fwd.check_integrity()
    fwd.add_request("b", list(range(10)) + [7, 7])
    assert fwd.lookup("b") == 10
    tb = fwd.allocate("b", 2).groups[1]
    assert (tb.work_page, tb.read_page, tb.checkpoints) == (14, 11, {12: 15})
    assert fwd.ref[1][11] == 2
    fwd.allocate("a", 1)  # the step whose start copies 11 into a's work page 6
    assert st.read_page == 11
    fwd.append_tokens("a", [11])
    assert st.read_page is None and fwd.ref[1][11] == 1  # b still reads it
    fwd.free("a")
    fwd.append_tokens("b", [3])
    assert tb.read_page == 15  # b's own step ended on its prompt-end checkpoint 12
    fwd.free("b")
    assert cached_keys(fwd, 1) == {11: (4, -10), 15: (3, -12)}
    assert fwd.used_bytes == 0
    fwd.check_integrity()


def test_free_before_the_next_step_drops_the_held_checkpoint():
    mgr = manager(CopyForwardMambaSpec)
    steps(mgr, {10: 11})
    mgr.free("a")  # preempted right after the checkpoint step
    assert cached_keys(mgr, 1) == {11: (2, -10)} and mgr.used_bytes == 0
    mgr.check_integrity()
    plain = manager(MambaSpec)  # jenga's engine: the work page that became the checkpoint
    steps(plain, {})
    plain.free("a")
    assert cached_keys(plain, 1) == {6: (2, -10)} and plain.used_bytes == 0
    plain.check_integrity()


def step_end_manager(step_end_from: int):
    state = CopyForwardMambaSpec("toy", shapes=((64,),), dtypes=("bf16",), checkpoint_interval=64,
                                 step_end_from=step_end_from)
    return make_manager(model(group("full", full(), 1), group("m", state, 1, first_layer=1), max_len=32), 64)


def test_step_end_states_are_kept_from_step_end_from_on():
    """``step_end_from``: a prefill step ending inside the prompt, below its last block, at
    least that far in keeps its end state; a prompt sharing that much resumes there."""
    got = {}
    for first in (0, 6, 7):
        mgr = step_end_manager(first)
        mgr.add_request("a", list(range(20)))
        ends = []
        for n in (6, 6, 8):  # steps ending at 6, 12 and the prompt end 20
            ends.append(sorted(mgr.allocate("a", n).groups[1].checkpoints))
            mgr.append_tokens("a", [] if n != 8 else [99])
        mgr.free("a")
        mgr.add_request("b", list(range(15)) + [7, 7])
        got[first] = (ends, mgr.lookup("b"))
        mgr.check_integrity()
    assert got[0] == ([[], [], [20]], 0)  # the prompt end only: b (sharing 15 tokens) misses
    assert got[6] == ([[6], [12], [20]], 12)
    assert got[7] == ([[], [12], [20]], 12)
