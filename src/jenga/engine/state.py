"""Recurrent state (Mamba-1/2, Gated DeltaNet) held in jenga's state pages, per engine step.

Contract
--------
For every state group the manager's :class:`~jenga.core.tables.StateTable` of a request says where its
state lives: ``work_page`` (the running state, updated in place), ``read_page`` (a cached
checkpoint to copy into the work page before the step: a prefix hit) and ``checkpoints[t]``
(pages that must receive the state after the first ``t`` tokens).  Any set of checkpoint
positions inside the step is honoured, not only multiples of the interval.

:class:`StateMetadata` is one group's view of one step: per request (in the step's token order)
its work exec page, whether it starts from zero (no token computed yet: the page may hold stale
bytes), its token span and the checkpoints that fall inside its span.  :class:`StateContext`
extends the attention :class:`~jenga.engine.attention.ForwardContext` with the layers' state
views (``KVLayout.state_views``) and drives a *mixer* — any object with

* ``state_scan(u [n, F], state: tuple) -> (y [n, G], state)``: a prefill segment of one request;
* ``state_step(u [R, F], state: tuple of [R, ...]) -> (y [R, G], state)``: one token of R requests;

where ``state`` is the tuple of the layer's state tensors in spec order (fp32).  The context
splits each prefill at its checkpoint positions, runs the segments, writes the state after a
segment into the checkpoint page and the final state into the work page — all through the
exec views of the group's pages, never a private cache.

Speculative tokens (drafts a verifier may reject, :mod:`jenga.engine.speculative`) are the last
``spec`` tokens of a request's span: the mixer runs them one token at a time from the state after
the request's other tokens, but their states are never written to a page; their mixer inputs are
kept (:class:`~jenga.engine.speculative_state.SpeculativeStates`) until the verifier says how many
were accepted, and only then does the work page advance over those.  So a state page only ever
holds the state at a committed position (what a prefix hit may restore).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from jenga.engine.attention import ForwardContext
from jenga.engine.speculative_state import SpeculativeStates


@dataclass
class StateMetadata:
    """One state group in one step; requests listed in the step's token order."""

    work: list[int]  # exec page of each request's running state
    fresh: list[bool]  # True: no token computed before this step, start from the zero state
    spans: list[tuple[int, int]]  # (first flat token, number of tokens)
    checkpoints: list[list[tuple[int, int]]]  # per request: (tokens of this step done, exec page), sorted
    reads: list[tuple[int, int]] = field(default_factory=list)  # (checkpoint exec page, work exec page)
    spec: list[int] = field(default_factory=list)  # per request: speculative tokens ending its span
    keys: list[object] = field(default_factory=list)  # per request: its id (speculative inputs are kept by it)

    @classmethod
    def build(cls, tables: Sequence, starts: Sequence[int], counts: Sequence[int], n_layers: int,
              spec: Sequence[int] | None = None, keys: Sequence[object] = ()) -> StateMetadata:
        """From each request's ``StateTable`` (``tables``), first position, token count and
        speculative tokens among them (none by default).  A request running speculative tokens
        only (a draft's proposal) copies no read page: the forward of its other tokens did."""
        spec = list(spec) if spec is not None else [0] * len(counts)
        work, fresh, spans, ckpts, reads = [], [], [], [], []
        offset = 0
        for t, c, n, s in zip(tables, starts, counts, spec, strict=True):
            m = n - s  # committed tokens: their states may reach pages
            work.append(t.work_page * n_layers)
            fresh.append(c == 0)
            spans.append((offset, n))
            ckpts.append(sorted((pos - c, page * n_layers) for pos, page in t.checkpoints.items() if c < pos <= c + m))
            if t.read_page is not None and c > 0 and m > 0:
                reads.append((t.read_page * n_layers, t.work_page * n_layers))
            offset += n
        return cls(work, fresh, spans, ckpts, reads, spec, list(keys))


def copy_reads(copies: Sequence[tuple[Sequence[Tensor], StateMetadata]]) -> None:
    """Copy prefix-hit checkpoints into the work pages, for each ``(layer's state views, its
    group's metadata)``: every read page is read before any work page is written (a read page is
    let go of when its step is allocated, so a later allocate of the step may have given its
    bytes to another request, of any group)."""
    taken = []
    for views, meta in copies:
        if meta.reads:
            src = torch.tensor([s for s, _ in meta.reads], device=views[0].device)
            dst = torch.tensor([d for _, d in meta.reads], device=views[0].device)
            taken.extend((v, dst, v[src]) for v in views)
    for v, dst, val in taken:
        v[dst] = val


def _load(views: Sequence[Tensor], pages: Tensor, fresh: Tensor) -> tuple[Tensor, ...]:
    """State tensors of ``pages`` in fp32, zero where ``fresh`` (stale bytes never read)."""
    out = []
    for v in views:
        s = v[pages].float()
        keep = ~fresh.view(-1, *([1] * (s.dim() - 1)))
        out.append(torch.where(keep, s, torch.zeros((), dtype=s.dtype, device=s.device)))
    return tuple(out)


def _store(views: Sequence[Tensor], pages: Tensor, state: Sequence[Tensor]) -> None:
    for v, s in zip(views, state, strict=True):
        v[pages] = s.to(v.dtype)


@dataclass
class StateContext(ForwardContext):
    """A :class:`ForwardContext` that also holds the state views and metadata of state layers."""

    state_views: Sequence[Sequence[Tensor] | None] = ()
    state_metadata: Sequence[StateMetadata | None] = ()
    speculative: SpeculativeStates | None = None  # where speculative tokens' inputs are kept

    def run_state(self, layer: int, u: Tensor, mixer) -> Tensor:
        """Run ``mixer`` over this step's per-token inputs ``u [T, F]`` of ``layer``; ``[T, G]``."""
        views, meta = self.state_views[layer], self.state_metadata[layer]
        dev = u.device
        outs: list[Tensor] = []
        spec = meta.spec or [0] * len(meta.spans)
        dec = [r for r, (_, n) in enumerate(meta.spans) if n - spec[r] == 1]
        pre = [r for r, (_, n) in enumerate(meta.spans) if n - spec[r] > 1]
        after: dict[int, tuple[Tensor, ...]] = {}  # request with speculative tokens -> state before them
        if dec:
            rows = torch.tensor([meta.spans[r][0] for r in dec], device=dev)
            pages = torch.tensor([meta.work[r] for r in dec], device=dev)
            fresh = torch.tensor([meta.fresh[r] for r in dec], device=dev)
            y, state = mixer.state_step(u[rows], _load(views, pages, fresh))
            _store(views, pages, state)
            for k, r in enumerate(dec):
                for _, page in meta.checkpoints[r]:  # only offset 1 is possible
                    _store(views, torch.tensor([page], device=dev), [s[k:k + 1] for s in state])
                if spec[r]:
                    after[r] = tuple(s[k:k + 1] for s in state)
            outs.append((rows, y))
        for r in pre:
            a, n = meta.spans[r]
            n -= spec[r]
            page = torch.tensor([meta.work[r]], device=dev)
            state = tuple(s[0] for s in _load(views, page, torch.tensor([meta.fresh[r]], device=dev)))
            done, ys = 0, []
            for o, ck in [*meta.checkpoints[r], (n, None)]:
                if o > done:
                    y, state = mixer.state_scan(u[a + done:a + o], state)
                    ys.append(y)
                    done = o
                if ck is not None:
                    _store(views, torch.tensor([ck], device=dev), [s[None] for s in state])
            _store(views, page, [s[None] for s in state])
            outs.append((torch.arange(a, a + n, device=dev), torch.cat(ys)))
            if spec[r]:
                after[r] = tuple(s[None] for s in state)
        if any(spec):
            outs.append(self._run_speculative(layer, u, mixer, after))
        if len(outs) == 1 and outs[0][0].numel() == u.shape[0]:
            return outs[0][1]
        y0 = outs[0][1]
        out = y0.new_empty(u.shape[0], *y0.shape[1:])
        for rows, y in outs:
            out[rows] = y
        return out

    def _run_speculative(self, layer: int, u: Tensor, mixer, after: dict[int, tuple[Tensor, ...]]):
        """(rows, y) of the speculative tokens: from the state after each request's other tokens
        (``after``) or, for a request running speculative tokens only, its work page."""
        views, meta = self.state_views[layer], self.state_metadata[layer]
        dev = u.device
        spec_rows = [r for r, s in enumerate(meta.spec) if s]
        alone = [r for r in spec_rows if r not in after]
        if alone:
            pages = torch.tensor([meta.work[r] for r in alone], device=dev)
            loaded = _load(views, pages, torch.zeros(len(alone), dtype=torch.bool, device=dev))
            for k, r in enumerate(alone):
                after[r] = tuple(s[k:k + 1] for s in loaded)
        state = tuple(torch.cat(parts) for parts in zip(*(after[r] for r in spec_rows), strict=True))
        spans = [(meta.spans[r][0] + meta.spans[r][1] - meta.spec[r], meta.spec[r]) for r in spec_rows]
        ys = self.speculative.run(layer, mixer, [meta.keys[r] for r in spec_rows], state,
                                  [u[a:a + s] for a, s in spans])
        rows = torch.cat([torch.arange(a, a + s, device=dev) for a, s in spans])
        return rows, torch.cat(ys)


class StateBindings:
    """Which layers of model ``own`` keep state in which group of ``manager``, and their state views."""

    def __init__(self, model, manager, n_layers: int, own: str | None = None):
        shapes = model.layer_states() if hasattr(model, "layer_states") else [None] * n_layers
        layout = manager.layout
        self.n_layers = n_layers
        self.groups: dict[int, int] = {}  # state group index -> its number of layers n_g
        self.layers: dict[int, list[int]] = {}
        self.views: list[list[Tensor] | None] = [None] * n_layers
        for gi, g in enumerate(manager.model.groups):
            if g.spec.per_token or (own is not None and g.spec.model != own):
                continue  # not a state group (its cache grows with tokens), or another model's (draft + target)
            self.groups[gi] = g.num_layers
            self.layers[gi] = list(g.layers)
            for j, layer in enumerate(g.layers):
                if shapes[layer] is None or tuple(map(tuple, shapes[layer])) != tuple(map(tuple, g.spec.shapes)):
                    raise ValueError(f"layer {layer}: model state shapes {shapes[layer]} but cache group "
                                     f"{g.name!r} keeps {g.spec.shapes}")
                self.views[layer] = layout.state_views(gi, j)
        for layer, s in enumerate(shapes):
            if s is not None and self.views[layer] is None:
                raise ValueError(f"layer {layer} keeps a state but no cache group of {manager.model.name} holds it")
        self.speculative = SpeculativeStates()

    def metadata(self, items, starts: list[int], counts: list[int],
                 spec: Sequence[int] | None = None) -> list[StateMetadata | None]:
        """Per layer: its group's :class:`StateMetadata` for ``items`` (None: no state layer)."""
        metas: list[StateMetadata | None] = [None] * self.n_layers
        keys = [it.seq.request_id for it in items] if spec is not None and any(spec) else ()
        for gi, n_g in self.groups.items():
            meta = StateMetadata.build([it.tables.groups[gi] for it in items], starts, counts, n_g, spec, keys)
            for layer in self.layers[gi]:
                metas[layer] = meta
        return metas

    def read_copies(self, metas: Sequence[StateMetadata | None]) -> list[tuple[Sequence[Tensor], StateMetadata]]:
        """What :func:`copy_reads` copies for ``metas`` (per state layer: its views and metadata)."""
        return [(self.views[layer], meta) for layer, meta in enumerate(metas) if meta is not None]

    def context(self, ctx: ForwardContext, items, starts: list[int], counts: list[int],
                spec: Sequence[int] | None = None, copy: bool = True) -> StateContext:
        """The step's :class:`StateContext` (items in token order; ``spec``: their speculative
        tokens, none by default); copies prefix-hit checkpoints first unless ``copy`` is False
        (the caller copied them, :func:`copy_reads`, before any forward of the step)."""
        metas = self.metadata(items, starts, counts, spec)
        if copy:
            copy_reads(self.read_copies(metas))
        return StateContext(ctx.kv_views, ctx.metadata, ctx.backend, self.views, metas, self.speculative)

    def commit_speculative(self, request_id: object, tables, start: int, keep: int) -> None:
        """Advance a request's states over its ``keep`` accepted speculative tokens from position
        ``start``: ``tables`` (its PageTables) were allocated for them and are not committed yet.
        Per state group, the state is read from its table's read page when it has one (as a step
        starts) else its work page, the kept inputs are replayed from it, the states at the
        table's checkpoint positions inside go to their pages and the last one to the work page.
        The kept inputs stay until the next step clears them (:meth:`SpeculativeStates.clear`)."""
        for gi, n_g in self.groups.items():
            t = tables.groups[gi]
            src = (t.read_page if t.read_page is not None and start > 0 else t.work_page) * n_g
            ckpts = {pos - start: page * n_g for pos, page in t.checkpoints.items() if start < pos <= start + keep}
            for layer in self.layers[gi]:
                views = self.views[layer]
                dev = views[0].device
                state = _load(views, torch.tensor([src], device=dev), torch.zeros(1, dtype=torch.bool, device=dev))
                done = 0
                for o in [*sorted(ckpts), keep]:
                    state = self.speculative.replay(layer, request_id, done, o, state)
                    done = o
                    if o in ckpts:
                        _store(views, torch.tensor([ckpts[o]], device=dev), state)
                _store(views, torch.tensor([t.work_page * n_g], device=dev), state)
