"""Speculative decoding with a draft model whose cache shares the target's jenga pool.

``LLM(target, speculative_model=<dir or tiny name>, num_speculative_tokens=k)`` builds the
draft, gives the manager ``target_spec.combine(draft_spec)`` (both models' layer groups in one
LCM pool, one request record covering both caches) and runs each step as:

1. the scheduler plans as usual; :class:`LookaheadManager` makes every allocation cover ``k``
   more token slots (the drafts' K/V, in both caches);
2. the draft runs the plan's tokens (its K/V for them), then proposes ``k`` tokens one forward
   at a time for every request that samples this step;
3. the target runs its tokens plus the drafts in **one** forward and
   :mod:`jenga.engine.rejection_sampler` keeps a prefix of the drafts and adds one token;
4. :class:`SpecScheduler` commits the emitted tokens.  The manager's ``num_computed`` advances
   over the kept drafts whose K/V both models wrote (the draft never fed its last proposal, so
   after ``k`` acceptances that one is fed again next step, with the new token).  Slots of
   rejected drafts stay beyond ``num_computed``: the next step overwrites them, and full pages
   are only registered in the prefix cache up to ``num_computed``.

State layers (Mamba-1/2, Gated DeltaNet; hybrid targets and drafts) cannot overwrite a rejected
token's state later: both models run their drafts as *speculative* tokens whose states never reach a
page, and the kept drafts' states are replayed into the pages between the two commits of step 4
(:mod:`jenga.engine.speculative_state`), so a checkpoint or prefix hit only ever holds a state at an
accepted position.  Every read page of the step (a prefix hit's or a checkpoint's state) is copied
into its work page before the draft's first forward: the allocate let go of it, and a later
allocate of the step may have given its bytes to another group.

Preemption needs nothing special: the request leaves the manager (both caches) and comes back
as a longer prompt that both models prefill.  The draft may be another architecture (a Llama
draft for a Gemma-3 target) when the vocabularies match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from jenga.engine.model_runner import ModelRunner
from jenga.engine.rejection_sampler import draw, verify, verify_greedy
from jenga.engine.sampler import probabilities
from jenga.engine.state import copy_reads
from jenga.errors import UnsupportedFeatureError
from jenga.sched.scheduler import ScheduledRequest, Scheduler, StepPlan
from jenga.sched.sequence import Sequence

DRAFT_NAME = "draft"  # the draft's model name inside the combined spec (group names "draft/...")


def check_draft_groups(spec, manager, name: str) -> None:
    """Both models' layers must sit in cache groups named after their model (``ModelRunner`` binds
    them so): a manager (``name``) storing the combined ``spec``'s layers in shared groups is refused."""
    for model in {g.spec.model for g in spec.groups}:
        want = sorted(layer for g in spec.groups if g.spec.model == model for layer in g.layers)
        got = sorted(layer for g in manager.model.groups if g.spec.model == model for layer in g.layers)
        if got != want:
            raise UnsupportedFeatureError(
                f"speculative decoding with manager {name!r}: it stores the layers of the target and the draft in "
                "shared cache groups, so neither model's layers can be bound to pages of their own; use manager "
                "'jenga', 'static' or 'uniform'")


class LookaheadManager:
    """The manager as the scheduler sees it: every ``allocate`` also covers the request's
    draft slots (``lookahead(request_id, num_new)`` of them), and so does ``can_allocate`` (the
    scheduler's probe for a chunk that fits a request running alone must ask what ``allocate``
    will take); everything else passes through."""

    def __init__(self, manager, lookahead):
        self._mgr = manager
        self._lookahead = lookahead

    def allocate(self, request_id, num_new_tokens: int, *, num_lookahead: int = 0):
        extra = max(num_lookahead, self._lookahead(request_id, num_new_tokens))
        return self._mgr.allocate(request_id, num_new_tokens, num_lookahead=extra)

    def can_allocate(self, request_id, num_new_tokens: int, *, num_lookahead: int = 0, **kw) -> bool:
        extra = max(num_lookahead, self._lookahead(request_id, num_new_tokens))
        return self._mgr.can_allocate(request_id, num_new_tokens, num_lookahead=extra, **kw)

    def __getattr__(self, name):
        return getattr(self._mgr, name)


class SpecScheduler(Scheduler):
    """The scheduler with several tokens per sampling step (``sampled[i]`` is a list).

    Kept drafts are committed in two parts: the emitted tokens and the plan's tokens first
    (``append_tokens``), then ``allocate(keep)`` turns the kept drafts' slots into scheduled
    tokens, ``on_kept`` (the engine: the state layers advance over them,
    :mod:`jenga.engine.speculative_state`) runs, and a second ``append_tokens`` commits them.  So a
    state page registered at either commit holds the state at that commit's position.  Nothing
    else allocates in between: the read page the allocate let go of is still intact."""

    def __init__(self, manager, *, num_speculative_tokens: int, **kwargs):
        self.k = num_speculative_tokens
        self.raw = manager
        self.by_id: dict[object, Sequence] = {}
        self.keep: dict[object, int] = {}  # request -> kept drafts whose K/V both models wrote
        self.on_kept = None  # callable(request id, tables, first position, count) before their commit
        super().__init__(LookaheadManager(manager, self.lookahead), **kwargs)

    def lookahead(self, request_id, num_new: int) -> int:
        """Draft slots for a request's next allocation (never past the model's maximum length)."""
        seq = self.by_id.get(request_id)
        if seq is None:
            return 0
        return max(0, min(self.k, self.max_model_len - seq.num_computed - num_new))

    def add(self, seq: Sequence) -> None:
        super().add(seq)
        self.by_id[seq.request_id] = seq

    def commit(self, seq: Sequence, toks) -> bool:
        emitted, reason = [], None
        for tok in toks:
            seq.append(tok)
            emitted.append(tok)
            reason = self._stop_reason(seq, tok)
            if reason is not None:
                break
        del seq.logits[len(seq.output_token_ids):]
        self.raw.append_tokens(seq.request_id, emitted)
        keep = self.keep.pop(seq.request_id, 0)
        if reason is None and keep:
            rid = seq.request_id
            tables = self.raw.allocate(rid, keep, num_lookahead=self.lookahead(rid, 0) - keep)
            if tables is not None:  # None (changes nothing): a state group needs a page the pool has not
                if self.on_kept is not None:  # left; the next step feeds the kept drafts again
                    self.on_kept(rid, tables, seq.num_computed, keep)
                self.raw.append_tokens(rid, ())  # their K/V is in both caches, their states advanced
                seq.num_computed += keep
        if reason is None:
            return False
        self._finish(seq, reason, emitted[-1] if reason == "stop" else None)
        return True

    def _finish(self, seq: Sequence, reason: str, stop_reason: object) -> None:
        super()._finish(seq, reason, stop_reason)
        self.by_id.pop(seq.request_id, None)
        self.keep.pop(seq.request_id, None)


@dataclass(eq=False)
class _Tokens:
    """What the model runner reads of a request: its id and a token list (with drafts)."""

    request_id: object
    tokens: list[int]
    images: tuple = ()


class SpeculativeDecoder:
    """Draft proposals + one verifying target forward per step (see the module docstring)."""

    def __init__(self, target_runner: ModelRunner, draft_model, manager, scheduler: SpecScheduler, *,
                 device: torch.device | str = "cpu", host_pool=None):
        self.manager, self.host_pool = manager, host_pool
        self.target = target_runner
        self.draft = ModelRunner(draft_model, manager, device=device, model_name=DRAFT_NAME)
        self.sched = scheduler
        self.k = scheduler.k
        self.device = torch.device(device)
        scheduler.on_kept = self.commit_states

    def commit_states(self, request_id, tables, start: int, keep: int) -> None:
        """Both models' state layers advance over a request's kept drafts (``SpecScheduler.on_kept``).
        The tiers' copies of that allocate run first: a page it took may be one being demoted."""
        if self.host_pool is not None:
            self.host_pool.execute(self.manager.take_copy_plan())
        with torch.inference_mode():
            for runner in (self.target, self.draft):
                runner.states.commit_speculative(request_id, tables, start, keep)

    def _forward(self, runner: ModelRunner, items: list[ScheduledRequest], rows: dict[int, list[int]],
                 spec: list[int] | None = None) -> Tensor:
        ids, pos, ctx, _ = runner.prepare(StepPlan(scheduled=items), spec, copy_reads=False)
        idx = [runner.item_first[i] + r for i in range(len(items)) for r in rows.get(i, ())]
        t0 = time.perf_counter()
        with torch.inference_mode():
            if not idx:
                runner.model.model(ids, pos, ctx)
                out = torch.empty(0)
            else:
                out = runner.model(ids, pos, ctx, torch.tensor(idx, dtype=torch.long, device=self.device)).float()
        self._forward_s += time.perf_counter() - t0
        return out

    def execute(self, plan: StepPlan, default_generator, metrics) -> list[list[int] | None]:
        """Run the step; returns per plan item the emitted tokens (None for non-final chunks)."""
        self._forward_s = 0.0
        items = plan.scheduled
        starts, counts = [it.start for it in items], [it.num_tokens for it in items]
        copies = []
        for runner in (self.target, self.draft):  # every read page of the step before any forward writes
            runner.states.speculative.clear()
            copies += runner.states.read_copies(runner.states.metadata(items, starts, counts))
        copy_reads(copies)
        samp = [i for i, it in enumerate(items) if it.sample]
        ks = {i: self.sched.lookahead(items[i].seq.request_id, items[i].num_tokens) for i in samp}
        gens = {i: items[i].seq.generator or default_generator for i in samp}
        drafts: dict[int, list[int]] = {i: [] for i in samp}
        qs: dict[int, list[Tensor]] = {i: [] for i in samp}
        logits = self._forward(self.draft, list(items), {i: [items[i].num_tokens - 1] for i in samp})
        rows = {i: r for r, i in enumerate(samp)}
        for j in range(1, self.k + 1):
            active = [i for i in samp if ks[i] >= j]
            for i in active:
                row, params = logits[rows[i]], items[i].seq.params
                if params.greedy:
                    drafts[i].append(int(row.argmax()))
                else:
                    q = probabilities(row[None], [params])[0]
                    qs[i].append(q)
                    drafts[i].append(draw(q, gens[i]))
            nxt = [i for i in active if ks[i] > j]
            if not nxt:
                break
            sub = []
            for i in nxt:
                it = items[i]
                toks = it.seq.tokens[:it.start + it.num_tokens] + drafts[i]
                sub.append(ScheduledRequest(_Tokens(it.seq.request_id, toks), it.start + it.num_tokens + j - 1, 1,
                                            it.tables, True))
            logits = self._forward(self.draft, sub, {r: [0] for r in range(len(sub))}, [1] * len(sub))
            rows = {i: r for r, i in enumerate(nxt)}
        ext, want, spec = [], {}, [0] * len(items)
        for i, it in enumerate(items):
            if not it.sample:
                ext.append(it)
                continue
            spec[i] = len(drafts[i])
            toks = it.seq.tokens[:it.start + it.num_tokens] + drafts[i]
            ext.append(ScheduledRequest(_Tokens(it.seq.request_id, toks), it.start, it.num_tokens + len(drafts[i]),
                                        it.tables, True))
            want[i] = list(range(it.num_tokens - 1, it.num_tokens + len(drafts[i])))
        t_logits = self._forward(self.target, ext, want, spec)
        self.target.last_forward_s = self._forward_s
        out: list[list[int] | None] = [None] * len(items)
        at = 0
        for i in samp:
            n = len(want[i])
            rows_i = t_logits[at:at + n]
            at += n
            seq = items[i].seq
            if seq.params.greedy:
                emitted = verify_greedy(rows_i, drafts[i])
            else:
                p = probabilities(rows_i, [seq.params] * n)
                q = torch.stack(qs[i]) if qs[i] else p[:0]
                emitted = verify(p, q, drafts[i], gens[i])
            if seq.params.return_logits:
                seq.logits.extend(r.clone() for r in rows_i[:len(emitted)])
            kept = len(emitted) - 1
            self.sched.keep[seq.request_id] = min(kept, ks[i] - 1) if ks[i] else 0
            metrics.spec_proposed += len(drafts[i])
            metrics.spec_accepted += kept
            metrics.spec_verifications += 1
            metrics.spec_emitted += len(emitted)
            out[i] = emitted
        metrics.spec_target_forwards += 1
        return out
