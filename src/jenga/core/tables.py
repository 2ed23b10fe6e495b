"""Typed page tables returned by ``KVCacheManager.allocate``.

Lifetime: a ``PageTables`` and the lists inside are the manager's live records of that
request (returning them costs nothing on the decode fast path).  Read them, never mutate
them.  Calls for *other* requests never change them (hits, evictions and frees elsewhere
leave them as they were: ``tests/test_engine_robustness.py``); the same request's next
``allocate`` / ``append_tokens`` updates the same object in place (counters, new pages,
pages released out of the window), and ``free`` ends its meaning.  Copy
(``copy.deepcopy``) what must outlive the request's next call.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenTable:
    """A token kind (full, sliding, chunked): ``page_ids[i]`` holds tokens
    ``[i*tokens_per_page, (i+1)*tokens_per_page)``; ``None`` = not held, never read.

    ``write_from``: the engine writes no K/V of a position below it.  It is the request's hit
    except where a state group's hit lies below this group's cached prefix
    (:mod:`jenga.core.manager.junction`): the tokens between are computed (for the state layers;
    their queries read the cached K/V here) while these cached pages are shared, never written."""

    group: int
    tokens_per_page: int
    page_ids: list[int | None]
    write_from: int = 0


@dataclass(slots=True)
class ImageTable:
    """Per-image pages (cross-attention KV or vision embeddings).

    ``pages[j]`` are the pages of the request's image ``j`` (each image starts on a new
    page); ``to_fill`` lists the images whose pages are fresh this step, so the engine
    must run the encoder for them.  Images not in ``pages`` are not held.
    """

    group: int
    tokens_per_page: int
    pages: dict[int, list[int]]
    to_fill: set[int] = field(default_factory=set)


@dataclass(slots=True)
class StateTable:
    """A state kind (Mamba): the running state and checkpoint slots.

    ``read_page``: a cached checkpoint to copy into ``work_page`` before this step
    (prefix hit), else ``None``.  ``checkpoints[t]``: the page into which the state after
    the first ``t`` tokens must be copied while the step runs.
    """

    group: int
    work_page: int
    read_page: int | None
    checkpoints: dict[int, int]


GroupTable = TokenTable | ImageTable | StateTable


@dataclass(slots=True)
class PageTables:
    """What one request may read and write in the step ``allocate`` was called for.

    Tokens ``[num_computed, num_computed + num_new)`` are computed in this step (their
    K/V written); pages also cover ``num_lookahead`` further tokens.
    """

    request_id: object
    num_computed: int
    num_new: int
    num_lookahead: int
    groups: list[GroupTable]
