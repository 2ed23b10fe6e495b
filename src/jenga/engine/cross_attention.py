"""Cross-attention K/V in jenga's cross-attention pages: encoder once per image, read every step.

Llama-3.2-Vision's cross-attention layers attend text tokens to the projected vision states of
the request's images.  Those K/V live in the manager's ``cross`` group (one
:class:`~jenga.core.specs.CrossAttentionSpec` group over every cross-attention layer; a page holds
``B`` image tokens of every layer).  :meth:`CrossAttentionKV.step` runs per engine step:

* the request's :class:`~jenga.core.tables.ImageTable` lists every image's pages (the manager takes
  them all at the request's first allocation) and which are fresh (``to_fill``).  Fresh images
  are encoded (one batched vision-model call per step; an image shown by several requests of the
  step is encoded once), projected into each layer's K/V (``model.cross_kv``) and written: image
  token ``r`` -> page ``r // B``, slot ``r % B`` of the layer's ``kv_view``.  The manager
  registers the pages under the image's key when the step commits, so a later request (or the
  same one after preemption) showing the image while it is cached runs no encoder;
* (with the ``paged`` baseline the cross group spans every layer, as vLLM v0 stored images:
  only the cross-attention layers' slots are written and read);
* it returns a :class:`CrossStep`: the step's rows of requests with images, their pages'
  block table and HF's mask (:func:`cross_mask`), which every cross-attention layer reads.

``runs`` counts images encoded, ``seconds`` their wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def cross_mask(images, positions: Tensor, pages: list[int], B: int, tokens_per_image: int,
               patches: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(allow [n, K], sees [n], valid [K])`` for one request's query ``positions`` over its keys.

    Keys are the request's images' pages in order, ``pages[j] * B`` slots each, the first
    ``tokens_per_image`` valid (tile ``t`` = slots ``[t * patches, (t + 1) * patches)``).  A
    position sees image ``j`` when its row (positions past the prompt take the last prompt row)
    lies in ``images.ranges[j]``; it may read that image's real tiles.  A row that sees no image
    reads every valid key (HF zeroes its mask row) and ``sees`` is False there, which zeroes the
    layer's MLP (HF's ``full_text_row_masked_out_mask``).
    """
    key_img = torch.repeat_interleave(torch.arange(len(pages)), torch.tensor(pages) * B)
    local = torch.cat([torch.arange(n * B) for n in pages])
    valid = local < tokens_per_image
    tile_ok = valid & (torch.div(local, patches, rounding_mode="floor")
                       < torch.tensor(images.num_tiles)[key_img])
    row = positions.clamp(max=images.prompt_len - 1)[:, None]
    rng = torch.tensor(images.ranges, dtype=torch.long)
    seen = (rng[None, :, 0] <= row) & (row < rng[None, :, 1])  # [n, N]
    sees = seen.any(1)
    allow = seen[:, key_img] & tile_ok[None, :]
    allow[~sees] = valid
    return allow, sees, valid


@dataclass
class CrossStep:
    """One step's cross-attention inputs, shared by every cross-attention layer."""

    rows: Tensor  # [n] flattened rows of the step's tokens of requests with images
    row_sees_image: Tensor  # [n] bool, False where HF's full_text_row_masked_out_mask is 0
    q_req: Tensor  # [n] request (0..R-1) of each row
    q_local: Tensor  # [n] index of the row inside its request's queries
    table: Tensor  # [R, P] exec page ids of each request's images (0-padded)
    key_valid: Tensor  # [R, P * B] slot holds an image token of the request
    mask: Tensor  # [R, 1, Qmax, P * B] True where the query may attend the key
    views: dict  # layer -> kv_view of the cross group

    def attend(self, layer: int, q: Tensor, *, scale: float) -> Tensor:
        """``q [n, Hq, D]`` over the cached image K/V of each row's request -> ``[n, Hq, D]``."""
        view = self.views[layer]
        R, P = self.table.shape
        B, H, D = view.shape[2], view.shape[3], view.shape[4]
        pages = view[self.table]  # [R, P, 2, B, H, D] (copy)
        bad = ~self.key_valid[:, :, None, None]
        k = pages[:, :, 0].reshape(R, P * B, H, D).to(q.dtype).masked_fill(bad, 0.0).transpose(1, 2)
        v = pages[:, :, 1].reshape(R, P * B, H, D).to(q.dtype).masked_fill(bad, 0.0).transpose(1, 2)
        Hq = q.shape[1]
        qp = q.new_zeros(R, self.mask.shape[2], Hq, D)
        qp[self.q_req, self.q_local] = q
        out = F.scaled_dot_product_attention(qp.transpose(1, 2), k, v, attn_mask=self.mask, scale=scale,
                                             enable_gqa=Hq != H)
        return out.transpose(1, 2)[self.q_req, self.q_local]


class CrossAttentionKV:
    """Image K/V of the cross-attention layers in the manager's cross group (module docstring)."""

    def __init__(self, model, manager, *, device: torch.device | str = "cpu"):
        self.model = model
        self.device = torch.device(device)
        groups = manager.model.groups
        kinds = [g.kind for g in groups]
        if "cross" not in kinds:
            raise ValueError(f"{manager.model.name} has no cross-attention group to keep image K/V in")
        self.gi = kinds.index("cross")
        g = groups[self.gi]
        if not set(model.cross_attention_layers) <= set(g.layers):
            raise ValueError(f"cross group {g.name!r} holds layers {g.layers}, the model's cross-attention layers "
                             f"are {model.cross_attention_layers}")
        attn = model.model.language_model.layers[model.cross_attention_layers[0]].cross_attn
        if (g.spec.num_kv_heads, g.spec.head_dim) != (attn.num_kv_heads, attn.head_dim):
            raise ValueError(f"cross group {g.name!r} keeps {g.spec.num_kv_heads}x{g.spec.head_dim} KV heads, the "
                             f"model has {attn.num_kv_heads}x{attn.head_dim}")
        self.layout = manager.layout
        self.B = g.tokens_per_page
        # the ``paged`` baseline keeps image tokens in every layer: only the cross layers' slots are used
        self.views = {layer: manager.layout.kv_view(self.gi, g.layers.index(layer))
                      for layer in model.cross_attention_layers}
        self.runs = 0
        self.seconds = 0.0

    def _encode(self, todo: dict) -> dict[str, Tensor]:
        """Projected vision states per content hash for ``todo``: hash -> (MllamaImages, index)."""
        t0 = time.perf_counter()
        mm = [(imgs, j) for imgs, j in todo.values()]
        dev = self.device
        states = self.model.encode_images(torch.stack([m.pixel_values[j] for m, j in mm]).to(dev),
                                          torch.stack([m.aspect_ratio_ids[j] for m, j in mm]).to(dev),
                                          torch.stack([m.aspect_ratio_mask[j] for m, j in mm]).to(dev))
        self.seconds += time.perf_counter() - t0
        self.runs += len(mm)
        return dict(zip(todo, states, strict=True))

    def _write(self, pages: list[int], states: Tensor) -> None:
        rows = torch.arange(states.shape[0], device=self.device)
        exec_ids = torch.tensor(self.layout.exec_page_ids(self.gi, pages), dtype=torch.long, device=self.device)
        page, off = exec_ids[torch.div(rows, self.B, rounding_mode="floor")], rows % self.B
        for layer, view in self.views.items():
            k, v = self.model.cross_kv(layer, states)
            view[page, 0, off] = k.to(view.dtype)
            view[page, 1, off] = v.to(view.dtype)

    def step(self, items, first_row: dict[int, int]) -> CrossStep | None:
        """Fill the step's fresh images, then the :class:`CrossStep` of the step's requests with
        images (``first_row[i]``: flattened row of item ``i``'s first token); None when none has."""
        todo: dict[str, tuple] = {}
        fills: list[tuple[list[int], str]] = []
        mine = []
        for i, it in enumerate(items):
            seq = it.seq
            if not seq.images:
                continue
            table = it.tables.groups[self.gi]
            if len(table.pages) != len(seq.images):
                raise RuntimeError(f"request {seq.request_id!r}: {len(table.pages)} of its {len(seq.images)} images "
                                   "hold cross-attention pages this step")
            for j in sorted(table.to_fill):
                fills.append((table.pages[j], seq.images[j].content_hash))
                todo.setdefault(seq.images[j].content_hash, (seq.mm, j))
            mine.append((i, it, table))
        if todo:
            states = self._encode(todo)
            for pages, h in fills:
                self._write(pages, states[h])
        if not mine:
            return None
        return self._build(mine, first_row)

    def _build(self, mine, first_row: dict[int, int]) -> CrossStep:
        m = self.model
        rows, reqs, locals_, allows, valids, sees, tables = [], [], [], [], [], [], []
        for r, (i, it, table) in enumerate(mine):  # per request
            n = it.num_tokens
            pages = [table.pages[j] for j in range(len(it.seq.images))]
            allow, see, valid = cross_mask(it.seq.mm, torch.arange(it.start, it.start + n), [len(p) for p in pages],
                                           self.B, m.tokens_per_image, m.patches_per_tile)
            rows.append(torch.arange(first_row[i], first_row[i] + n))
            reqs.append(torch.full((n,), r))
            locals_.append(torch.arange(n))
            allows.append(allow)
            valids.append(valid)
            sees.append(see)
            tables.append(self.layout.exec_page_ids(self.gi, [p for ps in pages for p in ps]))
        R, Q = len(mine), max(a.shape[0] for a in allows)
        P = max(len(t) for t in tables)
        table = torch.zeros(R, P, dtype=torch.long)
        key_valid = torch.zeros(R, P * self.B, dtype=torch.bool)
        mask = torch.zeros(R, Q, P * self.B, dtype=torch.bool)
        for r, (t, a, v) in enumerate(zip(tables, allows, valids, strict=True)):
            table[r, :len(t)] = torch.tensor(t)
            key_valid[r, :v.shape[0]] = v
            mask[r, :a.shape[0], :a.shape[1]] = a
            mask[r, a.shape[0]:, :v.shape[0]] = v  # padding query rows: finite softmax, output dropped
        dev = self.device
        return CrossStep(torch.cat(rows).to(dev), torch.cat(sees).to(dev), torch.cat(reqs).to(dev),
                         torch.cat(locals_).to(dev), table.to(dev), key_valid.to(dev), mask[:, None].to(dev),
                         self.views)
