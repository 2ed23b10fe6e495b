"""``KVCacheManager.pool`` (what outer layers read of the pool) and the per-kind request records."""

from __future__ import annotations

import dataclasses

import pytest

from jenga.baselines import MANAGER_NAMES, make_manager
from jenga.core.request import CheckpointState, ImageState, TokenState
from jenga.core.specs import ModelSpec
from jenga.engine.tiny import tiny_hf_config


@pytest.mark.parametrize("name", MANAGER_NAMES)
def test_pool_describes_the_allocator(name):
    mgr = make_manager(name, ModelSpec.from_hf_config(tiny_hf_config("tiny-jamba")), 1 << 20)
    pool, a = mgr.pool, mgr.alloc
    assert (pool.num_large_pages, pool.large_page_bytes) == (a.num_large, a.large_page_bytes)
    assert list(pool.small_per_large) == a.small_per_large and list(pool.page_bytes) == a.page_bytes
    assert pool.large_page_caps == (None if a.caps is None else tuple(a.caps))
    assert (pool.large_page_caps is not None) == (name == "static")
    assert pool.total_bytes == mgr.total_bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.num_large_pages = 1  # type: ignore[misc]


def test_each_kind_has_its_own_record():
    mgr = make_manager("jenga", ModelSpec.from_hf_config(tiny_hf_config("tiny-mllama")), 4 << 20)
    mgr.add_request("r", list(range(1, 20)))
    kinds = {g.kind: type(gs) for g, gs in zip(mgr.model.groups, mgr.requests["r"].groups, strict=True)}
    want = {"full": TokenState, "sliding": TokenState, "chunked": TokenState, "cross": ImageState,
            "vision": ImageState, "mamba": CheckpointState}
    assert "cross" in kinds and all(t is want[k] for k, t in kinds.items()), kinds
    assert not hasattr(TokenState(), "checkpoints") and not hasattr(CheckpointState(), "pages")
