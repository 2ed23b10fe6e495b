"""KV events: which pages joined or left the prefix index, for routers and connectors.

The records mirror vLLM's ``vllm.distributed.kv_events`` (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``) field for field where the meaning is the same, so
an integration converts them one to one; jenga adds the group (each group has its own
pages and page size) and, on ``BlockStored``, the group's page kind (``CacheSpec.kind``:
``"full"``, ``"sliding"``, ``"mamba"`` ...).  ``medium`` is the tier: ``"GPU"`` for the device
(whatever the device is, as vLLM names its primary tier), ``"CPU"`` for the host tier
(:mod:`jenga.core.tier`): a demotion stores a page on the host, a host eviction removes it, a
promotion stores it on the device again (the host keeps its copy).  One ``BlockStored`` is one page: ``block_hashes`` holds its key,
``parent_block_hash`` the key of the page before it in the same group (``None`` for the
first page, an image page, or a state checkpoint's first interval), ``token_ids`` the
tokens the page covers (empty for image pages), ``block_size`` its tokens per page (a
state group: the checkpoint interval).

The keys are jenga's block hashes (BLAKE2b chained over token blocks, salt and images),
except for requests added with the caller's ``block_hashes`` (inside vLLM: vLLM's own, which
routers recompute); there is no ``lora_id``.  A host page's ``BlockStored`` names its key and
group only (no tokens, no parent, as vLLM's offloading connectors' placeholder events): the
device's ``BlockStored`` of the same key carried them when the page was computed.  A reset
(``reset_prefix_cache``) is one ``AllBlocksCleared`` for both tiers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the tiers' ``medium`` (vLLM's ``MEDIUM_GPU`` / ``MEDIUM_CPU``)
DEVICE, HOST = "GPU", "CPU"


@dataclass(frozen=True, slots=True)
class BlockStored:
    group: int
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    medium: str = DEVICE
    kind: str = ""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    group: int
    block_hashes: list[bytes]
    medium: str = DEVICE


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

    raw: list[list] = field(default_factory=list)  # [stored?, group, key, request or None, medium]
    pending: list[int] = field(default_factory=list)  # raw entries stored since the last flush

    def stored(self, group: int, key: bytes) -> None:
        self.pending.append(len(self.raw))
        self.raw.append([True, group, key, None, DEVICE])

    def removed(self, group: int, key: bytes) -> None:
        self.raw.append([False, group, key, None, DEVICE])

    def cleared(self) -> None:
        self.raw.append([False, -1, b"", None, DEVICE])

    def tier(self, medium: str) -> TierEvents:
        """What another tier's prefix index is told to record: its changes, into this log (in
        order with the device's), under ``medium``."""
        return TierEvents(self, medium)

    def flush(self, req) -> None:
        """The registrations recorded since the last call were ``req``'s."""
        raw = self.raw
        for i in self.pending:
            raw[i][3] = req
        self.pending.clear()

    def take(self, block_sizes: list[int], hash_block: int, kinds: list[str] | None = None) -> list[KVEvent]:
        """Every event since the last ``take``, oldest first (``kinds``: each group's page kind)."""
        self.pending.clear()
        out: list[KVEvent] = []
        positions: dict[int, dict[bytes, int]] = {}
        for stored, group, key, req, medium in self.raw:
            if not stored:
                out.append(AllBlocksCleared() if group < 0 else BlockRemoved(group, [key], medium))
                continue
            size, kind = block_sizes[group], "" if kinds is None else kinds[group]
            pos = None
            if req is not None:
                where = positions.get(id(req))
                if where is None:
                    where = positions[id(req)] = {h: j for j, h in enumerate(req.hashes)}
                pos = where.get(key)
            if pos is None:  # an image page (its key is the image's, not a token block's), or a host page
                out.append(BlockStored(group, [key], None, [], size, medium, kind))
                continue
            end = (pos + 1) * hash_block
            start = max(0, end - size)
            parent = req.hashes[start // hash_block - 1] if start >= hash_block else None
            out.append(BlockStored(group, [key], parent, list(req.tokens[start:end]), size, medium, kind))
        self.raw.clear()
        return out


@dataclass(slots=True)
class TierEvents:
    """Another tier's index changes (the host tier's), recorded into the device's :class:`EventLog`
    under ``medium``; its pages are never a request's (no tokens are looked up for them)."""

    log: EventLog
    medium: str

    def stored(self, group: int, key: bytes) -> None:
        self.log.raw.append([True, group, key, None, self.medium])

    def removed(self, group: int, key: bytes) -> None:
        self.log.raw.append([False, group, key, None, self.medium])
