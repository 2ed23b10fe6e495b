"""Per-request records the manager keeps (hot: slots dataclasses): the request, and one state
per group of the kind its policy makes."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import NamedTuple

from jenga.core.tables import GroupTable, PageTables


class ImageRef(NamedTuple):
    """An image inside a request: ``num_tokens`` tokens from ``offset`` (text position for
    in-sequence images; for cross-attention images, the position of the image token)."""

    offset: int
    num_tokens: int
    content_hash: str


@dataclass(slots=True)
class GroupState:
    """One request's pages in one group.  Each kind's policy makes its own subclass
    (``Policy.state_type``): only the fields that kind uses."""

    table: GroupTable | None = None  # what ``allocate`` returns for the group (made at the first one)

    def token_pages(self) -> list[int | None]:
        """Held pages by logical page: a token kind's; other kinds hold none by position ([])."""
        return []


@dataclass(slots=True)
class TokenState(GroupState):
    """Token kinds (full, sliding, chunked): pages[i] holds the group's logical page i."""

    pages: list[int | None] = field(default_factory=list)  # None = released / not held
    registered: int = 0  # pages [0, registered) were offered to the prefix index
    released: int = 0  # pages [0, released) are None

    def token_pages(self) -> list[int | None]:
        return self.pages


@dataclass(slots=True)
class ImageState(GroupState):
    """Image kinds: image index -> its pages; images waiting for pages in this allocate."""

    image_pages: dict[int, list[int]] = field(default_factory=dict)
    pending: dict[int, list[int] | None] = field(default_factory=dict)
    to_fill: set[int] = field(default_factory=set)
    initialized: bool = False


@dataclass(slots=True)
class CheckpointState(GroupState):
    """State kinds: the running state's work page, the page it is read from, checkpoints by position."""

    work: int | None = None
    read: int | None = None
    read_pos: int = 0
    checkpoints: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Request:
    request_id: object
    tokens: array  # the known token ids, a flat uint32 array (appends are amortised O(1))
    prompt_len: int
    images: tuple[ImageRef, ...]
    hashes: list[bytes]
    groups: list[GroupState]
    num_computed: int = 0
    num_scheduled: int = 0  # allocated, not yet committed by append_tokens
    num_lookahead: int = 0
    last_access: int = 0
    hit: int = 0  # tokens the last lookup found (held until allocate)
    looked_up: tuple | None = None  # (tokens, max_tokens, index version) the last lookup saw (jenga.core.manager.lookup)
    hit_holds: list[tuple] = field(default_factory=list)  # the hit's holds done: (group, page, key) or (group, pages, keys)
    deferred_holds: list | None = None  # the lookup's holds, recorded but not done yet (jenga.core.manager.ledger)
    deferred_cached_bytes: int | None = None  # bytes of cached pages among them (computed when first asked)
    limit: int = 0  # allocate may end below this without new pages (fast path)
    tables: PageTables | None = None
    counted: bool = False  # prefix hit statistics recorded
    misses: tuple = ()  # (reason, tokens) pairs of the last lookup (jenga.core.manager.miss_reasons)
    repeat: bool = False  # re-added after it was freed while running (a preemption)
    junction: int = 0  # where the prompt leaves the cached token prefix (lookup), if past the hit
    # where its junction checkpoint goes instead of the junction (0: none), when the caller's steps
    # cannot end there (KVCacheManager.move_junction_checkpoint); None: at the junction
    junction_checkpoint: int | None = None
    # where its prompt-end checkpoint goes (0: none), when the caller's steps do not stop on the
    # prompt's last full block (KVCacheManager.add_request); None: there
    prompt_checkpoint: int | None = None
    next_event: int = 0  # append_tokens commits groups once num_computed reaches this
    salt_root: bytes = b""
    pairs: list | None = None  # (policy, group state) pairs with work, set at the first allocate
    lender: tuple | None = None  # (tokens, hashes) of a prompt starting alike (jenga.core.prefix.index)
    # the caller's chained block hashes (a live sequence, one per ``hash_step`` caller blocks of
    # jenga's block taken), read instead of hashing (jenga.core.prefix.index); None: jenga hashes
    source_hashes: object = None
    hash_step: int = 1
    # the last read-only lookup's answer (``PrefixLookup.peek``), keyed by what it depends on:
    # ((token count, max_tokens, the prefix index's version), tokens cached)
    peeked: tuple | None = None
    # everything the last sure refusal of its admission read (``Admission.hit_cannot_fit``): the
    # same value again is the same refusal
    refusal: tuple | None = None

    @property
    def start(self) -> int:
        """First token position the next allocate covers."""
        return self.num_computed + self.num_scheduled


class RequestView:
    """A live request as the manager's callers may read it (``KVCacheManager.view``): its
    counters, its hit and junction, its page tables; read-only, and current as long as the
    request lives (it reads the manager's record)."""

    __slots__ = ("_req",)

    def __init__(self, req: Request):
        self._req = req

    @property
    def request_id(self) -> object:
        return self._req.request_id

    @property
    def num_tokens(self) -> int:
        """Token ids known (prompt and appended)."""
        return len(self._req.tokens)

    @property
    def prompt_len(self) -> int:
        return self._req.prompt_len

    @property
    def num_computed(self) -> int:
        return self._req.num_computed

    @property
    def num_scheduled(self) -> int:
        """Allocated, not yet committed by ``append_tokens``."""
        return self._req.num_scheduled

    @property
    def start(self) -> int:
        """First token position the next allocate covers."""
        req = self._req  # ``Request.start``, read in one call (asked several times per scheduler step)
        return req.num_computed + req.num_scheduled

    @property
    def hit(self) -> int:
        """Tokens the last lookup found cached."""
        return self._req.hit

    @property
    def junction(self) -> int:
        """Where the prompt leaves the cached token prefix (lookup), if past the hit; else 0."""
        return self._req.junction

    @property
    def tables(self) -> PageTables | None:
        """The page tables (``None`` before the first allocate); read, never mutate."""
        return self._req.tables

    def page_ids(self, group: int) -> list[int | None]:
        """A token group's held pages by logical page (before the first allocate: the hit's); []
        for other kinds."""
        return self._req.groups[group].token_pages()
