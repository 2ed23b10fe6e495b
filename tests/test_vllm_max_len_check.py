"""``JengaScheduler``'s start check (``check_max_model_len_fits``) counts what one request of
``max_model_len`` tokens really holds at once with the scheduler's step (``max_num_batched_tokens``
plus the lookahead): a sliding window holds its window plus a step's tokens, never the window alone.
The check agrees with the manager's own allocates: where it refuses, a request in steps of that size
runs out of pages; where it accepts, the request runs to ``max_model_len``."""

from __future__ import annotations

import pytest
from conftest import group, make_manager, model, sliding

from jenga.errors import InsufficientMemoryError
from jenga.vllm.scheduler import check_max_model_len_fits

MAX_LEN, WINDOW, STEP = 256, 8, 64
SPEC = model(group("swa", sliding(WINDOW), 2), max_len=MAX_LEN)


def runs_through(num_large: int, step: int) -> bool:
    """Whether one request of ``MAX_LEN`` tokens, computed ``step`` tokens at a time, gets every allocate."""
    mgr = make_manager(SPEC, num_large, tokens_per_page=2)
    mgr.add_request("r", list(range(MAX_LEN)))
    done = 0
    while done < MAX_LEN:
        n = min(step, MAX_LEN - done)
        if mgr.allocate("r", n) is None:
            return False
        mgr.append_tokens("r", [])
        done += n
    return True


def accepted(num_large: int, step: int) -> bool:
    try:
        check_max_model_len_fits(make_manager(SPEC, num_large, tokens_per_page=2), MAX_LEN, step=step)
    except InsufficientMemoryError:
        return False
    return True


@pytest.mark.parametrize("step", [1, 16, STEP])
def test_the_start_check_agrees_with_the_steps_allocates(step):
    sizes = range(1, 40)
    # the smallest pool the check accepts runs the request; the one below it does not
    least = next(n for n in sizes if accepted(n, step))
    assert runs_through(least, step)
    assert least == 1 or not runs_through(least - 1, step)


def test_a_step_of_many_tokens_needs_more_than_the_window():
    """One token a step the window's pages suffice; 64 tokens a step hold the window plus 64 tokens,
    and the check refuses the pool where those steps' allocates fail (it accepted it while it
    counted one-token steps)."""
    one = next(n for n in range(1, 40) if accepted(n, 1))
    assert not runs_through(one, STEP)
    assert not accepted(one, STEP)
