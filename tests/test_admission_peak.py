"""A whole-sequence admission check counts what the request's steps hold at once.

``KVCacheManager.can_allocate(rid, n, step=s)`` (vLLM's ``scheduler_reserve_full_isl`` through
the adapter) counts, per group, the most pages the request holds while it computes its next
``n`` tokens in steps of at most ``s`` (``Policy.peak_plan``: a sliding group its window plus a
step, a chunked group its chunk plus a step, full attention every token).  Checked here: the
closed form against a brute force over every step start, and at real layouts that a yes is
kept (every step's allocate then succeeds, the budget being the smallest that says yes) while
counting every page of the sequence would have said no there.
"""

from __future__ import annotations

import pytest

from jenga.baselines import make_manager
from jenga.core.specs import ChunkedLocalSpec, FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec
from jenga.errors import InvalidArgumentError


def _policies(tpp: int):
    specs = [FullAttentionSpec("m", "bf16", 1, 8), SlidingWindowSpec("m", "bf16", 1, 8, window=70),
             SlidingWindowSpec("m", "bf16", 1, 8, window=16), ChunkedLocalSpec("m", "bf16", 1, 8, chunk=48),
             ChunkedLocalSpec("m", "bf16", 1, 8, chunk=8)]
    model = ModelSpec("toy", tuple(LayerGroup(f"g{i}", s, (i,)) for i, s in enumerate(specs)), max_model_len=1 << 20)
    return make_manager("jenga", model, 1 << 24, tokens_per_page=tpp, fit_pages=False).policies


@pytest.mark.parametrize("tpp", [8, 16])
def test_peak_pages_over_steps_is_the_most_any_step_holds(tpp):
    """``peak_pages(length, step)`` = the max over every step start ``l <= length`` of the pages
    held while computing ``[l, min(l + step, length + 1))``; ``step=1`` is the old count."""
    for pol in _policies(tpp):
        for length in list(range(0, 200, 7)) + [255, 256, 257, 1000]:
            for step in (1, 3, 8, 16, 47, 64, 100, 2048):
                brute = max(pol.footprint.step_pages(s, min(s + step, length + 1)) for s in range(length + 1))
                assert pol.footprint.peak_pages(length, step) == brute, (pol.group.name, length, step)
            assert pol.footprint.peak_pages(length) == max(pol.footprint.context_pages(n) for n in range(length + 1))


def _run_in_steps(mgr, rid: str, length: int, step: int) -> bool:
    """Allocate ``length`` tokens of ``rid`` in steps of ``step`` (committing each), then the next token."""
    done = 0
    while done < length:
        n = min(step, length - done)
        if mgr.allocate(rid, n) is None:
            return False
        done += n
        mgr.append_tokens(rid, [])
    return True


def _smallest_yes(model, length: int, step: int, **kw):
    """The smallest budget (in large pages) whose manager says yes to ``length`` tokens in steps
    of ``step``, and that manager (the request added, nothing allocated)."""
    def mgr_of(large: int):
        probe = make_manager("jenga", model, 1 << 30, **kw)
        mgr = make_manager("jenga", model, (large + 1) * probe.large_page_bytes, **kw)
        mgr.add_request("r", list(range(3, length + 3)))
        return mgr

    lo, hi = 0, 1
    while not mgr_of(hi).can_allocate("r", length, step=step):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mgr_of(mid).can_allocate("r", length, step=step) else (mid, hi)
    return mgr_of(hi)


@pytest.mark.parametrize("name,length,step", [
    ("gemma-3-12b", 12428, 2048), ("gpt-oss-20b", 9000, 512), ("ministral-8b", 48000, 4096),
    ("llama-4-scout", 20000, 2048), ("jamba-1.5-mini", 6000, 1024)])
@pytest.mark.parametrize("caching", [True, False])
def test_a_yes_is_kept_by_every_step(name, length, step, caching):
    """At the smallest budget that says yes, every step's allocate succeeds (nothing else runs),
    and on windowed layouts counting every page of the sequence says no there (the stall)."""
    model = ModelSpec.from_hf_config(name, vision=False)
    kw = dict(enable_prefix_caching=caching)
    mgr = _smallest_yes(model, length, step, **kw)
    assert _run_in_steps(mgr, "r", length, step), f"{name}: said yes, then a step of {step} failed"
    mgr.check_integrity()
    windowed = any(g.spec.kind in ("sliding", "chunked") for g in model.groups)
    fresh = _smallest_yes(model, length, step, **kw)
    assert fresh.can_allocate("r", length, step=step)
    assert fresh.can_allocate("r", length) is not windowed


def test_a_yes_after_a_prefix_hit_is_kept():
    """A request resuming a cached prefix (its window pages held by the hit) counts them too."""
    model = ModelSpec.from_hf_config("gemma-3-12b", vision=False)
    probe = make_manager("jenga", model, 1 << 30)
    for large in range(60, 400, 10):
        mgr = make_manager("jenga", model, large * probe.large_page_bytes)
        doc = list(range(3, 6003))
        mgr.add_request("a", doc + [1])
        if not _run_in_steps(mgr, "a", 6001, 2048):
            continue
        mgr.free("a")
        mgr.add_request("b", doc + list(range(7000, 13000)))
        hit = mgr.lookup("b")
        assert hit > 0
        if mgr.can_allocate("b", 12000 - hit, step=2048):
            assert _run_in_steps(mgr, "b", 12000 - hit, 2048)
            mgr.check_integrity()
            return
    pytest.fail("no budget admitted the second request")


def test_a_step_of_no_tokens_is_refused():
    model = ModelSpec.from_hf_config("gpt-oss-20b")
    mgr = make_manager("jenga", model, 1 << 28)
    mgr.add_request("r", [5] * 100)
    with pytest.raises(InvalidArgumentError, match="step"):
        mgr.can_allocate("r", 100, step=0)
    assert mgr.allocate("r", 100) is not None  # nothing changed
