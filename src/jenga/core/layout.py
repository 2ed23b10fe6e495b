"""The KV buffer and per-layer exec views (see docs/memory-layout.md).

The only core module that imports torch.
"""

from __future__ import annotations

import math

import torch

from jenga.core.specs import AttentionSpec, MambaSpec, ModelSpec, VisionEmbeddingSpec

TORCH_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "int8": torch.int8,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}


class KVLayout:
    """One ``uint8`` buffer of ``(num_large + 1) * S`` bytes and views into it.

    ``layer_slot[l] = (group index, j)`` for every layer the model spec lists.  ``pin_memory``
    (a host buffer beside a CUDA device: the host tier) page-locks the buffer for non-blocking copies.
    """

    def __init__(self, model: ModelSpec, num_large: int, *, device: str | torch.device = "cpu",
                 pin_memory: bool = False):
        self.model = model
        self.large_page_bytes = model.large_page_bytes
        self.num_large = num_large
        self.total_bytes = (num_large + 1) * self.large_page_bytes  # + one slack large page
        self.buffer = torch.zeros(self.total_bytes, dtype=torch.uint8, device=device, pin_memory=pin_memory)
        self.layer_slot: dict[tuple[str, int], tuple[int, int]] = {}
        for gi, g in enumerate(model.groups):
            for j, layer in enumerate(g.layers):
                self.layer_slot[(g.spec.model, layer)] = (gi, j)

    def slot(self, layer: int, model: str | None = None) -> tuple[int, int]:
        """(group index, index inside the group) of ``layer``; raises KeyError naming it."""
        key = (model or self.model.groups[0].spec.model, layer)
        try:
            return self.layer_slot[key]
        except KeyError:
            raise KeyError(f"layer {layer} of model {key[0]!r} has no cache group in {self.model.name}") from None

    def _pages(self, gi: int, j: int) -> tuple[int, int, int]:
        """(start byte, per-layer page bytes p_g, number of exec pages E) of layer j of group gi."""
        g = self.model.groups[gi]
        p = g.layer_page_bytes
        start = j * p
        #  |<- j*p ->|<---------------- E * p bytes ---------------->|
        #  0         start                                  start+E*p <= total
        count = (self.total_bytes - start) // p
        return start, p, count

    def kv_view(self, gi: int, j: int) -> torch.Tensor:
        """``Tensor[E, 2, B_g, H_kv, D]`` of layer j of attention group gi; exec page s*n_g."""
        g = self.model.groups[gi]
        spec = g.spec
        assert isinstance(spec, AttentionSpec), f"group {g.name} is {spec.kind}, not attention"
        start, p, count = self._pages(gi, j)
        dt = TORCH_DTYPES[spec.dtype]
        elem = torch.empty((), dtype=dt).element_size()
        shape = (2, g.tokens_per_page, spec.num_kv_heads, spec.head_dim)
        assert math.prod(shape) * elem <= p and p % elem == 0 and start % elem == 0, f"bad page for {g.name}"
        flat = self.buffer[start:start + count * p].view(dt)
        return flat.as_strided((count, *shape), (p // elem, *torch.empty(shape).stride()))

    def embed_view(self, gi: int) -> torch.Tensor:
        """``Tensor[E, B_g, hidden]`` of a vision-embedding group."""
        g = self.model.groups[gi]
        spec = g.spec
        assert isinstance(spec, VisionEmbeddingSpec), f"group {g.name} is not a vision-embedding group"
        start, p, count = self._pages(gi, 0)
        dt = TORCH_DTYPES[spec.dtype]
        elem = torch.empty((), dtype=dt).element_size()
        flat = self.buffer[start:start + count * p].view(dt)
        return flat.as_strided((count, g.tokens_per_page, spec.hidden_size), (p // elem, spec.hidden_size, 1))

    def state_views(self, gi: int, j: int) -> list[torch.Tensor]:
        """One ``Tensor[E, *shape_i]`` per state tensor of layer j of Mamba group gi."""
        g = self.model.groups[gi]
        spec = g.spec
        assert isinstance(spec, MambaSpec), f"group {g.name} is not a state group"
        start, p, count = self._pages(gi, j)
        views, off = [], start
        for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
            dt = TORCH_DTYPES[dtype]
            elem = torch.empty((), dtype=dt).element_size()
            assert off % elem == 0, f"state tensor of {g.name} misaligned at byte {off}"
            n = math.prod(shape)
            raw = self.buffer[off:off + (count - 1) * p + n * elem].view(dt)
            views.append(raw.as_strided((count, *shape), (p // elem, *torch.empty(shape).stride())))
            off += n * elem
        return views

    def exec_page_ids(self, gi: int, pages: list[int | None], pad: int = 0) -> list[int]:
        """Small page ids -> exec page ids ``s * n_g`` (``None`` -> ``pad``)."""
        n = self.model.groups[gi].num_layers
        return [pad if s is None else s * n for s in pages]

    def byte_range(self, gi: int, page: int) -> tuple[int, int]:
        """Bytes of small page ``page`` of group gi in the buffer."""
        p = self.model.groups[gi].page_bytes
        return page * p, (page + 1) * p
