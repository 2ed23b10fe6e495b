"""Per-kind cache policies: what a group allocates, frees and accepts as a prefix hit.

Each kind is one class (``POLICIES`` maps spec type to class); a new layer type is a
new class.  The paper's three hooks appear as:

* ``get_possible_prefix`` -> :meth:`Policy.longest_prefix` (the longest valid hit no
  longer than a candidate; the manager iterates over groups to a common fixed point);
* ``update_last_access`` -> which pages keep the request's time: pages a request still
  holds get its last access when it frees them; pages that leave the window or chunk
  earlier are released at that moment, so they are older and go first;
* ``set_prefix_length`` -> the token position of a page's end, the same in every group
  (aligned eviction); all pages of one image share one length (where the image ends), so whole
  images are evicted before another is touched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from jenga.core.policy.footprint import NEVER as NEVER  # re-exported: the policies use it
from jenga.core.policy.footprint import footprint_for
from jenga.core.policy.tier_rules import tier_rules_for
from jenga.core.request import GroupState, Request
from jenga.core.specs import LayerGroup


class PageOps(ABC):
    """What a policy may do to pages; implemented by the manager."""

    now: int
    caching: bool
    out_of_window_age: int = 0

    @abstractmethod
    def take(self, group: int) -> int:
        """A fresh USED page for the request being allocated (inside ``allocate`` only)."""

    def take_run(self, group: int, n: int) -> list[int]:
        """``n`` fresh pages (``take`` repeated)."""
        return [self.take(group) for _ in range(n)]

    def drop_run(self, group: int, pages: list[int | None], start: int, stop: int, last_access: int,
                 tokens_per_page: int) -> None:
        """``drop`` each held page of ``pages[start:stop]`` (page i ends at token
        ``(i+1) * tokens_per_page``) and set it to None."""
        for i in range(start, stop):
            if pages[i] is not None:
                self.drop(group, pages[i], last_access, (i + 1) * tokens_per_page)
                pages[i] = None

    def hold_run(self, group: int, pages: list[int]) -> None:
        """``hold`` each page of a run."""
        for page in pages:
            self.hold(group, page)

    @abstractmethod
    def hold(self, group: int, page: int) -> None:
        """Add a reference to a registered page (a hit); CACHED pages become USED."""

    @abstractmethod
    def drop(self, group: int, page: int, last_access: int, prefix_len: int) -> None:
        """Remove a reference; at zero a registered page becomes CACHED with this key,
        an unregistered one FREE."""

    @abstractmethod
    def retime_keys(self, group: int, keys: list[bytes], ends: list[int], last_access: int) -> None:
        """Give the pages registered under distinct ``keys`` (the ``i``-th ends at token ``ends[i]``)
        that are CACHED and unheld the release time ``last_access``, as if their holder had
        dropped them now; the others are left alone."""

    @abstractmethod
    def age_keys(self, group: int, keys: list[bytes], ends: list[int], stamp: int, max_uses: int | None = None) -> None:
        """Like ``retime_keys`` with the release time ``stamp``, but only for pages released
        later than ``stamp``: a page never becomes newer (pages that left the window keep
        their own, older time).  ``max_uses``: where use counts are kept, pages used (computed
        or hit) that many times or more are left alone too."""

    @abstractmethod
    def register(self, group: int, page: int, key: bytes) -> bool:
        """Offer a fully written page to the prefix index; False if the key is taken."""

    def register_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> None:
        """``register`` each (page, key) pair; ``None`` pages are skipped."""
        for page, key in zip(pages, keys, strict=True):
            if page is not None:
                self.register(group, page, key)

    @abstractmethod
    def find(self, group: int, key: bytes) -> int | None:
        """The registered page holding ``key``, if any."""

    @abstractmethod
    def index_table(self, group: int) -> dict[bytes, int]:
        """The group's ``key -> page`` index (read only; for scans over many pages)."""


#: Default age of pages released because they left the window / chunk: stamped this much
#: older than "now", they are evicted before any page a request still held when it finished.
OUT_OF_WINDOW_AGE = 1 << 40
#: Pages a request lets go while it still holds the prefix they complete (the window before a
#: branch point, released during decode) are released at ``UNTIL_FREE + now``: plain LRU and the
#: reuse order's one-off class read the time ``now``; its class of reused pages (newest first)
#: keeps them after all its other pages, since their prefix is still held; ``free`` gives them
#: the request's last access, as it does the prefix.
UNTIL_FREE = 1 << 59


def held_window_time(stamp: int) -> tuple[int, bool]:
    """A release stamp read back: (the time it stands for, whether it is ``UNTIL_FREE + now``)."""
    return (stamp - UNTIL_FREE, True) if stamp >= UNTIL_FREE else (stamp, False)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Policy(ABC):
    """The page lifecycle of one group: what a lookup may hit, what an allocate takes, what a
    commit registers and releases, what a free drops.  ``gi`` is the group index, ``block`` the
    hash block size.  The kind's other capabilities are parts it owns, chosen by spec type:
    ``footprint`` (:mod:`jenga.core.policy.footprint`: the window rule and page counts) and
    ``tier_rules`` (:mod:`jenga.core.policy.tier_rules`: what a host tier keeps and promotes).
    ``window_slack``: tokens below a prompt's end whose window a sliding kind keeps (``None``: its
    default; other kinds ignore it)."""

    #: a hit of this kind below the full-attention groups' cached prefix may leave those groups
    #: holding that prefix while the tokens between are recomputed (their engine writes no K/V
    #: below ``TokenTable.write_from``; :mod:`jenga.core.manager.junction`)
    recompute_under_shared = False
    #: a hit needs every page of the group below it (full attention): it bounds how far a lookup
    #: hashes (:mod:`jenga.core.prefix.index`) and where the junction lies
    bounds_hit = False
    #: what a lookup this kind's pages cut short missed (``jenga.core.manager.miss_reasons``)
    miss_reason = "window_evicted"
    #: the group resumes from less than the whole prefix (a window, a state checkpoint): it needs the
    #: junction, where the cached full-attention prefix ends (:mod:`jenga.core.manager.junction`)
    needs_junction = False
    #: the group holds pages per image, not per token (only requests with images use it)
    per_image = False
    #: pages that left the group's window stay held until the request's next allocate, not its
    #: commit (vLLM v1's ``remove_skipped_blocks``; the ``uniform`` baseline's sliding and chunked
    #: policies, which then answer ``skipped`` / ``freed_by_release`` / ``release_skipped``)
    releases_at_next_allocate = False
    #: a request's pages leave the group one by one as its window slides: spread over other requests'
    #: large pages they free none whole, so a request keeps to its own (``Admission.prefer_shared``)
    slides = False

    def __init__(self, gi: int, group: LayerGroup, block: int, window_slack: int | None = None):
        self.gi, self.group, self.block = gi, group, block
        self.tpp = group.tokens_per_page
        self.footprint = footprint_for(gi, group, block)
        self.tier_rules = tier_rules_for(group)

    #: the kind's per-request record (a ``GroupState`` subclass with only the fields it uses);
    #: ``state_type()`` is a request's empty record in this group (before any lookup or allocate)
    state_type: type[GroupState] = GroupState

    @abstractmethod
    def longest_prefix(self, req: Request, cand: int, ops: PageOps) -> int:
        """Largest valid hit length ``<= cand`` for this group (0 is always valid)."""

    def hit(self, req: Request, gs: GroupState, p: int, ops: PageOps) -> None:
        """Hold the cached pages a hit of ``p`` tokens reuses; record them in ``gs``."""

    def writing_keys(self):
        """Keys of pages live steps are writing that join the index only at their commit (a
        container answering ``in``): a scheduler asks what a lookup will find once the steps in
        flight commit (``KVCacheManager.cached_tokens(..., in_flight=True)``).  Default: none
        (token pages are registered at allocate: a request of the same step hits them already)."""
        return ()

    @abstractmethod
    def plan(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> int:
        """New pages needed so the request covers tokens ``[0, end)``.  May hold cached
        pages (recorded by the manager for rollback)."""

    def peak_plan(self, req: Request, gs: GroupState, end: int, step: int, ops: PageOps) -> int:
        """New pages ``req`` holds at most at once while it computes its tokens up to ``end`` in
        steps of at most ``step`` tokens (an admission that must hold a whole sequence, counted as
        the steps will really hold it); like ``plan``, it may hold cached pages.  Default: ``plan``
        (a state's work page and checkpoints, an image's pages are all held at once)."""
        return self.plan(req, gs, end, ops)

    def forget_plan(self, gs: GroupState) -> None:
        """A ``plan`` will not be followed by ``grow``: drop what it noted in ``gs`` (admission's rollback)."""

    @abstractmethod
    def grow(self, req: Request, gs: GroupState, end: int, ops: PageOps) -> None:
        """Take the pages ``plan`` counted."""

    @abstractmethod
    def limit(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        """Allocations ending strictly below this need no new page in this group."""

    def step_end(self, req: Request, stop: int) -> int:
        """Where a step from ``req.start`` the scheduler proposes to end at ``stop`` should
        end instead (``req.start < result <= stop``; asked through ``jenga.core.manager.cache_control``).
        Most kinds: ``stop``."""
        return stop

    @abstractmethod
    def commit(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """``req.num_computed`` advanced: register full pages, release what left range."""

    @abstractmethod
    def next_event(self, req: Request, gs: GroupState, ops: PageOps) -> int:
        """``commit`` has work once ``req.num_computed`` reaches this position."""

    def unfilled(self, req: Request, gs: GroupState, computed: int, ops: PageOps) -> list[int]:
        """Registered pages of this request whose fill was aborted (tokens from ``computed``
        on will not be written); the manager unregisters them, then calls ``rewind``."""
        return []

    def rewind(self, req: Request, gs: GroupState, computed: int) -> None:
        """Forget registrations past ``computed`` (after ``unfilled``'s pages left the index)."""

    @abstractmethod
    def free(self, req: Request, gs: GroupState, ops: PageOps) -> None:
        """Drop every page the request holds, keyed by its last access."""

    def check(self, requests) -> None:
        """``check_integrity``: recount what the policy tracks across live ``requests``."""
