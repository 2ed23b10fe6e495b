"""``KVCacheManager``: the one API an engine calls.

A request's way through it: ``add_request`` (validate and keep the prompt; its block hashes are
made lazily, :mod:`jenga.prompt_hashes`) -> ``lookup`` (each group's policy proposes the longest
valid hit; the manager iterates to the longest length every group accepts) -> ``allocate`` (count
the pages each group needs, check them against free + evictable memory *before* touching anything,
then take pages in the request-aware order; attention pages of full blocks of known tokens join
the prefix index at once, so a request admitted later in the same step shares them) -> the engine
runs the step -> ``append_tokens`` (the remaining full pages join the index; pages that left the
window or chunk go to the evictor) -> ``free``.  A step dropped before its commit unregisters
what it would have filled (:mod:`jenga.aborted_fill`).
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga.aborted_fill import FillAbort
from jenga.accounting import ByteAccounting
from jenga.allocation_quota import AllocationQuota
from jenga.allocator import LargePageAllocator
from jenga.cache_control import CacheControl
from jenga.chunk_split import ChunkSplit
from jenga.deferred_hold import DeferredHold
from jenga.errors import (
    DuplicateRequestError,
    InsufficientMemoryError,
    InvalidArgumentError,
    SequenceTooLongError,
    UnknownRequestError,
)
from jenga.flat_arrays import zeros
from jenga.integrity import check_manager
from jenga.ledger import PageLedger
from jenga.pagesize import manager_page_plan, with_base_page
from jenga.prefix.evictor import PrefixEvictor
from jenga.prefix.hash_memo import HashMemo
from jenga.prefix.hashing import ImageRef, root_hash
from jenga.prefix.index import PrefixIndex
from jenga.prefix.policies import (
    OUT_OF_RANGE_AGE,
    ImagePolicy,
    Policy,
    SlidingPolicy,
    policy_for,
)
from jenga.prefix.reuse_evictor import ReuseEvictor
from jenga.prompt_hashes import PromptHashes
from jenga.released_keys import ReleasedKeys
from jenga.request import GroupState, Request
from jenga.shared_recompute import SharedRecompute
from jenga.specs import LayerGroup, ModelSpec
from jenga.stats import CacheStats, collect_stats
from jenga.tables import PageTables
from jenga.units import parse_bytes
from jenga.validation import TOKEN_ID_LIMIT, checked_images, checked_int, checked_salt, token_array

NEVER = 1 << 62
#: eviction orders: plain LRU by (release time, -prefix length), or use-count classes
EVICTORS = {"lru": PrefixEvictor, "reuse": ReuseEvictor}
REPEAT_MEMO_SIZE = 256  # freed ids remembered as having run (a re-add is a repeat lookup)


class KVCacheManager(DeferredHold, PromptHashes, AllocationQuota, PageLedger, CacheControl, ByteAccounting,
                     FillAbort, ChunkSplit, SharedRecompute):
    """Jenga's KV-cache manager for one (possibly composite) model.

    ``memory_bytes`` is the KV budget; it is cut into ``floor(memory / S) - 1`` large pages of
    ``S = lcm(small pages)`` bytes.  ``tokens_per_page`` is the base page (and hash block) size; groups may use
    multiples of it to keep the LCM bounded (``max_lcm_ratio`` x the largest small page).  Sliding groups
    release the window before a branch point (hit, junction, prompt end plus ``window_slack`` tokens below it,
    default ``W // 2``) valued like its prefix, so a prompt ending a little earlier still hits.  Pages that
    leave the window or chunk are stamped ``out_of_window_age`` clock ticks older, so they are evicted first
    (0: their release time, the paper's text).  ``eviction``: ``"reuse"`` (jenga's default; pages reused at
    least twice outlive one-off pages and a stable subset of them survives a cyclic working set larger than
    the pool, see :mod:`jenga.prefix.reuse_evictor`) or ``"lru"`` (the paper's order; the baselines'
    default).  ``device`` is only used by :attr:`layout`.
    """

    name = "jenga"
    #: pages per token group and running request an admission leaves evictable beside the
    #: protected ones (see ``_quota_of``)
    admission_margin = 1
    #: share of the pool beyond which protected pages no longer hold admissions back
    protected_share = 0.5
    default_eviction = "reuse"

    def __init__(self, model: ModelSpec, memory_bytes: int | str, *, tokens_per_page: int = 16,
                 enable_prefix_caching: bool = True, device: str = "cpu", max_lcm_ratio: float = 8.0,
                 fit_pages: bool = True, window_slack: int | None = None, out_of_window_age: int = OUT_OF_RANGE_AGE,
                 eviction: str | None = None):
        tokens_per_page = checked_int(tokens_per_page, "tokens_per_page")
        memory_bytes = parse_bytes(memory_bytes)  # an int, or "64GiB" like the CLI
        if window_slack is not None:
            window_slack = checked_int(window_slack, "window_slack", minimum=0)
        eviction = eviction or self.default_eviction
        if eviction not in EVICTORS:
            raise InvalidArgumentError(f"unknown eviction policy {eviction!r}; choose one of {sorted(EVICTORS)}")
        self.window_slack = window_slack
        self.out_of_range_age = out_of_window_age
        self.source_model = model
        self.page_plan = None
        model = self._prepare_model(model, tokens_per_page, max_lcm_ratio if fit_pages else None)
        self.model = model
        self.block = tokens_per_page
        self.caching = enable_prefix_caching
        self.device = device
        self.large_page_bytes = model.lcm_page_bytes
        num_large = memory_bytes // self.large_page_bytes - 1
        if num_large < 1:
            raise InsufficientMemoryError(
                f"{memory_bytes} bytes hold no large page of {self.large_page_bytes} bytes plus one slack "
                f"page; give at least {2 * self.large_page_bytes} bytes")
        self.memory_bytes = memory_bytes
        self.alloc = LargePageAllocator([g.page_bytes for g in model.groups], num_large)
        self.index = PrefixIndex(len(model.groups))
        self.evictor = EVICTORS[eviction](self.alloc, self.index)
        self.policies: list[Policy] = [self._policy(i, g) for i, g in enumerate(model.groups)]
        for pol in self.policies:
            if isinstance(pol, SlidingPolicy):
                w = pol.group.spec.window
                pol.slack = w // 2 if window_slack is None else window_slack
        self.ref = [zeros(num_large * k) for k in self.alloc.k]  # per group and page: references
        self._released = ReleasedKeys([num_large * k for k in self.alloc.k])  # keys for undone pins
        self.requests: dict[object, Request] = {}
        self._allocated = 0  # live requests past their first allocate
        self._max_tokens = model.max_model_len + 1
        self._hash_memo = HashMemo()  # freed requests' block hashes, for a re-add
        self._ran: dict[object, bool] = {}  # freed request ids that had run (their re-add is a repeat)
        self._state_group = [not g.spec.per_token for g in model.groups]
        # images are text spans (must lie inside the prompt) when some group embeds them in-sequence
        self._in_sequence_images = any(g.kind == "vision" for g in self.source_model.groups)
        self._init_junction()  # the junction's policies; who shares past a state hit (jenga.shared_recompute)
        self._full_bound = self._bound_policy()  # bounds how far a lookup hashes (jenga.prompt_hashes)
        self._shared = list(self._state_group)  # per allocate: fill shared large pages first
        self.now = 0
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0
        self.first_hit_tokens = 0  # the same, first lookups only (not re-adds after a preemption)
        self.first_query_tokens = 0
        self._tag: object = None
        self._quota: list[int] = []
        self._log: list[tuple[int, int, tuple[int, int] | None]] | None = None
        self._layout = None

    def _prepare_model(self, model: ModelSpec, tokens_per_page: int, max_ratio: float | None) -> ModelSpec:
        """The groups this manager really allocates (baselines transform the model here)."""
        model = with_base_page(model, tokens_per_page)
        if max_ratio is None:
            return model
        self.page_plan = manager_page_plan(model, max_ratio)
        return self.page_plan.model

    def _policy(self, gi: int, group: LayerGroup) -> Policy:
        """The cache policy of a group (baselines swap in their own rules here)."""
        return policy_for(gi, group, self.block)

    # ----------------------------------------------------------------- API
    def _req(self, request_id: object) -> Request:
        req = self.requests.get(request_id)
        if req is None:
            raise UnknownRequestError(f"unknown request id {request_id!r} (never added, or already freed)")
        return req

    def add_request(self, request_id: object, prompt_token_ids: Sequence[int], *,
                    images: Sequence[tuple[int, int, str] | ImageRef] = (), cache_salt: str | None = None,
                    block_hashes: Sequence[bytes] | None = None, hash_block: int | None = None) -> None:
        """Register a request.  Raises on a duplicate id, an empty or too long prompt, or
        a bad image; changes nothing then.

        ``block_hashes``: the caller's chained hashes of the request's blocks of ``hash_block``
        tokens (default: jenga's block), each naming the whole prefix up to its block's end
        (salt, adapter, images included): a live sequence that grows as tokens are appended
        (vLLM's ``request.block_hashes``).  The manager then keys its prefix index by those
        (every ``block // hash_block``-th one) and hashes nothing itself for this request;
        ``cache_salt`` and ``images`` must already be in them."""
        step = 1
        if block_hashes is not None:
            hb = checked_int(hash_block if hash_block is not None else self.block, "hash_block")
            if self.block % hb:
                raise InvalidArgumentError(f"request {request_id!r}: hash_block {hb} does not divide the manager's "
                                           f"block of {self.block} tokens")
            step = self.block // hb
        try:
            live = request_id in self.requests
        except TypeError:
            raise InvalidArgumentError(f"request id {request_id!r} is not hashable") from None
        if live:
            raise DuplicateRequestError(f"request id {request_id!r} is already live")
        tokens = token_array(prompt_token_ids, f"request {request_id!r} prompt")  # a copy: flat uint32
        if not tokens:
            raise InvalidArgumentError(f"request {request_id!r}: empty prompt")
        if len(tokens) > self.model.max_model_len:
            raise SequenceTooLongError(f"request {request_id!r}: prompt of {len(tokens)} tokens exceeds the "
                                       f"model's max length {self.model.max_model_len}")
        refs = [ImageRef(*img) for img in checked_images(images, len(tokens), self._in_sequence_images,
                                                         f"request {request_id!r}")]
        hashes: list[bytes] = []
        root = root_hash(checked_salt(cache_salt)) if self.caching else b""
        repeat = self._ran.pop(request_id, False)
        if self.caching and block_hashes is None:
            hashes = self._hash_memo.recall(request_id, tokens, root, self.block, tuple(refs))  # the rest: lazily
        req = Request(request_id, tokens, len(tokens), tuple(refs), hashes,
                      [GroupState() for _ in self.model.groups])
        req.salt_root, req.repeat = root, repeat
        req.source_hashes, req.hash_step = block_hashes, step
        self.requests[request_id] = req

    def lookup(self, request_id: object, *, max_tokens: int | None = None) -> int:
        """Tokens of the prompt already cached for every group (never the last token,
        never more than ``max_tokens``).

        Holds those pages for the next ``allocate``; a second lookup first lets go of the
        first one's pages (``shrink_hit`` keeps part of it).  Raises once the request has
        been allocated.
        """
        req = self._req(request_id)
        if req.tables is not None or req.num_scheduled:
            raise InvalidArgumentError(f"lookup of request {request_id!r} after its first allocate")
        self._release_hit(req)
        if not self.caching:
            return 0
        top = min(len(req.tokens) - 1, len(req.tokens) // self.block * self.block)
        if max_tokens is not None:
            top = max(0, min(top, max_tokens))
        top = self._hash_for_lookup(req, top)
        cand = self._fixed_point(req, top, self.policies, self._full_bound)
        self._find_junction(req, top, cand)
        req.hit = req.num_computed = cand
        self._record_hit(req)  # held once anything else happens (jenga.deferred_hold)
        return cand

    def _fixed_point(self, req: Request, cand: int, policies: list[Policy], bound: Policy | None = None) -> int:
        """The longest prefix no longer than ``cand`` that every one of ``policies`` accepts;
        ``bound``: a FullPolicy with all its pages below ``cand`` cached (``_hash_for_lookup``)."""
        while True:
            start = cand
            for pol in policies:
                cand = cand // pol.tpp * pol.tpp if pol is bound else pol.longest_prefix(req, cand, self)
            if cand == start:
                return cand

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
            raise UnknownRequestError(f"unknown request id {request_id!r} (never added, or already freed)")
        if num_new_tokens < 0 or num_lookahead < 0 or num_placeholders < 0:
            raise InvalidArgumentError(f"request {request_id!r}: negative token count ({num_new_tokens}, "
                                       f"lookahead {num_lookahead}, placeholders {num_placeholders})")
        start = req.num_computed + req.num_scheduled
        end = start + num_new_tokens + num_lookahead
        self.now += 1
        if end < req.limit and req.tables is not None and num_lookahead == req.num_lookahead:
            if start + num_new_tokens > len(req.tokens) + num_placeholders:
                self._too_far(req, start, num_new_tokens)
            req.num_scheduled += num_new_tokens
            req.last_access = self.now
            t = req.tables
            t.num_computed, t.num_new = req.num_computed, req.num_scheduled
            return t
        if start + num_new_tokens > len(req.tokens) + num_placeholders:
            self._too_far(req, start, num_new_tokens)
        if end > self.model.max_model_len:
            raise SequenceTooLongError(f"request {request_id!r}: {end} tokens exceed the model's max length "
                                       f"{self.model.max_model_len}")
        return self._allocate_slow(req, num_new_tokens, num_lookahead, end)

    def _too_far(self, req: Request, start: int, n: int) -> None:
        raise InvalidArgumentError(f"request {req.request_id!r}: cannot compute tokens up to {start + n}; only "
                                   f"{len(req.tokens)} token ids are known (append sampled tokens first, "
                                   "or count the unknown ones as placeholders)")

    def _allocate_slow(self, req: Request, n: int, lookahead: int, end: int) -> PageTables | None:
        old_lookahead, req.num_lookahead = req.num_lookahead, lookahead
        if self._pending is req and self._hit_cannot_fit(req, end):
            req.num_lookahead = old_lookahead
            return None
        need, log = self._plan(req, end)
        quota = self._quota_of(req, need, end)
        if quota is None:
            self._rollback(req, log)
            req.num_lookahead = old_lookahead
            return None
        self._tag, self._quota = req.request_id, quota
        self._shared = self._prefer_shared(req)
        if self.caching:  # the step's full blocks of known tokens join the index at allocate
            self._hash_upto(req, min(end - lookahead, len(req.tokens)) // self.block)
        for pol, gs in req.pairs or zip(self.policies, req.groups, strict=True):
            pol.grow(req, gs, end, self)
        self._tag = None
        if self.index.events is not None:
            self.index.events.flush(req)  # pages registered at allocate
        if not req.counted:
            req.counted = True
            self.prefix_query_tokens += req.prompt_len
            self.prefix_hit_tokens += req.hit
            if not req.repeat:
                self.first_query_tokens += req.prompt_len
                self.first_hit_tokens += req.hit
        req.pins = []
        req.num_scheduled += n
        req.last_access = self.now
        if req.tables is None:
            self._allocated += 1
            req.tables = PageTables(req.request_id, 0, 0, 0, [gs.table for gs in req.groups])
            req.pairs = self._active(req)
        t = req.tables
        t.num_computed, t.num_new, t.num_lookahead = req.num_computed, req.num_scheduled, lookahead
        req.limit = min(pol.limit(req, gs, self) for pol, gs in req.pairs)
        return t

    def append_tokens(self, request_id: object, token_ids: Sequence[int], *, num_rejected: int = 0) -> None:
        """The allocated tokens were computed, except the last ``num_rejected`` (draft
        tokens the verifier rejected: their pages stay, the next allocate covers them
        again); ``token_ids`` were sampled after them (or are the ids of placeholders).

        Full pages become reusable; pages out of window or chunk are released.
        """
        req = self.requests.get(request_id)
        if req is None:
            raise UnknownRequestError(f"unknown request id {request_id!r} (never added, or already freed)")
        if num_rejected and not 0 < num_rejected <= req.num_scheduled:
            raise InvalidArgumentError(f"request {request_id!r}: {num_rejected} rejected of "
                                       f"{req.num_scheduled} scheduled tokens")
        tokens = req.tokens
        if type(token_ids) is not list or len(token_ids) != 1 or type(token_ids[0]) is not int \
                or not 0 <= token_ids[0] < TOKEN_ID_LIMIT:  # one sampled id: the decode step
            token_ids = token_array(token_ids, f"request {request_id!r} append_tokens")
        if len(tokens) + len(token_ids) > self._max_tokens:
            raise SequenceTooLongError(f"request {request_id!r}: appending {len(token_ids)} tokens passes "
                                       f"the model's max length {self.model.max_model_len}")
        aborted = self._aborted_fill(req, req.num_computed + req.num_scheduled - num_rejected) if num_rejected else None
        tokens.extend(token_ids)
        if aborted:
            self._abort_fill(req, aborted, req.num_computed + req.num_scheduled - num_rejected)
        computed = req.num_computed = req.num_computed + req.num_scheduled - num_rejected
        req.num_scheduled = 0
        if self.caching and computed >= (len(req.hashes) + 1) * self.block:
            self._hash_upto(req, computed // self.block)  # the computed blocks join the index now
        if computed >= req.next_event:
            next_event = NEVER
            for pol, gs in req.pairs or zip(self.policies, req.groups, strict=True):
                pol.commit(req, gs, self)
                next_event = min(next_event, pol.next_event(req, gs, self))
            req.next_event = next_event
            if self.index.events is not None:
                self.index.events.flush(req)
        t = req.tables
        if t is not None:
            t.num_computed, t.num_new = computed, 0

    def _active(self, req: Request) -> list[tuple[Policy, GroupState]]:
        """(policy, state) pairs with work after the first allocate: image groups only with images."""
        if req.images:
            return list(zip(self.policies, req.groups, strict=True))
        return [(p, g) for p, g in zip(self.policies, req.groups, strict=True) if not isinstance(p, ImagePolicy)]

    def free(self, request_id: object) -> None:
        """Drop the request; its registered pages stay cached (evictable), the rest are free."""
        req = self._req(request_id)
        aborted = self._aborted_fill(req, req.num_computed) if req.num_scheduled else None
        if aborted:
            self._abort_fill(req, aborted, req.num_computed)
        if self._pending is req:
            self._forget_pending(req)
        elif req.pins:
            self._undo_holds(req.pins)
            req.pins = []
        else:
            for pol, gs in zip(self.policies, req.groups, strict=True):
                pol.free(req, gs, self)
        del self.requests[request_id]
        if req.tables is not None:
            self._allocated -= 1
        if self.caching and req.source_hashes is None:
            self._hash_memo.remember(request_id, req.tokens, req.hashes, req.salt_root, req.images)
        if req.counted or req.repeat:
            ran = self._ran
            ran[request_id] = True
            if len(ran) > REPEAT_MEMO_SIZE:
                del ran[next(iter(ran))]  # the oldest

    # ----------------------------------------------------------- reporting
    def stats(self) -> CacheStats:
        return collect_stats(self)

    def check_integrity(self) -> None:
        """Assert free + used + cached == total, refcounts match the tables, every cached
        page is indexed and keyed, and no page serves two owners."""
        check_manager(self)

    @property
    def layout(self):
        """The torch buffer and per-layer views (built on first use, on ``device``)."""
        if self._layout is None:
            from jenga.layout import KVLayout
            self._layout = KVLayout(self.model, self.alloc.num_large, device=self.device)
        return self._layout
