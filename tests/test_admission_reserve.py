"""An admission check that leaves the pages admitted prompts still need.

``KVCacheManager.can_allocate(rid, n, step=s, reserve=True)`` (vLLM's whole-prompt admission check
under ``JENGA_VLLM_RESERVE=prefill``) counts as taken the pages the allocated requests still need
to reach their prompt's end (the most their steps hold at once).  Checked here, at every budget:
its yes is the plain check's yes once those prompts are computed (with full attention only, its
answer is that answer); it changes nothing; a computed prompt reserves nothing.
"""

from __future__ import annotations

import pytest

from jenga.baselines import make_manager
from jenga.core.specs import FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec

TPP = 16


def _model(sliding: bool) -> ModelSpec:
    specs = [FullAttentionSpec("m", "bf16", 1, 8)] + ([SlidingWindowSpec("m", "bf16", 1, 8, window=48)]
                                                      if sliding else [])
    return ModelSpec("toy", tuple(LayerGroup(f"g{i}", s, (i,)) for i, s in enumerate(specs)), max_model_len=4096)


def _manager(model: ModelSpec, large: int):
    """A pool of ``large`` large pages: request a admitted with its first chunk of a 400-token prompt,
    request b (160 tokens) added; ``None`` where a's first chunk does not fit."""
    probe = make_manager("jenga", model, 1 << 24, tokens_per_page=TPP, fit_pages=False)
    mgr = make_manager("jenga", model, large * probe.large_page_bytes, tokens_per_page=TPP, fit_pages=False)
    mgr.add_request("a", list(range(3, 403)))  # a 400-token prompt, admitted with its first chunk
    if mgr.allocate("a", 64) is None:
        return None
    mgr.append_tokens("a", [])
    mgr.add_request("b", list(range(5000, 5160)))  # a 160-token prompt asking to be admitted
    return mgr


def _prompt_done(mgr, rid: str, step: int) -> bool:
    """Compute the rest of ``rid``'s prompt in steps of ``step``; False where an allocate fails."""
    req = mgr.requests[rid]
    while req.start < req.prompt_len:
        if mgr.allocate(rid, min(step, req.prompt_len - req.start)) is None:
            return False
        mgr.append_tokens(rid, [])
    return True


@pytest.mark.parametrize("sliding", [False, True])
def test_a_reserved_check_says_yes_only_where_the_request_fits_once_the_admitted_prompts_are_computed(sliding):
    model, step = _model(sliding), 64
    answers = set()
    for large in range(8, 60):
        mgr = _manager(model, large)
        if mgr is None:
            continue
        before = mgr.check_integrity()
        reserved = mgr.can_allocate("b", 160, step=step, reserve=True)
        plain = mgr.can_allocate("b", 160, step=step)
        assert mgr.check_integrity() == before  # asking changes nothing
        assert plain or not reserved  # reserving only takes pages away
        if not _prompt_done(mgr, "a", step):
            assert not reserved, large  # the admitted prompt itself does not fit: nothing is left for b
            continue
        after = mgr.can_allocate("b", 160, step=step)
        # full attention holds at its prompt's end the most it ever holds: the same answer; a sliding
        # group holds more while its steps compute (a window plus a step) than at the end: the reserve
        # keeps that peak, so its yes is a yes afterwards too
        assert after == reserved if not sliding else after or not reserved, large
        assert mgr.can_allocate("b", 160, step=step, reserve=True) == after, large  # nothing pending now
        answers.add((plain, reserved))
    assert (True, False) in answers and (True, True) in answers  # the budgets where the reserve decides, and not


def test_the_reserve_counts_nothing_for_the_request_asking():
    """A request's own first chunk allocated: it is no admission any more, and no other prompt is pending."""
    mgr = _manager(_model(False), 40)
    assert _prompt_done(mgr, "a", 64)
    assert mgr.allocate("b", 32) is not None
    mgr.append_tokens("b", [])
    assert mgr.can_allocate("b", 128, step=64, reserve=True) == mgr.can_allocate("b", 128, step=64)
