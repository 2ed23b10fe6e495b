"""The engine's host pool on its own: copy plans of every page kind move exactly the page's bytes.

A device layout of a model with full, sliding, Mamba and vision-embedding groups is filled with
random bytes; pages are demoted, the device pages overwritten, and promoted into other device
pages: each promoted page equals its original byte for byte, and no other byte of either buffer
changes.  Runs on CPU (the same code path as CUDA, without pinning); the engine tests prove it
under the real manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from conftest import full, group, mamba, model, sliding, vision

from jenga.core.layout import KVLayout
from jenga.engine.host_pool import HostKVPool


@dataclass
class Plan:  # the manager's copy-plan shape: per group (n, 2) int arrays
    demote: dict = field(default_factory=dict)
    promote: dict = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(len(v) for v in (*self.demote.values(), *self.promote.values()))


def four_kinds():
    return model(group("full", full(), 2), group("slide", sliding(4), 3, first_layer=2),
                 group("ssm", mamba(8, state_elems=96), 2, first_layer=5), group("img", vision(32), 1, first_layer=7))


def pages_in(spec, gi: int, large: int, rng) -> np.ndarray:
    """Three distinct small pages of group ``gi`` inside large page ``large``."""
    k = spec.large_page_bytes // spec.groups[gi].page_bytes
    return large * k + rng.choice(k, size=min(3, k), replace=False)


def test_demote_then_promote_moves_each_page_exactly():
    spec = four_kinds()
    dev = KVLayout(spec, 6)
    gen = torch.Generator().manual_seed(0)
    dev.buffer.copy_(torch.randint(0, 256, dev.buffer.shape, dtype=torch.uint8, generator=gen))
    pool = HostKVPool(spec, dev, 4)
    assert pool.layout.buffer.device.type == "cpu" and not pool.pinned
    rng = np.random.default_rng(1)
    demote, promote, want = {}, {}, {}
    for gi in range(len(spec.groups)):  # as the allocator carves them: each group in its own large pages
        src = pages_in(spec, gi, gi, rng)
        host = pages_in(spec, gi, gi, rng)
        demote[gi] = np.stack([src, host], axis=1)
        want[gi] = [dev.buffer[slice(*dev.byte_range(gi, int(s)))].clone() for s in src]
    pool.execute(Plan(demote=demote))
    for gi in demote:
        for (_, h), w in zip(demote[gi], want[gi], strict=True):
            assert torch.equal(pool.page_bytes_of(gi, int(h)), w)
    dev.buffer.zero_()
    for gi in range(len(spec.groups)):  # promote into other device pages than the demoted ones
        dst = pages_in(spec, gi, 5 - gi, rng)
        promote[gi] = np.stack([demote[gi][:, 1], dst], axis=1)
    pool.execute(Plan(promote=promote))
    touched = torch.zeros(dev.total_bytes, dtype=torch.bool)
    for gi in promote:
        for (_, d), w in zip(promote[gi], want[gi], strict=True):
            lo, hi = dev.byte_range(gi, int(d))
            assert torch.equal(dev.buffer[lo:hi], w)
            touched[lo:hi] = True
    assert int(dev.buffer[~touched].count_nonzero()) == 0  # nothing else written
    c = pool.counters
    assert c.pages_demoted == c.pages_promoted == sum(len(p) for p in demote.values())
    assert c.bytes_demoted == c.bytes_promoted == sum(len(demote[gi]) * g.page_bytes for gi, g in enumerate(spec.groups))


def test_a_promote_reads_a_page_demoted_by_the_same_plan():
    spec = four_kinds()
    dev = KVLayout(spec, 4)
    dev.buffer.copy_(torch.arange(dev.total_bytes, dtype=torch.int64).remainder(251).to(torch.uint8))
    pool = HostKVPool(spec, dev, 2)
    lo, hi = dev.byte_range(0, 1)
    before = dev.buffer[lo:hi].clone()
    pool.execute(Plan(demote={0: np.array([[1, 0]])}, promote={0: np.array([[0, 3]])}))
    lo3, hi3 = dev.byte_range(0, 3)
    assert torch.equal(dev.buffer[lo3:hi3], before)


def test_empty_plan_copies_nothing():
    spec = four_kinds()
    dev = KVLayout(spec, 2)
    pool = HostKVPool(spec, dev, 2)
    pool.execute(Plan(demote={0: np.zeros((0, 2), np.int64)}))
    pool.execute(None)
    assert pool.counters.pages_demoted == pool.counters.pages_promoted == 0
