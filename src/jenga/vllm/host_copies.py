"""The worker side of jenga's host tier inside vLLM: page copies between vLLM's KV buffer and host memory.

vLLM's worker holds the KV buffer jenga's page-layer plan carves (``jenga.vllm.plan``): page ``p``
of group ``g`` is bytes ``[offset + p * P_g, offset + (p + 1) * P_g)`` of the buffer's storage,
whatever the page kind (attention K/V, Mamba states).  :class:`HostPageCopies` keeps the host
buffer (:class:`jenga.vllm.offloading.HostLayout`; pinned when the buffer is on CUDA) and runs a
step's :class:`~jenga.core.tier.copy_plan.CopyPlan` before the step's forward, batched per group
(one gather, one transfer, one scatter per run of pages; never a Python loop per page;
``non_blocking`` on CUDA).

Order and atomicity: every demote's device rows are read (staged), then written into the host
buffer; then every promote's host rows are read (a promote may read a page this plan demoted), and
only once all of them are staged are they written into the device buffer.  A copy that fails
raises :class:`HostCopyError` before any promoted page is written, so no request's restore is ever
half on the device (a Mamba state without its attention pages, or the reverse).
"""

from __future__ import annotations

import numpy as np
import torch

from jenga.errors import HostCopyError

__all__ = ["HostCopyError", "HostPageCopies", "byte_buffer"]


def _first_tensor(value) -> torch.Tensor:
    """The first tensor of a layer's KV cache entry (a tensor, or a list of a state's tensors)."""
    while isinstance(value, (list, tuple)):
        value = value[0]
    return value


def byte_buffer(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under ``t`` as one flat ``uint8`` tensor (on ``t``'s device)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class HostPageCopies:
    """Host copies of jenga's pages beside one worker's KV buffer.  ``kv_caches``: vLLM's layer
    name -> KV tensor(s) (``register_kv_caches``); ``group_layers[g]``: the layer names of group ``g``."""

    def __init__(self, layout, kv_caches: dict, group_layers: list[list[str]]):
        self.layout = layout
        self.device_rows: list[torch.Tensor | None] = []
        device = None
        for g, names in enumerate(group_layers):
            mine = [n for n in names if n in kv_caches]
            if not mine:  # a pipeline stage without layers of this group: nothing of it to copy here
                self.device_rows.append(None)
                continue
            flat = byte_buffer(_first_tensor(kv_caches[mine[0]]))
            device = flat.device
            p, off = layout.page_bytes[g], layout.device_offset
            n = (flat.numel() - off) // p
            self.device_rows.append(flat[off:off + n * p].view(n, p))
        self.device = device if device is not None else torch.device("cpu")
        self.pinned = self.device.type == "cuda"
        self.host = torch.zeros(layout.total_bytes, dtype=torch.uint8, pin_memory=self.pinned)
        self.host_rows = [self.host.view(layout.num_pages(g), p) for g, p in enumerate(layout.page_bytes)]
        self.pages_demoted = self.pages_promoted = 0

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory this worker holds (0 once released)."""
        return 0 if self.host is None else self.host.numel()

    def _ids(self, column: np.ndarray, device) -> torch.Tensor:
        ids = torch.from_numpy(np.ascontiguousarray(column, dtype=np.int64))
        return ids.to(device, non_blocking=self.pinned) if device.type != "cpu" else ids

    def _gather(self, rows: torch.Tensor, ids: torch.Tensor, to) -> torch.Tensor:
        """Rows ``ids`` of ``rows``, moved to ``to`` (one batched gather and transfer)."""
        out = rows.index_select(0, ids)
        if out.device == to:
            return out
        if self.pinned and out.device.type == "cpu":
            out = out.pin_memory()
        return out.to(to, non_blocking=self.pinned)

    def execute(self, plan) -> None:
        """Run ``plan`` (module doc); raises :class:`HostCopyError` naming the step that failed."""
        if plan is None or plan.empty:
            return
        if self.host is None:
            raise HostCopyError("jenga.vllm: a copy plan after the host buffer was released")
        cpu = torch.device("cpu")
        try:
            staged = [(g, self._ids(pairs[:, 1], cpu), self._gather(self.device_rows[g],
                                                                     self._ids(pairs[:, 0], self.device), cpu))
                      for g, pairs in plan.demote.items() if self.device_rows[g] is not None and len(pairs)]
            if self.pinned and staged:
                torch.cuda.current_stream(self.device).synchronize()
            for g, host_ids, rows in staged:
                self.host_rows[g].index_copy_(0, host_ids, rows)
        except Exception as e:
            raise HostCopyError(f"jenga.vllm: demoting {plan.num_pages} pages failed ({e}); nothing was "
                                "promoted") from e
        try:
            loads = [(g, self._ids(pairs[:, 1], self.device), self._gather(self.host_rows[g],
                                                                            self._ids(pairs[:, 0], cpu), self.device))
                     for g, pairs in plan.promote.items() if self.device_rows[g] is not None and len(pairs)]
        except Exception as e:
            raise HostCopyError(f"jenga.vllm: reading the host pages of a promotion failed ({e}); no promoted "
                                "page was written") from e
        for g, dev_ids, rows in loads:
            self.device_rows[g].index_copy_(0, dev_ids, rows)
        self.pages_demoted += sum(len(t[1]) for t in staged)
        self.pages_promoted += sum(len(t[1]) for t in loads)

    def release(self) -> None:
        """Give the host buffer back (the worker's shutdown)."""
        self.host = None
        self.host_rows = []
