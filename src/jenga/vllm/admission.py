"""The order jenga's scheduler admits waiting requests in: cached prefixes first.

vLLM admits its waiting queue first come, first served.  Under memory pressure that loses
the cache to the queue's own order: when the head of the queue misses, computing it evicts
the pages that the requests queued behind it were about to hit, and with a working set a
little larger than the pool (each round of questions over the same articles, in the same
order) every request evicts the next one's prefix and nothing ever hits (measured in
``benchmarks/vllm_side_by_side.py``: stock vLLM and jenga in FCFS order both hit 0 of 6 per
round at the tightest budget).  :class:`HitsFirst` moves the waiting requests whose prefix
jenga has cached ahead of those that would miss, keeping the queue's order inside each class,
so the hits are served before the misses evict their pages.

Bounds: only the first ``window`` waiting requests are probed per step (a probe is a jenga
``lookup`` let go at once: nothing is held); a preempted request keeps its place at the front;
a request overtaken on ``max_overtaken`` steps (1,024) is served in queue order again (no
starvation).  The bound is far above the waits the traces here show: at 64, RAG prompts at 4 % of
the budget (``benchmarks/vs_vllm_sched.py --tight 0.04``) sent the long-waiting misses ahead of the
hits each step, hits fell from 40.6 % to 31.1 % and req/s to 0.87x-0.89x of vLLM's cache-aware
admission (which has no bound) on Llama-3.1-8B, Ministral-8B and Llama-4-Scout.
``JENGA_VLLM_ADMISSION=fcfs`` keeps vLLM's order; ``deepest-first`` (the default) orders the hits
by the tokens they find cached, most first (the recompute each saves; vLLM 0.34's cache-aware
admission orders so), queue order among equals; ``hits-first`` keeps queue order among hits.

With the admissions ordered so (or by vLLM's own cache-aware admission), the pages jenga's
evictor protects (reused at least twice) may still hold a miss back while others run
(``KVCacheManager(admission="protect")``).  ``JENGA_VLLM_PROTECT``: ``always`` (that, with every page
reused twice protected),
``auto`` (``admission="ordered"`` whenever the admissions are ordered by cached prefix,
:mod:`jenga.core.manager.ordered_admission`), ``never``, or ``predict`` (the default: the hold and
the eviction order keep only the pages predicted to be read again: a request the scheduler holds
will read them, or their prefix departed and departed prefixes have tended to return;
``KVCacheManager(eviction="predict")``, :mod:`jenga.core.evict.predicted`).  Neither ``always`` nor ``auto``
wins every trace (``benchmarks/vs_vllm_sched.py``): with the questions on each article queued
together, ``auto`` keeps the hits at a larger batch; with rounds of questions arriving after the
previous round is done (a cyclic working set larger than the pool), only the protection keeps a
resident subset.  ``predict`` tells the two apart: the queued questions are known future uses,
and the rounds' prefixes are seen to return after they departed.  Fed by this scheduler,
``predict`` keeps pages used once too, on the same return rate (a chat's next turn reads its
previous turn's new pages); ``JENGA_VLLM_KEEP_ONCE=off`` keeps reused pages only.

vLLM's whole-prompt admission check asks whether a request's prompt fits now; the pages it counts
free may be the ones a longer prompt admitted before it computes in its next prefill steps.  Then
that prompt's next chunk finds no page, and vLLM preempts running requests for it, newest first
(measured on Jamba-1.5-Mini's agent sessions at 4 % of an H200's budget: 38 of 42 preemptions were
made for a running request's prefill chunk, 11 of their victims had 64 tokens or fewer left).
``JENGA_VLLM_RESERVE=prefill`` (the default) counts those pages as taken in the check
(``KVCacheManager.can_allocate(reserve=True)``); ``off`` does not.
"""

from __future__ import annotations

from itertools import islice
from operator import is_

from jenga.core.evict.predicted import PredictedOptions
from jenga.vllm.switches import switch

ADMISSION_ENV = "JENGA_VLLM_ADMISSION"
ADMISSIONS = ("hits-first", "deepest-first", "fcfs")
PROTECT_ENV = "JENGA_VLLM_PROTECT"
PROTECTS = ("auto", "always", "never", "predict")
KEEP_ONCE_ENV = "JENGA_VLLM_KEEP_ONCE"
KEEP_ONCE = ("on", "off")
RESERVE_ENV = "JENGA_VLLM_RESERVE"
RESERVES = ("prefill", "off")


def admission_name() -> str:
    """The order ``JENGA_VLLM_ADMISSION`` asks for (default ``deepest-first``)."""
    return switch(ADMISSION_ENV, ADMISSIONS, "deepest-first")


def reserve_prefills() -> bool:
    """Whether vLLM's whole-prompt admission check (``scheduler_reserve_full_isl``) also counts as
    taken the pages the admitted requests still need to reach their prompt's end
    (``JENGA_VLLM_RESERVE=prefill``, the default; ``off`` does not; module doc)."""
    return switch(RESERVE_ENV, RESERVES, "prefill") == "prefill"


def manager_admission(ordered: bool) -> str:
    """The manager's admission rule (``KVCacheManager(admission=...)``) for a scheduler whose
    admissions are ``ordered`` by cached prefix or not, as ``JENGA_VLLM_PROTECT`` asks (module doc)."""
    name = switch(PROTECT_ENV, PROTECTS, "predict")
    if name == "auto":
        return "ordered" if ordered else "protect"
    return "ordered" if name == "never" else "protect"


def manager_eviction() -> str | None:
    """The manager's eviction order (``KVCacheManager(eviction=...)``) ``JENGA_VLLM_PROTECT`` asks
    for: ``predict`` protects the pages a common-prefix predictor fed by this scheduler says will
    be read again (``jenga.core.evict.predicted``); else the manager's default."""
    return "predict" if switch(PROTECT_ENV, PROTECTS, "predict") == "predict" else None


def manager_eviction_options(ordered: bool, step_tokens: int) -> PredictedOptions | None:
    """The options of :func:`manager_eviction`'s order (``KVCacheManager(eviction_options=...)``), for
    a scheduler whose admissions are ``ordered`` by cached prefix or not and whose step computes at
    most ``step_tokens`` tokens (vLLM's ``max_num_batched_tokens``); ``None``: the manager's default
    order, which takes none.  The predictor in them is new: the scheduler feeds it."""
    if manager_eviction() != "predict":
        return None
    # admissions ordered by cached prefix serve the queued hits first: their pages hold none back;
    # a held prefix's checkpoint whose miss would cost its reader a step more is protected; pages
    # used once are kept too (JENGA_VLLM_KEEP_ONCE=off: reused only)
    return PredictedOptions(hold_live=not ordered, step_tokens=step_tokens,
                            used_once=switch(KEEP_ONCE_ENV, KEEP_ONCE, "on") == "on")


class HitsFirst:
    """Reorders a vLLM FCFS waiting queue in place (module doc)."""

    def __init__(self, probe, *, window: int, max_overtaken: int = 1024, deepest: bool = False, version=None):
        self.probe = probe  # request -> tokens of its prompt jenga has cached (holds nothing)
        self.deepest = deepest  # hits ordered by cached tokens, most first
        self.window = window
        self.max_overtaken = max_overtaken
        self.overtaken: dict[str, int] = {}  # request id -> steps it was moved back
        # () -> a value that changes whenever a probe's answer of a waiting request may change
        # (the prefix index's version); None: probe every step
        self.version = version
        # (version, head) of the last reorder that left its window as it was: the same requests in
        # the same order at the same version are left so again, without probing (a blocked queue)
        self._kept: tuple | None = None

    def reorder(self, waiting) -> None:
        """Stable partition of the first ``window`` requests of ``waiting`` (a deque): first the
        ones that go first anyway (preempted, overtaken too often) or hit, then the misses.

        A window of the same request objects in the same order as the last reorder that changed
        nothing, at the same ``version``, is left as it is at once: every input of that decision
        is the same (a waiting request's tokens and preemptions do not change while it waits,
        the probes' answers only with the version, the overtaken counts only when the order
        changes)."""
        if len(waiting) < 2:
            self.overtaken.clear()
            self._kept = None
            return
        head = list(islice(waiting, self.window))
        version = None if self.version is None else self.version()
        kept = self._kept
        if kept is not None and kept[0] == version and len(kept[1]) == len(head) and all(map(is_, kept[1], head)):
            return
        self._kept = None
        first, hits, later = [], [], []
        for r in head:
            if r.num_preemptions > 0 or self.overtaken.get(r.request_id, 0) >= self.max_overtaken:
                first.append(r)
                continue
            cached = self.probe(r)
            if cached > 0:
                hits.append((cached, r))
            else:
                later.append(r)
        if self.deepest:
            hits.sort(key=lambda x: -x[0])  # stable: queue order among equals
        first += [r for _, r in hits]
        if not first or (not later and not self.deepest):
            self._kept = None if version is None else (version, head)
            return
        order = first + later
        if order == head:
            self._kept = None if version is None else (version, head)
            return
        # a request that one queued behind it now passes is overtaken this step: a miss passed by a hit,
        # and with ``deepest`` a hit passed by a deeper one (else a shallow hit waits without bound)
        place = {id(r): i for i, r in enumerate(head)}
        furthest, overtaken = -1, self.overtaken
        for r in order:
            i = place[id(r)]
            if i < furthest:
                overtaken[r.request_id] = overtaken.get(r.request_id, 0) + 1
            else:
                furthest = i
        live = {r.request_id for r in waiting}
        for rid in [rid for rid in self.overtaken if rid not in live]:
            del self.overtaken[rid]
        for _ in head:
            waiting.popleft()
        waiting.extendleft(reversed(order))
