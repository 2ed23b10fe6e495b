"""``KVCacheManager``: the one API an engine calls.

A request's way through it: ``add_request`` (validate and keep the prompt; its block hashes are
made lazily, :mod:`jenga.core.prefix.index`) -> ``lookup`` (each group's policy proposes the longest
valid hit; the manager iterates to the longest length every group accepts) -> ``allocate`` (count
the pages each group needs, check them against free + evictable memory *before* touching anything,
then take pages in the request-aware order; attention pages of full blocks of known tokens join
the prefix index at once, so a request admitted later in the same step shares them) -> the engine
runs the step -> ``append_tokens`` (the remaining full pages join the index; pages that left the
window or chunk go to the evictor) -> ``free``.  A step dropped before its commit unregisters
what it would have filled (:mod:`jenga.core.manager.commit`).

The manager is a façade: it owns its parts and calls them.  The allocator and its free pool; the
prefix cache: the index, one policy per group, the evictor; the ledger of who holds which page (the
``PageOps`` the policies call); admission, what an allocation may take and whether it fits; the
request intake, the prompt hasher, the lookup (with the junction finder), the step commit, hit
counts and byte accounting (built and wired by :mod:`jenga.core.manager.parts`).  It keeps the live
records (``view`` is their read-only face; ``pool`` the pool's).
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga.core.manager import cache_control
from jenga.core.manager.integrity import check_manager
from jenga.core.manager.ledger import Grant
from jenga.core.manager.ordered_admission import ADMISSION_RULES
from jenga.core.manager.parts import build_parts, check_choices
from jenga.core.manager.pool import PoolShape
from jenga.core.manager.rules import ManagerRules
from jenga.core.manager.stats import CacheStats, collect_stats
from jenga.core.policy.registry import OUT_OF_WINDOW_AGE, Policy
from jenga.core.prefix.events import HOST, EventLog, KVEvent
from jenga.core.request import GroupState, ImageRef, Request, RequestView
from jenga.core.specs import ModelSpec
from jenga.core.tables import PageTables
from jenga.core.tier.copy_plan import CopyPlan
from jenga.core.validation import TOKEN_ID_LIMIT, checked_int, token_array
from jenga.errors import InvalidArgumentError, SequenceTooLongError, UnknownRequestError
from jenga.units import parse_bytes


class KVCacheManager:
    """Jenga's KV-cache manager for one (possibly composite) model.

    ``memory_bytes`` is the KV budget; it is cut into ``floor(memory / S) - 1`` large pages of
    ``S = lcm(small pages)`` bytes.  ``tokens_per_page`` is the base page (and hash block) size; groups may use
    multiples of it to keep the LCM bounded (``max_lcm_ratio`` x the largest small page).  Sliding groups
    release the window before a branch point (hit, junction, prompt end plus ``window_slack`` tokens below it,
    default ``W // 2``) valued like its prefix, so a prompt ending a little earlier still hits.  Pages that
    leave the window or chunk are stamped ``out_of_window_age`` clock ticks older, so they are evicted first
    (0: their release time, the paper's text).  ``eviction``: ``"reuse"`` (jenga's default; pages reused at
    least twice outlive one-off pages and a stable subset of them survives a cyclic working set larger than
    the pool, see :mod:`jenga.core.evict.evictor`), ``"lru"`` (the paper's order; the baselines'
    default) or ``"predict"`` (:mod:`jenga.core.evict.predicted`); ``eviction_options``: the options that
    order takes (its ``options_class``, e.g. ``PredictedOptions``; ``None``: its defaults), handed to the
    evictor as it is built.  ``admission``: ``"protect"`` (the default: pages the evictor protects hold
    admissions back while others run) or ``"ordered"`` (for a scheduler that admits cached prefixes first, see
    :mod:`jenga.core.manager.ordered_admission`).  ``device`` is only used by :attr:`layout`.  What a
    variant changes (model transform, policies, admission, eviction default, caps, a step before
    allocating) is its ``rules_class`` (:mod:`jenga.core.manager.rules`; the baselines bring theirs),
    or a ``rules`` instance handed in (a variant whose rules take settings, e.g. ``uniform``'s).
    """

    name = "jenga"
    rules_class = ManagerRules

    def __init__(self, model: ModelSpec, memory_bytes: int | str, *, tokens_per_page: int = 16,
                 enable_prefix_caching: bool = True, device: str = "cpu", max_lcm_ratio: float = 8.0,
                 fit_pages: bool = True, window_slack: int | None = None, out_of_window_age: int = OUT_OF_WINDOW_AGE,
                 eviction: str | None = None, host_memory_bytes: int | str | None = None,
                 host_policy: str = "per-kind", admission: str | None = None, rules: ManagerRules | None = None,
                 eviction_options: object = None):
        tokens_per_page = checked_int(tokens_per_page, "tokens_per_page")
        memory_bytes = parse_bytes(memory_bytes)  # an int, or "64GiB" like the CLI
        if host_memory_bytes is not None:
            host_memory_bytes = parse_bytes(host_memory_bytes)
        if window_slack is not None:
            window_slack = checked_int(window_slack, "window_slack", minimum=0)
        self.rules = rules = self.rules_class() if rules is None else rules  # a variant's rules, injected
        eviction = eviction or rules.default_eviction
        check_choices(eviction, host_policy, eviction_options)
        if admission is not None and admission not in ADMISSION_RULES:
            raise InvalidArgumentError(f"unknown admission rule {admission!r}; choose one of {sorted(ADMISSION_RULES)}")
        if admission is not None:  # this manager's rules only
            rules.admission_class = ADMISSION_RULES[admission]
        self.window_slack = window_slack
        self.source_model = model
        model = rules.prepare_model(model, tokens_per_page, max_lcm_ratio if fit_pages else None)
        self.page_plan = rules.page_plan
        self.model = model
        self.block = tokens_per_page
        self.caching = enable_prefix_caching
        self.device = device
        self.large_page_bytes = model.large_page_bytes
        self.memory_bytes = memory_bytes
        p = build_parts(model, self.source_model, memory_bytes, host_memory_bytes, block=self.block, caching=self.caching,
                        eviction=eviction, out_of_window_age=out_of_window_age, window_slack=window_slack,
                        host_policy=host_policy, rules=rules, eviction_options=eviction_options)
        self._alloc, self._index, self._evictor, self.ledger, self.clock = p.alloc, p.index, p.evictor, p.ledger, p.clock
        self.policies: list[Policy] = p.policies
        self.admission, self.hasher, self.host, self.prefix_lookup = p.admission, p.hasher, p.host, p.lookup
        self.junction = p.lookup.junction  # where a state hit's cached attention prefix ends
        self.step_commit, self.accounting, self.hits, self.intake = p.commit, p.accounting, p.hits, p.intake
        self.requests: dict[object, Request] = {}
        self._max_tokens = model.max_model_len + 1
        self._before_allocate = rules.before_allocate
        self._layout = None

    # ----------------------------------------------------------- the parts
    def _settle(self, req: Request | None = None) -> None:
        """Hold a lookup's deferred hit (:mod:`jenga.core.manager.ledger`): once, at the entry of
        each call that reads or moves pages.  ``req``: the call is the deferred request's own
        ``lookup`` or ``free``, which lets its hit go without holding it."""
        ledger = self.ledger
        if ledger.deferred is not None and ledger.deferred is not req:
            ledger.settle()

    def _settled(self, part):
        self._settle()
        return part

    alloc = property(lambda self: self._settled(self._alloc), doc="The allocator (tests and checks).")
    index = property(lambda self: self._settled(self._index), doc="The prefix index.")
    evictor = property(lambda self: self._settled(self._evictor), doc="The evictor.")
    ref = property(lambda self: self._settled(self.ledger.ref), doc="Per group and page: references (the ledger's).")
    prefix_hit_tokens = property(lambda self: self.hits.hit_tokens, doc="Prompt tokens found cached (all lookups).")
    prefix_query_tokens = property(lambda self: self.hits.query_tokens, doc="Prompt tokens looked up.")
    first_hit_tokens = property(lambda self: self.hits.first_hit_tokens, doc="The same, first lookups only.")
    first_query_tokens = property(lambda self: self.hits.first_query_tokens, doc="(not re-adds after a preemption)")

    @property
    def pool(self) -> PoolShape:
        """The page pool, read-only: large pages, their bytes, each group's carving and caps."""
        a = self._alloc
        return PoolShape(a.num_large, a.large_page_bytes, tuple(a.small_per_large), tuple(a.page_bytes),
                         None if a.caps is None else tuple(a.caps))

    now = property(lambda self: self.clock.now, doc="The clock: one tick per ``allocate``.")
    num_allocated = property(lambda self: self.admission.admitted, doc="Live requests past their first ``allocate``.")

    def view(self, request_id: object) -> RequestView | None:
        """A read-only view of a live request (``None`` if it is not live)."""
        req = self.requests.get(request_id)
        return None if req is None else RequestView(req)

    # ----------------------------------------------------------------- API
    def _req(self, request_id: object) -> Request:
        req = self.requests.get(request_id)
        if req is None:
            self._unknown(request_id)
        return req

    @staticmethod
    def _unknown(request_id: object) -> None:
        raise UnknownRequestError(f"unknown request id {request_id!r} (never added, or already freed)")

    def add_request(self, request_id: object, prompt_token_ids: Sequence[int], *,
                    images: Sequence[tuple[int, int, str] | ImageRef] = (), cache_salt: str | None = None,
                    block_hashes: Sequence[bytes] | None = None, hash_block: int | None = None,
                    prompt_checkpoint: int | None = None) -> None:
        """Register a request.  Raises on a duplicate id, an empty or too long prompt, or
        a bad image; changes nothing then.

        ``block_hashes``: the caller's chained hashes of the request's blocks of ``hash_block``
        tokens (default: jenga's block), each naming the whole prefix up to its block's end
        (salt, adapter, images included): a live sequence that grows as tokens are appended
        (vLLM's ``request.block_hashes``).  The manager then keys its prefix index by those
        (every ``block // hash_block``-th one) and hashes nothing itself for this request;
        ``cache_salt`` and ``images`` must already be in them.

        ``prompt_checkpoint``: where state kinds checkpoint the prompt's end (a block multiple, at
        most the prompt's length; 0: nowhere), for a caller whose steps do not stop on the
        prompt's last full block, the default: vLLM's scheduler recomputing a preempted request
        with its output tokens stops elsewhere (``jenga.vllm.junction_stop.resumed_prompt_stop``)."""
        req = self.intake.new_request(request_id, prompt_token_ids, images, cache_salt, block_hashes, hash_block,
                                      self.requests, prompt_checkpoint)
        self.requests[request_id] = req

    def lookup(self, request_id: object, *, max_tokens: int | None = None) -> int:
        """Tokens of the prompt already cached for every group (never the last token,
        never more than ``max_tokens``).

        Holds those pages for the next ``allocate``; a second lookup first lets go of the
        first one's pages (``shrink_hit`` keeps part of it).  Raises once the request has
        been allocated.
        """
        req = self.requests.get(request_id)  # ``_req`` and ``_settle(req)`` inline: asked every step
        if req is None:                       # for a blocked queue head
            self._unknown(request_id)
        if req.tables is not None or req.num_scheduled:
            raise InvalidArgumentError(f"lookup of request {request_id!r} after its first allocate")
        deferred = self.ledger.deferred
        if deferred is not None and deferred is not req:
            self.ledger.settle()
        return self.prefix_lookup.find(req, max_tokens)

    def prefix_version(self) -> int:
        """A number that changes whenever the prefix index's tables do (so ``cached_tokens`` of a
        request whose tokens did not change may answer otherwise); read without holding a deferred hit."""
        return self._index.version

    def cached_tokens(self, request_id: object, *, max_tokens: int | None = None, in_flight: bool = False) -> int:
        """What ``lookup`` would answer now, read only: no page held, no hit recorded, nothing
        counted (a scheduler ordering its waiting queue by cached prefix).  0 once allocated.
        ``in_flight``: what it will answer once the steps allocated and not committed yet are
        (their state checkpoints join the index at the commit; ``Policy.writing_keys``), if
        nothing is evicted meanwhile.  Memoized per request until its tokens, ``max_tokens`` or the
        index change (``PrefixLookup.peek``): cheap to ask every step."""
        req = self.requests.get(request_id)  # ``_req`` inline: a waiting queue is probed every step
        if req is None:
            self._unknown(request_id)
        if not self.caching or req.tables is not None or req.num_scheduled:
            return 0
        return self.prefix_lookup.peek(req, max_tokens, in_flight)  # reads the index: a deferred hit stays deferred

    def allocate(self, request_id: object, num_new_tokens: int, *, num_lookahead: int = 0,
                 num_placeholders: int = 0) -> PageTables | None:
        """Pages for tokens ``[computed, computed + num_new_tokens + num_lookahead)``.

        ``num_placeholders``: how many of the last tokens up to ``computed +
        num_new_tokens`` have ids not known yet (async scheduling computes a token
        sampled by a step still running); they get pages like any token, and their pages
        join the prefix index once ``append_tokens`` has brought the ids.
        Returns the request's page tables, or ``None`` when memory (free + evictable)
        cannot hold them; ``None`` changes nothing.  Raises on an unknown request, a
        negative count, more unknown tokens than placeholders, or a length past the
        model's maximum.
        """
        req = self.requests.get(request_id)
        if req is None:
            self._unknown(request_id)
        if num_new_tokens < 0 or num_lookahead < 0 or num_placeholders < 0:
            raise InvalidArgumentError(f"request {request_id!r}: negative token count ({num_new_tokens}, "
                                       f"lookahead {num_lookahead}, placeholders {num_placeholders})")
        start = req.num_computed + req.num_scheduled
        end = start + num_new_tokens + num_lookahead
        clock = self.clock
        clock.now = now = clock.now + 1
        if end < req.limit and req.tables is not None and num_lookahead == req.num_lookahead:
            if start + num_new_tokens > len(req.tokens) + num_placeholders:
                self._too_far(req, start, num_new_tokens)
            req.num_scheduled += num_new_tokens
            req.last_access = now
            t = req.tables
            t.num_computed, t.num_new = req.num_computed, req.num_scheduled
            return t
        if start + num_new_tokens > len(req.tokens) + num_placeholders:
            self._too_far(req, start, num_new_tokens)
        if end > self.model.max_model_len:
            raise SequenceTooLongError(f"request {request_id!r}: {end} tokens exceed the model's max length "
                                       f"{self.model.max_model_len}")
        before = self._before_allocate
        self._settle(req if before is None else None)  # the request's own deferred hit: _allocate_slow
        if before is not None and not before(self, req, num_new_tokens, num_lookahead):
            return None
        return self._allocate_slow(req, num_new_tokens, num_lookahead, end)

    def _too_far(self, req: Request, start: int, n: int) -> None:
        raise InvalidArgumentError(f"request {req.request_id!r}: cannot compute tokens up to {start + n}; only "
                                   f"{len(req.tokens)} token ids are known (append sampled tokens first, "
                                   "or count the unknown ones as placeholders)")

    def _allocate_slow(self, req: Request, n: int, lookahead: int, end: int) -> PageTables | None:
        ledger, admission = self.ledger, self.admission
        if req.tables is None and self.host is not None and self.host.waits(req.request_id):
            return None  # its host hit's promotion was refused (jenga.core.tier.host_tier)
        old_lookahead, req.num_lookahead = req.num_lookahead, lookahead
        if req.tables is None:  # an admission: a sure refusal answers before planning (its hit deferred or held)
            if admission.hit_cannot_fit(req, end, admission.admitted):
                req.num_lookahead = old_lookahead
                return None
            ledger.settle()
        pairs = req.pairs or list(zip(self.policies, req.groups, strict=True))
        need, log = admission.plan(req, end, pairs)
        quota = admission.quota_of(req, need, end, admission.admitted)
        if quota is None:
            admission.unhold_plan(req, log)
            req.num_lookahead = old_lookahead
            return None
        shared = admission.prefer_shared(req)
        if self.caching:  # the step's full blocks of known tokens join the index at allocate
            self.hasher.hash_upto(req, min(end - lookahead, len(req.tokens)) // self.block)
        ledger.grant(Grant(req.request_id, quota, shared))
        try:
            for pol, gs in pairs:
                pol.grow(req, gs, end, ledger)
        finally:
            ledger.grant(None)
        events = self.index.events
        if events is not None:
            events.flush(req)  # pages registered at allocate
        if self.host is not None and not req.counted:
            self.host.count_hit(req.request_id, req.hit)
        self.hits.count(req)
        req.hit_holds = []
        req.num_scheduled += n
        req.last_access = ledger.now
        if req.tables is None:
            admission.admitted += 1
            req.tables = PageTables(req.request_id, 0, 0, 0, [gs.table for gs in req.groups])
            req.pairs = self._active(req)
        t = req.tables
        t.num_computed, t.num_new, t.num_lookahead = req.num_computed, req.num_scheduled, lookahead
        req.limit = min(pol.limit(req, gs, ledger) for pol, gs in req.pairs)
        return t

    def append_tokens(self, request_id: object, token_ids: Sequence[int], *, num_rejected: int = 0) -> None:
        """The allocated tokens were computed, except the last ``num_rejected`` (draft
        tokens the verifier rejected: their pages stay, the next allocate covers them
        again); ``token_ids`` were sampled after them (or are the ids of placeholders).

        Full pages become reusable; pages out of window or chunk are released.
        """
        req = self.requests.get(request_id)
        if req is None:
            self._unknown(request_id)
        if num_rejected and not 0 < num_rejected <= req.num_scheduled:
            raise InvalidArgumentError(f"request {request_id!r}: {num_rejected} rejected of "
                                       f"{req.num_scheduled} scheduled tokens")
        if type(token_ids) is not list or token_ids and (len(token_ids) != 1 or type(token_ids[0]) is not int
                                                         or not 0 <= token_ids[0] < TOKEN_ID_LIMIT):
            # checked, unless none (a prefill chunk's commit) or one sampled id (the decode step)
            token_ids = token_array(token_ids, f"request {request_id!r} append_tokens")
        if len(req.tokens) + len(token_ids) > self._max_tokens:
            raise SequenceTooLongError(f"request {request_id!r}: appending {len(token_ids)} tokens passes "
                                       f"the model's max length {self.model.max_model_len}")
        if self.ledger.deferred is not None:  # ``_settle()`` inline (every decode step)
            self.ledger.settle()
        self.step_commit.commit(req, token_ids, num_rejected)

    def _active(self, req: Request) -> list[tuple[Policy, GroupState]]:
        """(policy, state) pairs with work after the first allocate: image groups only with images."""
        if req.images:
            return list(zip(self.policies, req.groups, strict=True))
        return [(p, g) for p, g in zip(self.policies, req.groups, strict=True) if not p.per_image]

    def free(self, request_id: object) -> None:
        """Drop the request; its registered pages stay cached (evictable), the rest are free."""
        req = self._req(request_id)
        self._settle(req)
        self.step_commit.drop(req)
        if not self.prefix_lookup.unhold_hit(req):  # a hit not allocated yet: its holds undone, else the pages
            for pol, gs in zip(self.policies, req.groups, strict=True):
                pol.free(req, gs, self.ledger)
        del self.requests[request_id]
        if req.tables is not None:
            self.admission.admitted -= 1
        if self.caching and req.source_hashes is None:
            self.hasher.memo.remember(request_id, req.tokens, req.hashes, req.salt_root, req.images)
        self.hits.freed(req)
        if self.host is not None:
            self.host.forget(self.ledger, request_id, req.tables is None)

    # ------------------------------------------------- scheduler queries (jenga.core.manager.cache_control)
    def shrink_hit(self, request_id: object, num_tokens: int) -> int:
        """Keep at most ``num_tokens`` of the hit the last ``lookup`` found: the longest length
        ``<= num_tokens`` every group accepts (``lookup(request_id, max_tokens=num_tokens)``); pages
        past it are let go with the keys they had.  Returns the new hit; a larger ``num_tokens``
        keeps the hit.  Meant for before the first ``allocate`` (``lookup`` raises after it)."""
        if num_tokens < 0:
            raise InvalidArgumentError(f"request {request_id!r}: shrink_hit to {num_tokens} tokens")
        req = self._req(request_id)
        if num_tokens >= req.hit:
            return req.hit
        return self.lookup(request_id, max_tokens=num_tokens)

    def release_waiting_hits(self, keep: object = None) -> int:
        """Let go of the hits held by requests looked up but not yet allocated, but ``keep``'s
        (their next ``lookup`` finds what is still cached); returns how many were let go.  For a
        caller whose looked-up requests wait while others run: their holds keep the prefixes they
        will read, and where nothing else is allocated they could fill the pool for good."""
        waiting = [rid for rid in self.waiting_hits() if rid != keep]
        for rid in waiting:
            self.shrink_hit(rid, 0)
        return len(waiting)

    def waiting_hits(self, *, whole_prefix: bool = False, below: int | None = None) -> list:
        """The requests looked up but not yet allocated that hold a hit, the latest added first
        (a caller lets go of one with ``shrink_hit(request_id, 0)``).  ``whole_prefix``: only hits
        whose next token reads the whole prefix in every kind (``_reads_whole_prefix``): evicting
        their last pages then costs those pages' tokens only, not the hit down to an earlier window
        or state checkpoint.  ``below``: only hits of fewer tokens."""
        return [rid for rid, req in reversed(self.requests.items()) if req.tables is None and req.hit
                and (below is None or req.hit < below) and (not whole_prefix or self._reads_whole_prefix(req))]

    def _reads_whole_prefix(self, req: Request) -> bool:
        """Whether the token after ``req``'s hit reads every token before it in every kind the
        request uses (full attention, a window or chunk the hit has not passed; never a state
        kind, which resumes from one checkpoint), so a shorter hit is found on the same pages."""
        return all(pol.footprint.first_needed(req.hit) == 0 for pol in self.policies
                   if not (pol.per_image and not req.images))

    def move_junction_checkpoint(self, request_id: object, pos: int) -> None:
        """Put the state checkpoint of the junction the last ``lookup`` found at ``pos`` instead
        (0: none), for a caller whose steps end there rather than on the junction (``jenga.vllm.
        junction_stop``); ``pos`` a block multiple in ``[0, junction]``.  Meant for before the first
        ``allocate``; the next ``lookup`` puts it back on the junction."""
        req = self._req(request_id)
        if req.tables is not None or not 0 <= pos <= req.junction or pos % self.block:
            raise InvalidArgumentError(f"request {request_id!r}: junction checkpoint at {pos} (junction "
                                       f"{req.junction}, block {self.block}, allocated: {req.tables is not None})")
        req.junction_checkpoint = pos

    def can_allocate(self, request_id: object, num_new_tokens: int, *, num_lookahead: int = 0,
                     step: int | None = None, reserve: bool = False) -> bool:
        """Would ``allocate(request_id, num_new_tokens, num_lookahead=...)`` succeed now?  Exact and
        without any effect.  ``step``: would the request's allocates of at most ``step`` tokens
        each, up to that length, succeed with nothing else changing (a whole-sequence admission
        check: sliding and chunked groups count their window or chunk plus a step, not every
        page); ``reserve``: with the pages the allocated requests still need to reach their
        prompt's end counted as taken (``jenga.core.manager.cache_control.can_allocate``)."""
        req = self.requests.get(request_id)  # ``_req`` and ``_settle(req)`` inline: asked every step for
        if req is None:                       # a blocked queue head
            self._unknown(request_id)
        deferred = self.ledger.deferred  # the request's own deferred hit: a sure refusal answers without holding it
        if deferred is not None and deferred is not req:
            self.ledger.settle()
        return cache_control.can_allocate(self, req, num_new_tokens, num_lookahead, step, reserve)

    def chunk_tokens(self, request_id: object, num_new_tokens: int) -> int:
        """The largest ``n' <= num_new_tokens`` every group accepts as the end of the
        request's next step (from its first unallocated token); ``num_new_tokens`` itself
        when no group asks to end earlier.  Changes nothing in the manager."""
        return cache_control.chunk_tokens(self.policies, self._req(request_id), num_new_tokens, self.caching)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached page and empty the prefix index; False (nothing changed) while any
        request holds pages (``jenga.core.manager.cache_control.reset_prefix_cache``)."""
        def reset() -> bool:
            return cache_control.reset_prefix_cache(self.alloc, self.index)
        return reset() if self.host is None else self.host.reset_with(reset)

    def take_copy_plan(self) -> CopyPlan:
        """The device <-> host page copies recorded since the last call (:mod:`jenga.core.tier.copy_plan`):
        the engine runs every demote, then every promote, before the forward of the step whose
        allocations came before this call.  Empty without a host tier."""
        if self.host is None:
            return CopyPlan()
        return self.host.take_copy_plan()

    @property
    def host_num_large(self) -> int:
        """Large pages of the host tier (0 without one): ``KVLayout(model, host_num_large, device="cpu")``."""
        return 0 if self.host is None else self.host.num_large

    def enable_kv_events(self) -> None:
        """Record KV events from now on (see ``jenga.core.prefix.events``); ``take_events`` returns them
        (the host tier's under ``medium="CPU"``, in order with the device's)."""
        if self.index.events is None:
            self.index.events = EventLog()
            if self.host is not None:
                self.host.index.events = self.index.events.tier(HOST)

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call, oldest first ([] when not enabled)."""
        return cache_control.take_events(self.index, self.model, self.block)

    total_bytes = property(lambda self: self.pool.total_bytes, doc="Bytes of the large pages the budget holds.")

    used_bytes = property(lambda self: self._settled(self.accounting).used_bytes(),
                          doc="Bytes of pages live requests hold (their hits included); 0 once all are freed.")

    stranded_bytes = property(lambda self: self._settled(self._alloc).stranded_bytes(),
                              doc="Bytes of free slots stranded in carved large pages (``CacheStats.stranded_bytes``).")

    usage = property(lambda self: self.used_bytes / self.total_bytes,
                     doc="``used_bytes / total_bytes`` (vLLM's KV-cache usage: cached pages count as free).")

    # ----------------------------------------------------------- reporting
    def request_accounting(self, req: Request) -> tuple[int, int, int, int]:
        """(held, needed, stale, padding) bytes of one live request (see ``jenga.core.manager.stats``)."""
        self._settle()
        return self.accounting.request(req)

    def real_groups(self) -> list:
        """The groups whose needs ``needed_bytes`` measures: jenga's own, each stored in itself."""
        from jenga.core.manager.accounting import RealGroup

        return [RealGroup(pol, lambda req, gi=pol.gi: req.groups[gi], ((pol.gi, pol.group.num_layers),))
                for pol in self.policies]

    def needed_bytes(self) -> int:
        """Bytes the live requests' next step reads, a token several hold counted once."""
        return self.accounting.needed(self.requests.values(), self.real_groups())

    def sharing_accounting(self) -> tuple[int, int]:
        """(bytes counted twice by per-request sums, bytes of duplicate prefix copies)."""
        self._settle()
        return self.accounting.sharing(self.requests.values())

    def stats(self) -> CacheStats:
        self._settle()
        return collect_stats(self)

    def check_integrity(self) -> None:
        """Assert free + used + cached == total, refcounts match the tables, every cached
        page is indexed and keyed, and no page serves two owners."""
        self._settle()
        check_manager(self)
        if self.host is not None:
            self.host.check()

    @property
    def layout(self):
        """The torch buffer and per-layer views (built on first use, on ``device``)."""
        if self._layout is None:
            from jenga.core.layout import KVLayout
            self._layout = KVLayout(self.model, self.alloc.num_large, device=self.device)
        return self._layout
