"""The closed-form capacity in jenga.capacity agrees with real allocations."""

import pytest

from jenga.baselines import make_manager
from jenga.capacity import max_concurrent_requests, max_context_tokens, pages_for_context
from jenga.core.specs import FullAttentionSpec, LayerGroup, ModelSpec, SlidingWindowSpec

FULL = FullAttentionSpec("m", "bf16", 1, 8)  # 32 B per token per layer
SWA = SlidingWindowSpec("m", "bf16", 1, 8, window=64)
MODEL = ModelSpec("toy", (LayerGroup("full", FULL, (0,)), LayerGroup("sliding", SWA, (1, 2, 3))),
                  max_model_len=1 << 20)


def grow(mgr, rid, length: int) -> bool:
    """Prefill ``length`` tokens page by page, then allocate the next token."""
    mgr.add_request(rid, list(range(length + 1)))
    done = 0
    while done < length:
        n = min(16, length - done)
        if mgr.allocate(rid, n) is None:
            return False
        done += n
        mgr.append_tokens(rid, [])
    return mgr.allocate(rid, 1) is not None


@pytest.mark.parametrize("name", ["jenga", "paged", "uniform", "static"])
def test_max_context_is_exact(name):
    mem = 1536 * 40
    mgr = make_manager(name, MODEL, mem, fit_pages=False, enable_prefix_caching=False)
    length = max_context_tokens(mgr)
    assert length > 0
    assert grow(mgr, "a", length), f"{name}: predicted {length} tokens fit but allocation failed"
    mgr.check_integrity()
    mgr2 = make_manager(name, MODEL, mem, fit_pages=False, enable_prefix_caching=False)
    bigger = length + 1
    while pages_for_context(mgr2, bigger) == pages_for_context(mgr2, length):
        bigger += 1
    assert not grow(mgr2, "a", bigger), f"{name}: {bigger} tokens should not fit"


def test_jenga_holds_longer_context_than_paged_on_sliding_model():
    mem = 1536 * 40
    jenga = make_manager("jenga", MODEL, mem, fit_pages=False, window_slack=0)
    paged = make_manager("paged", MODEL, mem)
    # paged keeps 4 layers per token; jenga keeps 1 layer per token plus a 64-token window in 3
    assert max_context_tokens(jenga) > 3 * max_context_tokens(paged)


def test_max_concurrent_requests_fit_for_real():
    mem = 1536 * 40
    mgr = make_manager("jenga", MODEL, mem, fit_pages=False, enable_prefix_caching=False)
    n = max_concurrent_requests(mgr, 100)
    assert n > 1
    assert all(grow(mgr, i, 100) for i in range(n))
    mgr.check_integrity()
    assert not grow(mgr, "one-more", 100)
