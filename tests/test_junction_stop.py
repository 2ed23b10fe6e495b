"""Where a prefill step stops for a junction off vLLM's Mamba block grid (``jenga.vllm.junction_stop``):
the priced rule, and the manager's junction checkpoint moved where the caller's step ends
(``KVCacheManager.move_junction_checkpoint``), exact page ids on a tiny hybrid (2-token pages)."""

from __future__ import annotations

import pytest
from conftest import full, group, make_manager, mamba, model

from jenga.errors import InvalidArgumentError
from jenga.vllm.junction_stop import (
    JUNCTION_STOP_ENV,
    JunctionStop,
    junction_step_end,
    junction_stop_name,
    resumed_prompt_stop,
)

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


def test_where_vllms_steps_stop_for_a_request_resumed_with_output_tokens():
    """vLLM's ``_mamba_block_aligned_split`` (the same in 0.32-0.34) on a preempted request recomputing
    its outputs: the prompt's tail stop uses the prompt's own length, and a junction past the prompt
    is floored to whole Mamba blocks from where the request resumes."""
    # Jamba at match unit 16 (Mamba block 272 here): 2,329-token prompt + 14 outputs
    assert resumed_prompt_stop(2329, 2343, 16, 272) == 2320  # the tail, past the last block boundary 2,176
    assert resumed_prompt_stop(2336, 2343, 16, 272) == 2320  # a whole-block prompt: the block below it
    assert resumed_prompt_stop(2329, 2329, 16, 272) is None  # no outputs: jenga's default
    assert resumed_prompt_stop(540, 560, 16, 272) == 544  # the tail 528 is below the block boundary 544: that
    assert junction_step_end(2336, 2343, 2320, 272) == 2336  # inside the prompt: the junction itself
    assert junction_step_end(2336, 2329, 2320, 272) == 0  # past it, under a block from the hit: no stop
    assert junction_step_end(2900, 2329, 2320, 272) == 2320 + 2 * 272


def test_a_prompt_checkpoint_put_elsewhere_is_where_the_step_writes_the_state():
    """``add_request(prompt_checkpoint=...)``: a 27-token prompt in one step checkpoints its last full
    page (26) and the periodic 16 by default; given 12, 12 instead of 26, and a prompt sharing 14
    tokens resumes there; given 0, no prompt-end checkpoint.  A bad one is refused, nothing added."""
    def run(**kw):
        mgr = make_manager(model(group("full", full(), 1), group("mamba", mamba(16), 1, first_layer=1)), 64,
                           tokens_per_page=2)
        mgr.add_request("d", list(range(400, 427)), **kw)
        mgr.lookup("d")
        ckpts = sorted(mgr.allocate("d", 27).groups[1].checkpoints)
        mgr.append_tokens("d", [1])
        mgr.check_integrity()
        mgr.add_request("e", list(range(400, 414)) + [7, 7, 7])
        return mgr, ckpts, mgr.lookup("e")
    assert run()[1:] == ([16, 26], 0)
    assert run(prompt_checkpoint=12)[1:] == ([12, 16], 12)
    assert run(prompt_checkpoint=0)[1:] == ([16], 0)
    mgr = run()[0]
    for pos in (-2, 7, 28, "x"):
        with pytest.raises(InvalidArgumentError, match="prompt_checkpoint"):
            mgr.add_request("f", list(range(400, 427)), prompt_checkpoint=pos)
        assert "f" not in mgr.requests
    mgr.check_integrity()
