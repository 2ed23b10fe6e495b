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
from jenga.sched.scheduler import ScheduledRequest, Scheduler, StepPlan
from jenga.sched.sequence import Sequence

DRAFT_NAME = "draft"  # the draft's model name inside the combined spec (group names "draft/...")


class LookaheadManager:
    """The manager as the scheduler sees it: every ``allocate`` also covers the request's
    draft slots (``lookahead(request_id, num_new)`` of them); everything else passes through."""

    def __init__(self, manager, lookahead):
        self._mgr = manager
        self._lookahead = lookahead

    def allocate(self, request_id, num_new_tokens: int, *, num_lookahead: int = 0):
        extra = max(num_lookahead, self._lookahead(request_id, num_new_tokens))
        return self._mgr.allocate(request_id, num_new_tokens, num_lookahead=extra)

    def __getattr__(self, name):
        return getattr(self._mgr, name)


class SpecScheduler(Scheduler):
    """The scheduler with several tokens per sampling step (``sampled[i]`` is a list)."""

    def __init__(self, manager, *, num_speculative_tokens: int, **kwargs):
        self.k = num_speculative_tokens
        self.raw = manager
        self.by_id: dict[object, Sequence] = {}
        self.keep: dict[object, int] = {}  # request -> kept drafts whose K/V both models wrote
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
        if reason is None and keep:  # their K/V is in both caches: count them as computed
            if self.raw.allocate(seq.request_id, keep, num_lookahead=self.lookahead(seq.request_id, 0) - keep) is None:
                raise RuntimeError(f"request {seq.request_id!r}: slots of kept drafts were not held")
            self.raw.append_tokens(seq.request_id, ())
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
                 device: torch.device | str = "cpu"):
        self.target = target_runner
        self.draft = ModelRunner(draft_model, manager, device=device, model_name=DRAFT_NAME)
        self.sched = scheduler
        self.k = scheduler.k
        self.device = torch.device(device)

    def _forward(self, runner: ModelRunner, items: list[ScheduledRequest], rows: dict[int, list[int]]) -> Tensor:
        ids, pos, ctx, _ = runner.prepare(StepPlan(scheduled=items))
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
            logits = self._forward(self.draft, sub, {r: [0] for r in range(len(sub))})
            rows = {i: r for r, i in enumerate(nxt)}
        ext, want = [], {}
        for i, it in enumerate(items):
            if not it.sample:
                ext.append(it)
                continue
            toks = it.seq.tokens[:it.start + it.num_tokens] + drafts[i]
            ext.append(ScheduledRequest(_Tokens(it.seq.request_id, toks), it.start, it.num_tokens + len(drafts[i]),
                                        it.tables, True))
            want[i] = list(range(it.num_tokens - 1, it.num_tokens + len(drafts[i])))
        t_logits = self._forward(self.target, ext, want)
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
