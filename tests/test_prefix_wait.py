"""Holding an admission one step for a prefix a step in flight computes (``jenga.vllm.prefix_wait``):
the manager's hit once the steps in flight commit (``cached_tokens(..., in_flight=True)``), and the
priced rule on top of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import full, group, make_manager, mamba, model

from jenga.errors import InvalidArgumentError
from jenga.vllm.prefix_wait import (
    PREFIX_WAIT_ENV,
    PREFIX_WAIT_STOPS_ENV,
    PrefixWait,
    prefix_wait_name,
    prefix_wait_stops,
)

P = list(range(10))  # a shared prefix


def hybrid(every: int = 8):
    return model(group("full", full(), 1), group("mamba", mamba(every), 1, first_layer=1))


def test_the_hit_after_the_steps_in_flight_counts_the_checkpoints_they_write():
    """``a`` computes the shared prefix in this step: its attention pages are findable from the
    allocate, its state checkpoint at 8 only from the commit.  ``b`` hits nothing now, 8 once
    ``a``'s step commits; the in-flight answer says so before, and equals the answer after."""
    mgr = make_manager(hybrid(8), 64)
    mgr.add_request("a", P + [100, 101, 102, 103, 104])
    assert mgr.lookup("a") == 0
    mgr.allocate("a", 15)
    mgr.add_request("b", P + [200, 201, 202, 203])
    assert mgr.cached_tokens("b") == 0
    assert mgr.cached_tokens("b", in_flight=True) == 8
    mgr.append_tokens("a", [1])
    assert mgr.cached_tokens("b") == mgr.cached_tokens("b", in_flight=True) == 8
    mgr.free("a")
    assert mgr.cached_tokens("b", in_flight=True) == 8
    mgr.check_integrity()


def test_a_dropped_step_writes_nothing_the_in_flight_hit_counts():
    mgr = make_manager(hybrid(8), 64)
    mgr.add_request("a", P + [100, 101, 102, 103, 104])
    mgr.lookup("a")
    mgr.allocate("a", 15)
    mgr.free("a")  # before its commit: no checkpoint will be written
    mgr.add_request("b", P + [200, 201, 202, 203])
    assert mgr.cached_tokens("b", in_flight=True) == 0
    mgr.check_integrity()


def _req(rid="r", computed=0, preempted=0):
    return SimpleNamespace(request_id=rid, num_computed_tokens=computed, num_preemptions=preempted)


def test_priced_hold_weighs_the_recompute_saved_by_every_request_against_one_step():
    hits = {False: 100, True: 612}  # 512 tokens saved by waiting
    wait = PrefixWait(lambda r, in_flight: hits[in_flight], lambda: True, step_tokens=8192, max_waits=2)
    assert wait.holds(_req(), 16)  # 512 x 16 = one step's tokens: worth it
    assert not wait.holds(_req("lone"), 15)  # too few requests wait on the recompute
    assert not wait.holds(_req("p", preempted=1), 200) and not wait.holds(_req("c", computed=16), 200)
    assert wait.holds(_req(), 200) and not wait.holds(_req(), 200)  # at most max_waits steps
    wait.forget("r")
    assert wait.holds(_req(), 200)
    always = PrefixWait(lambda r, in_flight: hits[in_flight], lambda: True, step_tokens=8192, priced=False)
    assert always.holds(_req("lone"), 1)
    idle = PrefixWait(lambda r, in_flight: hits[in_flight], lambda: False, step_tokens=8192)
    assert not idle.holds(_req(), 200)  # nothing written in flight: no probe, no hold
    same = PrefixWait(lambda r, in_flight: 100, lambda: True, step_tokens=8192)
    assert not same.holds(_req(), 10_000)


def test_the_queue_behind_a_long_held_request_waits_from_the_usage_given():
    usage = [0.2]
    wait = PrefixWait(lambda r, in_flight: 0, lambda: True, step_tokens=8192, usage=lambda: usage[0],
                      stops_from=1 / 3)
    long, short = SimpleNamespace(num_tokens=4096), SimpleNamespace(num_tokens=4095)
    assert not wait.stops(long)  # most of the pool free: the others' pages leave room for the held one
    usage[0] = 1 / 3
    assert wait.stops(long)
    assert not wait.stops(short)  # under half a step's tokens: the others go on
    assert not PrefixWait(lambda r, f: 0, lambda: True, step_tokens=8192, usage=lambda: 1.0).stops(long)  # never
    with pytest.raises(InvalidArgumentError, match="stops_from"):
        PrefixWait(lambda r, f: 0, lambda: True, step_tokens=8192, stops_from=-1)


def test_misses_wait_behind_a_long_prompt_admitted_this_step_that_others_will_read():
    usage = [0.5]
    wait = PrefixWait(lambda r, in_flight: 0, lambda: True, step_tokens=8192, usage=lambda: usage[0],
                      stops_from=1 / 3)

    def admitted(prompt, hit=0):
        return SimpleNamespace(num_prompt_tokens=prompt, num_computed_tokens=hit)

    miss, hit = (lambda: 0), (lambda: 16)
    wait.new_step()
    wait.leads(admitted(4096), readers=0)  # nobody waits to read it
    wait.leads(admitted(8192, hit=4097), readers=5)  # 4,095 to compute: under half a step
    assert not wait.skips(miss)
    wait.leads(admitted(8192, hit=4096), readers=1)
    assert wait.skips(miss)
    assert not wait.skips(hit)  # a request with a hit of its own goes on
    usage[0] = 0.3
    assert not wait.skips(miss)  # most of the pool free: room for the readers too
    usage[0] = 0.5
    wait.new_step()
    assert not wait.skips(miss)  # a new step: nothing admitted in it yet
    never = PrefixWait(lambda r, f: 0, lambda: True, step_tokens=8192, usage=lambda: 1.0)
    never.leads(admitted(8192), readers=3)
    assert not never.skips(miss)


def test_the_switch_is_checked(monkeypatch):
    monkeypatch.setenv(PREFIX_WAIT_ENV, "sometimes")
    with pytest.raises(InvalidArgumentError, match="JENGA_VLLM_PREFIX_WAIT"):
        prefix_wait_name()
    monkeypatch.setenv(PREFIX_WAIT_ENV, "off")
    assert prefix_wait_name() == "off"
    monkeypatch.delenv(PREFIX_WAIT_STOPS_ENV, raising=False)
    assert prefix_wait_stops() == pytest.approx(1 / 3)
    monkeypatch.setenv(PREFIX_WAIT_STOPS_ENV, "always")
    assert prefix_wait_stops() == 0
    monkeypatch.setenv(PREFIX_WAIT_STOPS_ENV, "never")
    assert prefix_wait_stops() == float("inf")
    monkeypatch.setenv(PREFIX_WAIT_STOPS_ENV, "sometimes")
    with pytest.raises(InvalidArgumentError, match="JENGA_VLLM_PREFIX_WAIT_STOPS"):
        prefix_wait_stops()
    with pytest.raises(InvalidArgumentError):
        PrefixWait(lambda r, f: 0, lambda: True, step_tokens=0)
