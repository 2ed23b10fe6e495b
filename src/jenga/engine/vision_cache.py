"""Vision embeddings in jenga's vision-embedding pages: encoder once per image, read per chunk.

Per engine step, :meth:`VisionEmbeddings.step_embeds` looks at every scheduled request with
images:

* with the cache (the default), the request's :class:`~jenga.core.tables.ImageTable` of the vision
  group says which images hold pages (``pages[j]``) and which of those are fresh
  (``to_fill``).  Fresh images are encoded (one batched call of the model's
  ``encode_images``; an image shown by several requests of the step is encoded once) and
  their ``mm_tokens_per_image`` rows are written into the pages (row ``r`` -> page
  ``r // B``, slot ``r % B`` of :meth:`~jenga.core.layout.KVLayout.embed_view`).  The rows of the
  step's image tokens are then read back from the pages, so a chunk that continues an image,
  or a second request showing it while its pages are cached, runs no encoder.  The manager
  registers the pages under the image's key when the step commits and evicts images whole.
* without the cache (``cache=False``: the baseline an engine without embedding pages is),
  every chunk that touches an image re-runs the encoder and keeps only its slice.

``runs`` counts encoder runs (images encoded); ``seconds`` their wall time.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor


class VisionEmbeddings:
    """Image-token embeddings for the model runner (see the module docstring)."""

    def __init__(self, model, manager, *, cache: bool = True, device: torch.device | str = "cpu"):
        self.model = model
        self.device = torch.device(device)
        self.gi = None
        if cache:
            kinds = [g.kind for g in manager.model.groups]
            if "vision" not in kinds:
                raise ValueError(f"{manager.model.name} has no vision-embedding group to cache image embeddings in")
            self.gi = kinds.index("vision")
            self.layout = manager.layout
            self.view = manager.layout.embed_view(self.gi)
        self.runs = 0
        self.seconds = 0.0

    def _encode(self, pixels: list[Tensor]) -> Tensor:
        t0 = time.perf_counter()
        feats = self.model.encode_images(torch.stack(pixels).to(self.device))
        self.seconds += time.perf_counter() - t0
        self.runs += len(pixels)
        return feats

    def _slots(self, pages: list[int], rows: Tensor) -> tuple[Tensor, Tensor]:
        B = self.view.shape[1]
        exec_ids = torch.tensor(self.layout.exec_page_ids(self.gi, pages), dtype=torch.long, device=self.device)
        return exec_ids[torch.div(rows, B, rounding_mode="floor")], rows % B

    def step_embeds(self, items, first_row: dict[int, int]) -> tuple[Tensor, Tensor] | None:
        """``(rows, values)`` for the step's image tokens (``first_row[i]``: flattened row of
        item ``i``'s first token), or None when no scheduled token is an image token."""
        todo: dict[str, Tensor] = {}  # content hash -> pixels, to encode this step
        fills: list[tuple[list[int], str]] = []  # (pages, hash) to write after encoding
        reads: list[tuple[int, int, int, int]] = []  # (item, image index, first, end) of its tokens
        for i, it in enumerate(items):
            seq = it.seq
            if not seq.images:
                continue
            s, e = it.start, it.start + it.num_tokens
            table = it.tables.groups[self.gi] if self.gi is not None else None
            if table is not None:
                for j in sorted(table.to_fill):
                    fills.append((table.pages[j], seq.images[j].content_hash))
                    todo.setdefault(seq.images[j].content_hash, seq.mm[j])
            for j, ref in enumerate(seq.images):
                lo, hi = max(ref.offset, s), min(ref.offset + ref.num_tokens, e)
                if lo < hi:
                    reads.append((i, j, lo, hi))
                    if table is None:
                        todo.setdefault(ref.content_hash, seq.mm[j])
                    elif j not in table.pages:
                        raise RuntimeError(f"request {seq.request_id!r}: image {j} has no vision pages this step")
        if not reads and not fills:
            return None
        feats: dict[str, Tensor] = {}
        if todo:
            out = self._encode(list(todo.values()))
            feats = dict(zip(todo, out, strict=True))
        for pages, h in fills:
            f = feats[h]
            page, off = self._slots(pages, torch.arange(f.shape[0], device=self.device))
            self.view[page, off] = f.to(self.view.dtype)
        if not reads:
            return None
        rows, values = [], []
        for i, j, lo, hi in reads:
            it = items[i]
            ref = it.seq.images[j]
            local = torch.arange(lo - ref.offset, hi - ref.offset, device=self.device)
            if self.gi is None:
                values.append(feats[ref.content_hash][local])
            else:
                page, off = self._slots(it.tables.groups[self.gi].pages[j], local)
                values.append(self.view[page, off])
            base = first_row[i] - it.start
            rows.append(torch.arange(base + lo, base + hi, device=self.device))
        return torch.cat(rows), torch.cat(values)
