"""Where a vLLM block of a KV-cache group lives in the workers' one KV buffer, in bytes, and a
check that no two live pages share a byte (the stand-in runner of :mod:`vllm_async_driver`).

vLLM's ``KVCacheTensor`` says it (and its workers' ``allocate_kv_cache`` builds the views so):
every tensor places its layers in one backing allocation, layer ``layers[l]``'s page of block
``b`` starting at ``offset + l * layer_stride + b * block_stride``, as long as one layer's page
(``page_size_bytes`` of the layer's spec).  Stock vLLM overlays its groups (each block id belongs
to one group at a time); jenga's plugin rewrites the config so that every group views the whole
buffer with its own page-then-layer strides (``jenga.vllm.plan``, docs/memory-layout.md), and
its block ids are page ids times the group's scale plus the state sink.  Either way two pages
live at once must not share a byte, across groups and across the layers of one page.
"""

from __future__ import annotations

import bisect

from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs


class Overlap(AssertionError):
    """Two live pages (or two layers of one page) share bytes of the KV buffer."""


def _layer_spec(group, name: str):
    spec = group.kv_cache_spec
    return spec.kv_cache_specs[name] if isinstance(spec, UniformTypeKVCacheSpecs) else spec


class BufferLayout:
    """The byte placement of every group's blocks, read off a ``KVCacheConfig``."""

    def __init__(self, kv_cache_config):
        where = {}
        for t in kv_cache_config.kv_cache_tensors:
            for i, name in enumerate(t.layers):
                where[name] = (t.offset + i * t.layer_stride, t.block_stride)
        self.size = min(t.size for t in kv_cache_config.kv_cache_tensors)
        # per group, per layer: (byte of its block 0, bytes between blocks, bytes of one layer page)
        self.layers = [[(*where[name], _layer_spec(g, name).page_size_bytes) for name in g.layer_names]
                       for g in kv_cache_config.kv_cache_groups]
        block = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        # a token's slot in its group's first layer page: the store's key (bytes per token slot)
        self.slot_bytes = [lay[0][2] // b if lay else 0 for lay, b in zip(self.layers, block, strict=True)]

    def token_addr(self, g: int, block: int, slot: int) -> int | tuple:
        """The byte where token slot ``slot`` of ``block`` starts in group ``g``'s first layer (a
        group without layers in this worker, a pipeline stage's: ``(g, block, slot)``, no bytes)."""
        if not self.layers[g]:
            return g, block, slot
        base, stride, _ = self.layers[g][0]
        return base + block * stride + slot * self.slot_bytes[g]

    def page_addr(self, g: int, block: int) -> int | tuple:
        """The byte where ``block`` of group ``g`` starts in its first layer (a state's key)."""
        return self.token_addr(g, block, 0)

    def runs(self, g: int, block: int) -> list[tuple[int, int]]:
        """The byte ranges ``[lo, hi)`` of ``block``'s layer pages in group ``g``, adjacent ones
        merged; raises ``Overlap`` when two layers of the page share bytes, or a page leaves the buffer."""
        spans = sorted((base + block * stride, base + block * stride + size) for base, stride, size in self.layers[g])
        if not spans:
            return []
        out = [spans[0]]
        for lo, hi in spans[1:]:
            if lo < out[-1][1]:
                raise Overlap(f"group {g} block {block}: two layer pages share bytes [{lo}, {out[-1][1]})")
            if lo == out[-1][1]:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        if out[0][0] < 0 or out[-1][1] > self.size:
            raise Overlap(f"group {g} block {block}: bytes [{out[0][0]}, {out[-1][1]}) leave the {self.size} B buffer")
        return out


class LivePages:
    """The pages live now (``(group, block)``) and their byte ranges, kept sorted and disjoint:
    ``update`` takes the new live set and raises ``Overlap`` when an added page shares a byte
    with another live page."""

    def __init__(self, layout: BufferLayout):
        self.layout = layout
        self.pages: set[tuple[int, int]] = set()
        self.spans: list[tuple[int, int, tuple[int, int]]] = []  # (lo, hi, page), sorted by lo
        self.checked = 0  # pages checked against every live page when they became live

    def update(self, live: set[tuple[int, int]]) -> None:
        spans = self.spans
        for page in self.pages - live:
            for lo, hi in self.layout.runs(*page):
                del spans[bisect.bisect_left(spans, (lo, hi, page))]
        for page in live - self.pages:
            for lo, hi in self.layout.runs(*page):
                i = bisect.bisect_left(spans, (lo, hi, page))
                for j in (i - 1, i):
                    if 0 <= j < len(spans) and spans[j][0] < hi and lo < spans[j][1]:
                        other = spans[j][2]
                        raise Overlap(f"live pages share bytes: group {page[0]} block {page[1]} [{lo}, {hi}) and "
                                      f"group {other[0]} block {other[1]} [{spans[j][0]}, {spans[j][1]})")
                spans.insert(i, (lo, hi, page))
            self.checked += 1
        self.pages = set(live)
