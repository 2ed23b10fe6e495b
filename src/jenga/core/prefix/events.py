"""KV events: which pages joined or left the prefix index, for routers and connectors.

The records mirror vLLM's ``vllm.distributed.kv_events`` (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``) field for field where the meaning is the same, so
an integration converts them one to one; jenga adds the group (each group has its own
pages and page size).  One ``BlockStored`` is one page: ``block_hashes`` holds its key,
``parent_block_hash`` the key of the page before it in the same group (``None`` for the
first page, an image page, or a state checkpoint's first interval), ``token_ids`` the
tokens the page covers (empty for image pages), ``block_size`` its tokens per page (a
state group: the checkpoint interval).

The keys are jenga's block hashes (BLAKE2b chained over token blocks, salt and images),
except for requests added with the caller's ``block_hashes`` (inside vLLM: vLLM's own, which
routers recompute); there is no ``lora_id`` and ``medium`` is always ``"GPU"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BlockStored:
    group: int
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    group: int
    block_hashes: list[bytes]
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventLog:
    """Raw index changes in order, turned into events by :meth:`take`.

    The prefix index calls :meth:`stored` / :meth:`removed`; the manager calls
    :meth:`flush` after a commit with the request whose pages were stored, so token ids
    are looked up only when the events are taken.
    """

    raw: list[list] = field(default_factory=list)  # [stored?, group, key, request or None]
    pending: list[int] = field(default_factory=list)  # raw entries stored since the last flush

    def stored(self, group: int, key: bytes) -> None:
        self.pending.append(len(self.raw))
        self.raw.append([True, group, key, None])

    def removed(self, group: int, key: bytes) -> None:
        self.raw.append([False, group, key, None])

    def cleared(self) -> None:
        self.raw.append([False, -1, b"", None])

    def flush(self, req) -> None:
        """The registrations recorded since the last call were ``req``'s."""
        raw = self.raw
        for i in self.pending:
            raw[i][3] = req
        self.pending.clear()

    def take(self, block_sizes: list[int], hash_block: int) -> list[KVEvent]:
        """Every event since the last ``take``, oldest first."""
        self.pending.clear()
        out: list[KVEvent] = []
        positions: dict[int, dict[bytes, int]] = {}
        for stored, group, key, req in self.raw:
            if not stored:
                out.append(AllBlocksCleared() if group < 0 else BlockRemoved(group, [key]))
                continue
            size = block_sizes[group]
            pos = None
            if req is not None:
                where = positions.get(id(req))
                if where is None:
                    where = positions[id(req)] = {h: j for j, h in enumerate(req.hashes)}
                pos = where.get(key)
            if pos is None:  # an image page (its key is the image's, not a token block's)
                out.append(BlockStored(group, [key], None, [], size))
                continue
            end = (pos + 1) * hash_block
            start = max(0, end - size)
            parent = req.hashes[start // hash_block - 1] if start >= hash_block else None
            out.append(BlockStored(group, [key], parent, list(req.tokens[start:end]), size))
        self.raw.clear()
        return out
