"""An evictor that keeps the pages a common-prefix predictor says will be read again.

:class:`~jenga.core.evict.evictor.ReuseEvictor` protects every page reused at least twice: it is
evicted last and, under the manager's ``"protect"`` admission, holds admissions back while
others run.  That keeps a resident subset of a cyclic working set (rounds of questions over more
articles than the pool holds), but it also keeps the pages of a prefix whose requests are all
done (the last question on an article) at the cost of the batch.  Here the protected class is
what :class:`~jenga.core.prefix.next_use.NextUse` predicts (the value of a page: the recompute
it saves per byte, times the chance it is read again, against the batch its bytes hold back):

1. pages released aged (out of window or chunk), oldest first, as before;
2. pages with no predicted next use (no live request reads them, and departed prefixes have not
   tended to come back; or used once and the predictor fed nothing), LRU;
3. pages kept on the learned return rate (no live user, ``NextUse.keeps_departed``: reused, or
   used once where a scheduler feeds the predictor, ``NextUse.keeps_used_once``), most recently
   released first (a stable resident subset, as before); and such a page whose block a running
   request still holds (a Mamba checkpoint it passed or resumed from: nothing departed) when a
   miss on it would cost a step: it ends past ``step_tokens`` (below; both only while departed
   prefixes tend to return);
4. pages a live request will read (a waiting request's hit, a preempted request's resume),
   whatever their use count, most recently released first.

Pages used once are kept too where a scheduler feeds the predictor: a chat's next turn reads
what its previous turn wrote once (the new pages of its prompt and its prompt-end state
checkpoint), released before the next turn arrives.  Measured on Nemotron-H-8B's round-robin
chats at 4 % of the H100 budget (``benchmarks/vs_vllm_sched.py``): with only reused pages kept,
the pool evicted those checkpoints for the requests admitted meanwhile and one chat's later turns
found nothing (hits 43.7 %, 0.97x vLLM-best req/s); kept, 48.4 % and 1.04x.  Fed nothing (the
simulator, the engine), the evictor keeps what the reuse evictor kept.

Class 3 pages are the evictor's protected pages (``protected_supply``): they hold admissions
back while others run, since no request in the queue stands for them.  Class 4 pages hold
admissions back only with ``hold_live`` (a scheduler that admits in queue order); a scheduler
that admits cached prefixes first (``jenga.vllm.admission``, vLLM 0.34's cache-aware admission)
serves their readers before any miss, and holding a miss back for them only costs batch and
tail latency (measured on Llama-4-Scout RAG prompts at a quarter of the budget: p99 TTFT 2.97x
vLLM-best with the hold, 1.01x without, the same req/s).

A checkpoint of a prefix a running request still holds is the one page that keeps that whole
prefix reusable: its token pages stay resident with their holder, and a hybrid's hit needs both.
Keeping it saves its next reader the recompute of its whole prefix, ``p`` tokens, for one state
page.  Under a scheduler's step budget (``step_tokens``, vLLM's ``max_num_batched_tokens``) a miss
of ``p <= step_tokens`` tokens fits in about the step that prefills the reader's own new tokens
anyway (a longer step, hardly a step more), while a longer prefix costs its reader about
``p / step_tokens`` steps more and the batch that many full steps: such a checkpoint is protected
(class 3).  Measured at a quarter of the H100 budget: Falcon-H1-7B on 16 articles x 4 questions
(the article-end checkpoints, 17k-22k tokens in, evicted for each new article's first question
while the article's earlier questions still decoded: 0.87x vLLM-best req/s; protected: 1.36x); on
RAG prompts the one such page (one 1,568-token block in) protected held admissions back for
nothing (p99 TTFT 1.7 s against 0.6 s), and stays unprotected.  Without a step budget (``None``,
the default) no such page is protected.

The predictor is fed by the scheduler (``jenga.vllm``: every request added and finished); fed
nothing (the simulator, the engine) it predicts no live use and keeps reused pages at its
prior return rate, as ``ReuseEvictor`` does.  A page's class is decided when it is released.

The scheduler hands its predictor, ``hold_live``, ``step_tokens`` and ``used_once`` in when the
manager is built (:class:`PredictedOptions`, ``KVCacheManager(eviction="predict",
eviction_options=...)``); they are fixed for the evictor's life.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jenga.core.evict.evictor import PROTECTED, PrefixEvictor, ReuseEvictor
from jenga.core.flat_arrays import BULK
from jenga.core.policy.base import held_window_time
from jenga.core.prefix.next_use import NextUse
from jenga.core.validation import checked_int
from jenga.errors import InvalidArgumentError

#: class 3 keys lie this far below class 4's (both above ``PROTECTED // 2``: evicted after classes 1-2)
DEPARTED = 1 << 59


@dataclass(frozen=True)
class PredictedOptions:
    """The predicted evictor's options, given when the manager is built (module doc).

    ``next_use``: the predictor the scheduler feeds (it keeps the same object; default: a fresh one
    nothing feeds); ``hold_live``: class 4 pages hold admissions back too (False for a scheduler that
    admits cached prefixes first); ``step_tokens``: the scheduler's token budget of one step (a
    kept page of a held prefix ending past it is protected; None: none is); ``used_once``: pages
    used once are kept too where the predictor is fed (False: reused pages only).  A bad field raises
    ``InvalidArgumentError`` naming it, here, before any manager state exists."""

    next_use: NextUse = field(default_factory=NextUse)
    hold_live: bool = True
    step_tokens: int | None = None
    used_once: bool = True

    def __post_init__(self):
        if not isinstance(self.next_use, NextUse):
            raise InvalidArgumentError(f"PredictedOptions: next_use must be a NextUse, got {type(self.next_use).__name__}")
        for name in ("hold_live", "used_once"):
            if type(getattr(self, name)) is not bool:
                raise InvalidArgumentError(f"PredictedOptions: {name} must be a bool, got {getattr(self, name)!r}")
        if self.step_tokens is not None:
            object.__setattr__(self, "step_tokens", checked_int(self.step_tokens, "PredictedOptions: step_tokens"))


class PredictedEvictor(ReuseEvictor):
    """``ReuseEvictor`` whose protected classes are the predicted next uses (module doc)."""

    options_class = PredictedOptions

    def __init__(self, pages, index, listener=None, options: PredictedOptions | None = None):
        super().__init__(pages, index, listener)
        options = PredictedOptions() if options is None else options
        self.next_use = options.next_use
        self.hold_live = options.hold_live  # class 4 pages hold admissions back too (module doc)
        # the scheduler's token budget of one step: a kept page (class 3) of a held prefix ending
        # past it is protected (module doc); None: none is
        self.step_tokens = options.step_tokens
        self.used_once = options.used_once  # pages used once are kept too where the predictor is fed

    def classes(self, group: int, ids, held_window: bool = False, ends=None) -> list[int]:
        """Per page of ``ids`` (``ends``: the token position each ends at): 4 (a live request reads
        it), 3 (kept on the return rate) or 0.  Class 3 is for departed prefixes: a page whose block
        a request the scheduler holds still holds (a Mamba checkpoint a running request passed) is
        no departed prefix, and no future use of that request (``NextUse``), and is kept only when
        it ends past ``step_tokens`` (module doc); ``held_window``: the window before a branch point
        of a prefix its holder still holds, kept with that prefix whatever its holders."""
        live = self.next_use.live
        keys, uses = self.index.keys[group], self.index.page_uses[group]
        departed = self.next_use.keeps_departed()
        # the uses a page needs to be kept (module doc)
        least = 1 if self.used_once and self.next_use.keeps_used_once() else 2
        running = self.next_use.holders if not held_window else ()
        past = self.step_tokens
        out = []
        for i, page in enumerate(ids):
            if live and keys[page] in live:
                out.append(4)
            elif departed and uses[page] >= least and (keys[page] not in running
                                                   or (past is not None and ends is not None and ends[i] > past)):
                out.append(3)
            else:
                out.append(0)
        return out

    def priorities_of(self, group: int, ids, last_access: int, negs=None):
        self.record_times(group, ids, last_access)
        if last_access < 0:
            return last_access
        t, held_window = held_window_time(last_access)
        ends = None if negs is None else [-n for n in (negs.tolist() if type(negs) is np.ndarray else negs)]
        cls = self.classes(group, ids.tolist() if type(ids) is np.ndarray else ids, held_window, ends)
        if 3 not in cls and 4 not in cls:
            return t
        live = PROTECTED if held_window else PROTECTED - t  # a window its holder's prefix needs: last of all
        prios = [live if c == 4 else live - DEPARTED if c == 3 else t for c in cls]
        held = (3, 4) if self.hold_live else (3,)
        kept = [p for p, c in zip(ids, cls, strict=True) if c in held]
        if kept:
            self._protect(group, np.asarray(kept, dtype=np.int64) if len(kept) > BULK else [int(p) for p in kept], True)
        return np.asarray(prios, dtype=np.int64) if len(ids) > BULK else prios

    def key_run(self, group: int, ids, negs, last_access: int) -> tuple:
        """``PrefixEvictor.key_run`` (the reuse evictor's short-run loop reads use counts only)."""
        return PrefixEvictor.key_run(self, group, ids, negs, last_access)

    def rekeyed(self, group: int, pages: list[int]) -> list[int]:
        keys, out = self.keys[group], []
        cls = self.classes(group, pages, ends=[-keys[p][1] if p in keys else 0 for p in pages])
        for page, c in zip(pages, cls, strict=True):
            key = keys.get(page)
            if c and key is not None and 0 <= key[0] <= PROTECTED // 2:
                out.append(page)
        return out
