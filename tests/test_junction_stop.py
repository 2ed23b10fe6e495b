"""Where a prefill step stops for a junction off vLLM's Mamba block grid (``jenga.vllm.junction_stop``):
the priced rule, and the manager's junction checkpoint moved where the caller's step ends
(``KVCacheManager.move_junction_checkpoint``), exact page ids on a tiny hybrid (2-token pages)."""

from __future__ import annotations

import pytest
from conftest import full, group, make_manager, mamba, model

from jenga.errors import InvalidArgumentError
from jenga.vllm.junction_stop import JUNCTION_STOP_ENV, JunctionStop, junction_stop_name

P = list(range(10))  # a shared prefix: the junction of a request continuing it elsewhere is 10


def test_priced_stop_weighs_the_recompute_saved_by_every_request_against_one_step():
    n = {"requests": 40}
    stop = JunctionStop(80, step_tokens=8192, num_requests=lambda: n["requests"])
    # 1,488 is 48 tokens past the boundary 1,440: 48 x 40 requests < a step's 8,192 tokens
    assert stop.stop(1488, 0) == 1440
    n["requests"] = 171  # 48 x 171 >= 8,192: worth the request's extra step
    assert stop.stop(1488, 0) == 1488
    n["requests"] = 128  # 64 x 128 = 8,192: just worth it; one request fewer, not
    assert stop.stop(1504, 0) == 1504
    n["requests"] = 127
    assert stop.stop(1504, 0) == 1440
    n["requests"] = 1
    assert stop.stop(1440, 0) == 1440  # on the grid: no extra step, kept
    assert stop.stop(0, 0) == 0  # no junction
    assert stop.stop(1488, 1456) == 0  # the boundary below is under the hit: no junction stop
    # a short system prompt below the block: the whole prompt saved per request
    n["requests"] = 200
    assert JunctionStop(1024, step_tokens=8192, num_requests=lambda: n["requests"]).stop(496, 0) == 496
    n["requests"] = 16
    assert JunctionStop(1024, step_tokens=8192, num_requests=lambda: n["requests"]).stop(496, 0) == 0


def test_requests_known_to_wait_for_the_prefix_each_save_its_recompute():
    """Readers: the queued requests whose prompts hold the prefix up to the junction (at least
    one, the sibling a junction implies)."""
    stop = JunctionStop(80, step_tokens=8192, num_requests=lambda: 40)
    assert stop.stop(1488, 0, readers=0) == stop.stop(1488, 0, readers=1) == 1440  # 48 x 40 < 8,192
    assert stop.stop(1488, 0, readers=4) == 1440  # 48 x 4 x 40 = 7,680
    assert stop.stop(1488, 0, readers=5) == 1488  # 9,600: five queued siblings resume 48 tokens later


def test_exact_and_grid_rules():
    many = lambda: 10_000  # noqa: E731
    assert JunctionStop(80, step_tokens=8192, num_requests=many, rule="exact").stop(1488, 0) == 1488
    assert JunctionStop(80, step_tokens=8192, num_requests=many, rule="grid").stop(1488, 0) == 1440
    with pytest.raises(InvalidArgumentError, match="rule"):
        JunctionStop(80, step_tokens=8192, num_requests=many, rule="floor")
    with pytest.raises(InvalidArgumentError, match="block"):
        JunctionStop(0, step_tokens=8192, num_requests=many)


def test_env_names_the_rule(monkeypatch):
    monkeypatch.delenv(JUNCTION_STOP_ENV, raising=False)
    assert junction_stop_name() == "priced"
    monkeypatch.setenv(JUNCTION_STOP_ENV, "grid")
    assert junction_stop_name() == "grid"
    monkeypatch.setenv(JUNCTION_STOP_ENV, "nope")
    with pytest.raises(InvalidArgumentError, match=JUNCTION_STOP_ENV):
        junction_stop_name()


def _after_first_writer():
    """a: P + 6 tokens in one step, freed (attention pages cached; no state checkpoint at 8 or 10:
    interval 16); b continues P elsewhere: no state hit, junction 10."""
    mgr = make_manager(model(group("full", full(), 1), group("mamba", mamba(16), 1, first_layer=1)), 64,
                       tokens_per_page=2)
    mgr.add_request("a", P + [100, 101, 102, 103, 104, 105])
    assert mgr.lookup("a") == 0
    mgr.allocate("a", 16)
    mgr.append_tokens("a", [1])
    mgr.free("a")
    mgr.add_request("b", P + list(range(200, 210)))
    assert (mgr.lookup("b"), mgr.requests["b"].junction) == (0, 10)
    return mgr


def test_a_moved_junction_checkpoint_lies_where_the_step_stops():
    """Unmoved, b's step over [0, 20) checkpoints the junction 10; moved to 8 (the caller's step
    stops there), it checkpoints 8, and a later request continuing P resumes there."""
    mgr = _after_first_writer()
    assert list(mgr.allocate("b", 20).groups[1].checkpoints) == [10]
    mgr = _after_first_writer()
    mgr.move_junction_checkpoint("b", 8)
    assert list(mgr.allocate("b", 20).groups[1].checkpoints) == [8]
    mgr.append_tokens("b", [1])
    mgr.check_integrity()
    mgr.add_request("c", P + list(range(300, 310)))
    assert mgr.lookup("c") == 8
    mgr = _after_first_writer()
    mgr.move_junction_checkpoint("b", 0)  # none: the step writes no junction state
    assert list(mgr.allocate("b", 20).groups[1].checkpoints) == []
    mgr.check_integrity()


def test_the_next_lookup_puts_the_checkpoint_back_on_the_junction():
    mgr = _after_first_writer()
    mgr.move_junction_checkpoint("b", 8)
    assert mgr.lookup("b") == 0
    assert list(mgr.allocate("b", 20).groups[1].checkpoints) == [10]


def test_bad_moves_are_refused_before_any_change():
    mgr = _after_first_writer()
    for pos in (-2, 9, 12):  # negative, not a page multiple, past the junction
        with pytest.raises(InvalidArgumentError, match="junction checkpoint"):
            mgr.move_junction_checkpoint("b", pos)
    assert mgr.requests["b"].junction_checkpoint is None
    mgr.allocate("b", 20)
    with pytest.raises(InvalidArgumentError, match="allocated: True"):
        mgr.move_junction_checkpoint("b", 8)
    mgr.check_integrity()
