"""The host-memory tier's bytes: a host :class:`~jenga.core.layout.KVLayout` and the copies of a step.

The manager decides which pages move between tiers and hands the engine a copy plan once per
step (``take_copy_plan()``, taken after the step's allocations): ``demote[g]`` rows of
``(device_page, host_page)`` and ``promote[g]`` rows of ``(host_page, device_page)``, small-page
ids of group ``g`` in either tier.  Host pages are addressed exactly like device pages (small
page ``s`` of group ``g`` is bytes ``[s * P_g, (s + 1) * P_g)`` of its tier's buffer,
docs/memory-layout.md), so one copy is a row of ``P_g`` bytes in a ``[pages, P_g]`` view of
each buffer, whatever the page kind (attention K/V, state checkpoints, image pages).

:meth:`HostKVPool.execute` runs a plan before the step's forward: every demote, then every
promote, each one batched gather -> one transfer -> one scatter per group (``index_select`` /
``index_copy_`` over the page-byte views, never a Python loop per page).  On CUDA the host
buffer and the staging rows are pinned and the transfers ``non_blocking``: a promote's
host -> device copy is ordered before the forward by the stream; a demote's device -> host copy
is waited for (its CUDA event) only when its host rows are scattered, at the next plan's start
or before a promote of the same plan reads the host buffer.  On CPU the same code runs between
two CPU tensors (the event is absent and the copies are synchronous).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from jenga.core.layout import KVLayout
from jenga.core.specs import ModelSpec


@dataclass
class HostCopyCounters:
    """What the engine copied between tiers (pages and bytes, each direction)."""

    pages_demoted: int = 0
    pages_promoted: int = 0
    bytes_demoted: int = 0
    bytes_promoted: int = 0


class HostKVPool:
    """Host copies of KV pages of ``model`` (``num_host_large`` large pages) beside ``device_layout``.

    ``layout`` is the host buffer's :class:`KVLayout` (pinned when the device is CUDA).
    """

    def __init__(self, model: ModelSpec, device_layout: KVLayout, num_host_large: int):
        self.device_layout = device_layout
        self.device = device_layout.buffer.device
        self.pinned = self.device.type == "cuda"
        self.layout = KVLayout(model, num_host_large, device="cpu", pin_memory=self.pinned)
        self.page_bytes = [g.page_bytes for g in model.groups]
        self._dev_rows = [self._rows(device_layout.buffer, p) for p in self.page_bytes]
        self._host_rows = [self._rows(self.layout.buffer, p) for p in self.page_bytes]
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (group, host ids, staged rows)
        self._event = None
        self.counters = HostCopyCounters()

    @staticmethod
    def _rows(buffer: torch.Tensor, page: int) -> torch.Tensor:
        """``[pages, page]`` bytes view of ``buffer``: row ``s`` is small page ``s`` of a group of that page size."""
        n = buffer.numel() // page
        return buffer[:n * page].view(n, page)

    def host_pages(self, gi: int) -> int:
        """Small pages of group ``gi`` the host buffer addresses."""
        return self._host_rows[gi].shape[0]

    def page_bytes_of(self, gi: int, page: int) -> torch.Tensor:
        """The host bytes of small page ``page`` of group ``gi`` (a view; for checks and tests)."""
        self.finish()
        return self._host_rows[gi][page]

    def execute(self, plan) -> None:
        """Run ``plan``'s demotes, then its promotes (see the module doc); an empty plan costs nothing."""
        self.finish()
        if plan is None or plan.empty:
            return
        for gi, pairs in plan.demote.items():
            self._demote(gi, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
        if self.pinned and self._pending:
            self._event = torch.cuda.Event()
            self._event.record()
        if any(len(p) for p in plan.promote.values()):
            self.finish()  # a promote may read a host page this plan just demoted
        for gi, pairs in plan.promote.items():
            self._promote(gi, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))

    def _demote(self, gi: int, pairs: np.ndarray) -> None:
        if not len(pairs):
            return
        src = torch.from_numpy(np.ascontiguousarray(pairs[:, 0])).to(self.device, non_blocking=self.pinned)
        rows = self._dev_rows[gi].index_select(0, src)
        staged = torch.empty(rows.shape, dtype=torch.uint8, pin_memory=self.pinned)
        staged.copy_(rows, non_blocking=self.pinned)
        self._pending.append((gi, torch.from_numpy(np.ascontiguousarray(pairs[:, 1])), staged))
        self.counters.pages_demoted += len(pairs)
        self.counters.bytes_demoted += len(pairs) * self.page_bytes[gi]

    def _promote(self, gi: int, pairs: np.ndarray) -> None:
        if not len(pairs):
            return
        rows = self._host_rows[gi].index_select(0, torch.from_numpy(np.ascontiguousarray(pairs[:, 0])))
        if self.pinned:
            rows = rows.pin_memory()
        dst = torch.from_numpy(np.ascontiguousarray(pairs[:, 1])).to(self.device, non_blocking=self.pinned)
        self._dev_rows[gi].index_copy_(0, dst, rows.to(self.device, non_blocking=self.pinned))
        self.counters.pages_promoted += len(pairs)
        self.counters.bytes_promoted += len(pairs) * self.page_bytes[gi]

    def finish(self) -> None:
        """Scatter the staged demotes into the host buffer (after their transfers completed)."""
        if not self._pending:
            return
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        for gi, host_ids, staged in self._pending:
            self._host_rows[gi].index_copy_(0, host_ids, staged)
        self._pending.clear()
