"""One engine step on the model: page tables -> per-group metadata -> forward -> logits.

:class:`ModelRunner` binds a paged model (``jenga.engine.models``) to a KV-cache manager:
every decoder layer reads and writes its K/V only through ``manager.layout.kv_view(g, j)``
(the manager's own buffer; no copy).  Per step and per layer group it builds one
:class:`~jenga.engine.attention.AttentionMetadata` from the requests' ``PageTables``:

* only the pages some new token can see are put in the block table (sliding: the last
  ``window`` tokens, chunked: the current chunk, full: all), so pages the manager already
  released (``None``) are never read — a ``None`` inside that range raises ``RuntimeError``
  (a manager bug, not a caller mistake);
* the flattened token arrays (positions, request index, write slots) are built with torch
  ops; the only Python loops are per request and per page, never per token;
* a token below its table's ``write_from`` (its K/V is in a shared cached page, the request
  recomputes it for its state layers: ``jenga.core.manager.junction``) gets write slot ``-1``;
* the step's requests are laid out decodes first, then prefill chunks, each part with its own
  metadata (:mod:`jenga.engine.split_attention`), so decodes never pay for a prefill's
  query padding.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from jenga.core.specs import AttentionSpec
from jenga.engine.attention import AttentionMetadata, ForwardContext
from jenga.engine.split_attention import SplitAttentionBackend, SplitMetadata
from jenga.engine.state import StateBindings
from jenga.sched.scheduler import ScheduledRequest, StepPlan


class ModelRunner:
    """Runs ``model`` (a ``PagedCausalLM``) over the KV buffer of ``manager`` on ``device``."""

    def __init__(self, model, manager, *, device: torch.device | str = "cpu", model_name: str | None = None,
                 vision=None, cross=None):
        self.model = model
        self.vision = vision  # VisionEmbeddings of a VLM (image-token embeddings), else None
        self.cross = cross  # CrossAttentionKV of a cross-attention VLM (image K/V pages), else None
        self.mgr = manager
        self.device = torch.device(device)
        layout = manager.layout
        self.groups = manager.model.groups
        attn = model.layer_attention()
        n_layers = len(attn)
        self.kv_views: list[Tensor | None] = [None] * n_layers
        self.group_layers: list[list[int]] = [[] for _ in self.groups]
        own = model_name or self.groups[0].spec.model  # a draft + target pool holds both models' groups
        # cross-attention layers keep the images' K/V (``cross``); a pool that also gives them text slots
        # (the ``paged`` baseline: every layer in one group) leaves those slots unused
        image_layers = set(getattr(model, "cross_attention_layers", ()))
        self.states = StateBindings(model, manager, n_layers, own)
        for gi, g in enumerate(self.groups):
            if (gi in self.states.groups or g.spec.model != own or not isinstance(g.spec, AttentionSpec)
                    or g.kind == "cross"):  # cross-attention K/V: the image's, read by ``cross``
                continue
            for j, layer in enumerate(g.layers):
                if layer in image_layers:
                    continue
                self._check_layer(layer, attn[layer], g)
                self.kv_views[layer] = layout.kv_view(gi, j)
                self.group_layers[gi].append(layer)
        for layer, info in enumerate(attn):
            if info is not None and self.kv_views[layer] is None:
                raise ValueError(f"layer {layer} attends but no cache group of {manager.model.name} holds it")
        self.windows = [g.spec.span()[0] for g in self.groups]
        self.chunks = [g.spec.span()[1] for g in self.groups]
        self.backend = SplitAttentionBackend()
        self.last_forward_s = 0.0  # wall time of the last model forward (without metadata)
        self.item_first: dict[int, int] = {}  # plan item -> flattened row of its first token (last prepare)

    @property
    def encoder(self):
        """What runs the vision encoder (``VisionEmbeddings`` / ``CrossAttentionKV``; ``.runs``), or None."""
        return self.vision if self.vision is not None else self.cross

    @staticmethod
    def _check_layer(layer: int, info, group) -> None:
        spec = group.spec
        if info is None:
            raise ValueError(f"layer {layer} has no attention but cache group {group.name!r} keeps its K/V")
        heads, head_dim = spec.kv_heads()
        if heads != info.num_kv_heads or head_dim != info.head_dim:
            raise ValueError(f"layer {layer}: model has {info.num_kv_heads}x{info.head_dim} KV heads but cache group "
                             f"{group.name!r} has {heads}x{head_dim}")
        window, chunk = spec.span()
        if (window is not None and window != info.window) or (chunk is not None and chunk != info.chunk):
            raise ValueError(f"layer {layer}: model attends with window={info.window} chunk={info.chunk} but cache "
                             f"group {group.name!r} keeps window={window} chunk={chunk}")

    # ------------------------------------------------------------------ metadata
    def _group_metadata(self, gi: int, items: Sequence[ScheduledRequest], starts: list[int], new: list[int],
                        common: dict) -> AttentionMetadata:
        g = self.groups[gi]
        n_layers = g.num_layers
        window, chunk = self.windows[gi], self.chunks[gi]
        B = items[0].tables.groups[gi].tokens_per_page
        rows, firsts, cols, skips = [], [], [], []
        for it, c, n in zip(items, starts, new, strict=True):  # per request: slice of its page list
            skips.append(it.tables.groups[gi].write_from)
            first = 0
            if window is not None:
                first = max(0, c - window + 1)
            if chunk is not None:
                first = max(first, c // chunk * chunk)
            f, last = first // B, (c + n - 1) // B
            row = it.tables.groups[gi].page_ids[f:last + 1]
            if len(row) != last - f + 1:
                raise RuntimeError(f"request {it.seq.request_id!r}: group {g.name} holds {f + len(row)} pages, "
                                   f"needs {last + 1} for {c + n} tokens")
            rows.append(row)
            firsts.append(f)
            cols.append(len(row))
        width = max(cols)
        flat: list[int] = []
        for row in rows:  # per page
            flat.extend(-1 if s is None else s * n_layers for s in row)
            flat.extend([0] * (width - len(row)))
        R = len(items)
        table = torch.tensor(flat, dtype=torch.long).view(R, width)
        held = torch.arange(width)[None, :] < torch.tensor(cols)[:, None]
        if bool((table < 0).any()):
            r, c = (int(x) for x in torch.nonzero(table < 0)[0])
            raise RuntimeError(f"request {items[r].seq.request_id!r}: group {g.name} page {firsts[r] + c} is needed "
                               "this step but the manager does not hold it")
        first_t = torch.tensor(firsts, dtype=torch.long)
        q_req, q_pos = common["q_req"], common["q_pos"]
        slot_page = table[q_req, torch.div(q_pos, B, rounding_mode="floor") - first_t[q_req]]
        slots = slot_page * B + q_pos % B
        if any(w > c for w, c in zip(skips, starts, strict=True)):  # K/V in a shared cached page: not written
            slots = torch.where(q_pos < torch.tensor(skips, dtype=torch.long)[q_req], -1, slots)
        dev = self.device
        return AttentionMetadata(
            page_size=B, block_tables=table.to(dev), page_offsets=first_t.to(dev), page_held=held.to(dev),
            context_lens=common["ctx"], query_start_loc=common["starts"], query_positions=common["q_pos_dev"],
            query_req=common["q_req_dev"], query_local=common["q_local"], slot_mapping=slots.to(dev),
            max_query_len=common["max_q"], window=window, chunk=chunk)

    def _common(self, starts: list[int], new: list[int]) -> dict:
        """Token-level arrays of one part (positions, request index ...), built with torch ops."""
        new_t = torch.tensor(new, dtype=torch.long)
        start_t = torch.tensor(starts, dtype=torch.long)
        qsl = torch.zeros(len(new) + 1, dtype=torch.long)
        qsl[1:] = torch.cumsum(new_t, 0)
        q_req = torch.repeat_interleave(torch.arange(len(new)), new_t)
        q_local = torch.arange(int(qsl[-1])) - qsl[q_req]
        q_pos = start_t[q_req] + q_local
        dev = self.device
        return dict(q_req=q_req, q_pos=q_pos, ctx=(start_t + new_t).to(dev), starts=qsl.to(dev),
                    q_pos_dev=q_pos.to(dev), q_req_dev=q_req.to(dev), q_local=q_local.to(dev), max_q=max(new),
                    qsl=qsl)

    def prepare(self, plan: StepPlan, spec: Sequence[int] | None = None, *,
                copy_reads: bool = True) -> tuple[Tensor, Tensor, ForwardContext, Tensor]:
        """``(input_ids [T], positions [T], ctx, logits_indices [S])`` for the step's plan.

        Requests are laid out decodes first (one query token each), then prefill chunks; each
        part gets its own metadata (:class:`SplitMetadata`).  ``logits_indices`` follow the
        plan's order of items with ``.sample``.  ``spec[i]``: how many of item ``i``'s tokens
        (its last ones) are speculative: the state layers keep their inputs and write no state
        of them (:mod:`jenga.engine.speculative_state`); none by default.  ``copy_reads=False``:
        the caller already copied the step's prefix-hit checkpoints into the work pages.
        """
        items = plan.scheduled
        dec = [i for i, it in enumerate(items) if it.num_tokens == 1]
        pre = [i for i, it in enumerate(items) if it.num_tokens > 1]
        order = dec + pre
        parts = [p for p in (dec, pre) if p]
        ids: list[int] = []
        for i in order:  # per request: list slice
            it = items[i]
            ids.extend(it.seq.tokens[it.start:it.start + it.num_tokens])
        part_info = []
        offset = 0
        positions = []
        end_of = {}
        for part in parts:
            its = [items[i] for i in part]
            starts = [it.start for it in its]
            new = [it.num_tokens for it in its]
            common = self._common(starts, new)
            positions.append(common["q_pos"])
            for k, i in enumerate(part):
                end_of[i] = offset + int(common["qsl"][k + 1]) - 1
            part_info.append((offset, its, starts, new, common))
            offset += int(common["qsl"][-1])
        metas = []
        for gi in range(len(self.groups)):
            if not self.group_layers[gi]:
                continue
            subs = [(a, a + int(c["qsl"][-1]), self._group_metadata(gi, its, st, nw, c))
                    for a, its, st, nw, c in part_info]
            slots = torch.cat([m.slot_mapping for _, _, m in subs]) if len(subs) > 1 else subs[0][2].slot_mapping
            metas.append((self.group_layers[gi], SplitMetadata(slots, subs)))
        ctx = ForwardContext.from_groups(self.kv_views, metas, backend=self.backend)
        if self.states.groups:
            its = [items[i] for i in order]
            ctx = self.states.context(ctx, its, [it.start for it in its], [it.num_tokens for it in its],
                                      None if spec is None else [spec[i] for i in order], copy_reads)
        self.item_first = {i: end_of[i] - items[i].num_tokens + 1 for i in end_of}
        logits_idx = torch.tensor([end_of[i] for i, it in enumerate(items) if it.sample], dtype=torch.long)
        dev = self.device
        return (torch.tensor(ids, dtype=torch.long, device=dev), torch.cat(positions).to(dev), ctx,
                logits_idx.to(dev))

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> Tensor:
        """Write the step's K/V and return fp32 logits ``[S, vocab]``, one row per item with ``.sample``."""
        input_ids, positions, ctx, logits_idx = self.prepare(plan)
        t0 = time.perf_counter()
        extra = {}
        if self.vision is not None:  # image tokens: embeddings from the vision pages / encoder
            embeds = self.vision.step_embeds(plan.scheduled, self.item_first)
            if embeds is not None:
                extra["embeds"] = embeds
        if self.cross is not None:  # cross-attention layers: image K/V from the cross pages
            cross = self.cross.step(plan.scheduled, self.item_first)
            if cross is not None:
                extra["cross"] = cross
        if logits_idx.numel() == 0:
            self.model.model(input_ids, positions, ctx, **extra)  # non-final prefill chunks: K/V only
            out = torch.empty(0, self.model.config.vocab_size)
        else:
            out = self.model(input_ids, positions, ctx, logits_idx, **extra).float()
        self.last_forward_s = time.perf_counter() - t0
        return out
