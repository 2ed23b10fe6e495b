"""The prefix index: the block hashes that name a prompt's prefixes, and which cached page holds
which block hash, per group (``PrefixIndex``).

*Block hashes.*  Chained, collision-resistant, over token ids.

``h_i = blake2b(h_{i-1} || tokens_i as little-endian uint32 || images of block i)[:16]``, each
image overlapping block i framed as ``(offset - block start, num_tokens, len(hash))`` int64s then
the hash's bytes, so an image at another offset or of another length never hits, and
``"ab","c"`` never equals ``"a","bc"`` (the token part has a fixed length, the frames follow it).
The root ``h_{-1}`` folds in the cache salt (``None`` and ``""`` are distinct tenants), and so does
every image page's key, so tenants with different salts never share a page, text or image.  So
``h_i`` names (salt, exact token prefix ``[0, (i+1) * block)``, images), and equal keys mean an
identical prefix unless BLAKE2b collides.  Security note: both hashes are cryptographic (BLAKE2b
for the chain, blake3 for roots and image keys): a crafted prompt cannot collide with another
tenant's prefix (vLLM moved from Python's ``hash`` to sha256 after such an advisory); never
replace them by Python's ``hash`` or a polynomial hash.  Cost: a block is one BLAKE2b
compression (16 + 64 bytes for 16-token blocks); the per-block Python work is a copy of a blank
state, two updates and a digest, the blocks split by one numpy call (hashlib's BLAKE2b has less call
overhead than blake3's binding on ~100-byte inputs: ~0.5 vs ~1.4 us a block).

*Which hashes exist, and when* (``PromptHasher``): only those a lookup can reach.  A chain of
a 128k-token prompt costs thousands of calls, so ``add_request`` only takes what the hash memo
remembers of the same request (a re-add after a preemption); ``lookup`` hashes block by block (in
doubling chunks) only up to the first page a full-attention group has not cached (no hit can pass
a page every full-attention hit needs); the rest are hashed as the tokens are computed
(``allocate`` and ``append_tokens``), which is when their pages join the prefix index.  The hashes
are the same as hashing the whole prompt at once; fewer of them exist earlier.  A request added
with the caller's ``block_hashes`` (vLLM's) reads them from that sequence instead, as far as it has
them.  ``PromptHasher`` owns the hash memo (``HashMemo``: a freed request's hashes for its re-add, a
recent prompt's lent to a new one that starts with the same tokens; kept as ``HashChain``s, which
the garbage collector does not walk) and knows the bounding full-attention policy; the manager
hands it the request.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from hashlib import blake2b
from itertools import compress, repeat
from typing import Protocol

import numpy as np
from blake3 import blake3

from jenga.core.flat_arrays import BULK, as_ids, int64s, view, zeros
from jenga.core.request import ImageRef, Request


class PageKeys(Mapping):
    """A group's ``page -> key`` for its registered pages, read-only, in page order, over the
    index's flat arrays (a key per page in an object array, a registered flag per page)."""

    def __init__(self, keys: np.ndarray, flags: bytearray):
        self._keys, self._flags = keys, flags

    def __contains__(self, page: object) -> bool:
        return type(page) is int and 0 <= page < len(self._flags) and self._flags[page] == 1

    def __getitem__(self, page: int) -> bytes:
        if page not in self:
            raise KeyError(page)
        return self._keys[page]

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(view(self._flags)).tolist())

    def __len__(self) -> int:
        return self._flags.count(1)


class PrefixIndex:
    """``(group, key) -> page`` and back.  A page is *registered* while it is in the index.

    Registered pages may be USED (live requests share them) or CACHED (evictable).  One key,
    one page: a page computed again under a key that another page holds is refused, except
    when the holder is only CACHED (``held`` given to ``register_many``, read by the caller
    for ``register``).  Then the live page takes the key over: the caller evicts the cached
    duplicate first (its key leaves, a removed event, its use count kept in ``uses``) and
    registers the live page (a stored event, the count one more).  Else a request that
    recomputed a prefix whose cached copy was evicted later would hold pages the index no
    longer finds (a group's hit can be 0 while another group still caches the prefix).
    """

    def __init__(self, num_groups: int):
        self.table: list[dict[bytes, int]] = [{} for _ in range(num_groups)]
        # one more at every call that may change a table (register, drop and their batch forms):
        # a reader that saw the same version reads the same tables (a scheduler's repeated probe)
        self.version = 0
        self.events = None  # a ``jenga.core.prefix.events.EventLog`` told of every change, when enabled
        # Use counts (times a key's content was computed or hit), None = not tracked: a
        # registered key's in ``page_uses`` (per group and page; 0 = not counted, and 0 on
        # every unregistered page), a key no longer registered in ``uses`` (per group: key ->
        # count, kept after eviction; at most ``USES_KEPT`` keys, the longest gone first out).
        # So registering a fresh page costs no dict insert; its key enters ``uses`` when it leaves.
        self.uses: list[dict[bytes, int]] | None = None
        self.page_uses: list | None = None
        # per group and page: 1 while registered; and its key (an object array, None while not)
        self.flags: list[bytearray] = []
        self.keys: list[np.ndarray] = []
        self.key_of: list[PageKeys] = []  # per group: ``page -> key`` of registered pages (read-only)

    USES_KEPT = 1 << 20

    def track_uses(self, num_pages: list[int]) -> None:
        """Count uses from now on (``num_pages``: each group's page count)."""
        if self.uses is None:
            self.uses = [{} for _ in self.table]
            self.page_uses = [zeros(n) for n in num_pages]

    def track_pages(self, num_pages: list[int]) -> None:
        """Size the per-page arrays (``num_pages``: each group's page count; before any register)."""
        assert not len(self), "track_pages on a non-empty index"
        self.flags = [bytearray(n) for n in num_pages]
        self.keys = [np.full(n, None, dtype=object) for n in num_pages]
        self.key_of = [PageKeys(k, f) for k, f in zip(self.keys, self.flags, strict=True)]

    def uses_of(self, group: int, page: int) -> int:
        """The use count of registered ``page``'s key."""
        assert self.flags[group][page], f"uses_of unregistered page {group}:{page}"
        return self.page_uses[group][page]

    def seen(self, group: int, key: bytes) -> bool:
        """Whether ``key``'s content was computed or hit before (a use count, kept after eviction)."""
        page = self.table[group].get(key)
        return key in self.uses[group] if page is None else self.page_uses[group][page] > 0

    def counts(self, group: int) -> dict[bytes, int]:
        """Every key's use count (those of keys gone first, then the registered ones)."""
        out, page_uses = dict(self.uses[group]), self.page_uses[group]
        for page, key in self.key_of[group].items():
            assert key not in out, f"group {group}: a registered key also counted as gone"
            if page_uses[page]:
                out[key] = page_uses[page]
        return out

    def check_uses(self, group: int) -> None:
        """Assert the keys of ``uses`` are not registered and unregistered pages count 0."""
        table, page_uses = self.table[group], self.page_uses[group]
        assert table.keys().isdisjoint(self.uses[group]), f"group {group}: a registered key in uses"
        assert not view(page_uses)[view(self.flags[group]) == 0].any(), \
            f"group {group}: a use count on an unregistered page"
        assert all(n > 0 for n in self.uses[group].values()), f"group {group}: a count of 0 kept"

    def count_use(self, group: int, page: int) -> None:
        """A live request reuses registered ``page`` (a prefix hit)."""
        self.page_uses[group][page] += 1

    def count_use_many(self, group: int, pages: list[int]) -> None:
        """``count_use`` for each of ``pages`` (distinct; a long run in numpy)."""
        page_uses = self.page_uses[group]
        if len(pages) > BULK:
            view(page_uses)[int64s(pages)] += 1
            return
        for page in pages:
            page_uses[page] += 1

    def uncount_use(self, group: int, page: int) -> None:
        """Take back ``count_use`` (the hold did not become a use); never below 0."""
        page_uses = self.page_uses[group]
        if page_uses[page] > 0:
            page_uses[page] -= 1

    def uncount_use_many(self, group: int, pages: list[int]) -> None:
        """``uncount_use`` for each of ``pages`` (distinct; a long run in numpy)."""
        page_uses = self.page_uses[group]
        if len(pages) > BULK:
            ids = int64s(pages)
            counts = view(page_uses)[ids]
            view(page_uses)[ids] = np.maximum(counts - 1, 0)
            return
        for page in pages:
            if page_uses[page] > 0:
                page_uses[page] -= 1

    def get(self, group: int, key: bytes) -> int | None:
        return self.table[group].get(key)

    def register(self, group: int, page: int, key: bytes) -> bool:
        """Record that ``page`` holds ``key``.  Returns False (and changes nothing) when
        another page already holds that key or the page is already registered."""
        self.version += 1
        table, flags = self.table[group], self.flags[group]
        if key in table or flags[page]:
            if self.uses is not None and key in table:
                self.page_uses[group][table[key]] += 1  # computed again
            return False
        table[key] = page
        self.keys[group][page] = key
        flags[page] = 1
        if self.events is not None:
            self.events.stored(group, key)
        if self.uses is not None:
            self.page_uses[group][page] = self.uses[group].pop(key, 0) + 1
        return True

    def _gone(self, group: int, key: bytes, n: int) -> None:
        """``key`` (use count ``n`` > 0) left the index: remembered in ``uses``, the newest."""
        uses = self.uses[group]
        uses[key] = n
        if len(uses) > self.USES_KEPT:
            del uses[next(iter(uses))]  # the longest gone

    def register_many(self, group: int, pages: list[int | None], keys: list[bytes], held=None) -> list:
        """``register`` each (page, key) pair in order; ``None`` pages are skipped.  With
        ``held`` (per page: references), a pair whose key another page holds while
        ``held[that page] == 0`` (CACHED) is neither registered nor counted but returned, in
        order: the caller evicts that page and registers the pair (class doc)."""
        self.version += 1
        if len(pages) > 8 and len(keys) == len(pages) and self.events is None and self._fresh_run(group, pages, keys):
            return []
        taken: list = []
        table, flags, page_keys, events = self.table[group], self.flags[group], self.keys[group], self.events
        counting = self.uses is not None
        if counting:
            uses, page_uses = self.uses[group], self.page_uses[group]
        for page, key in zip(pages, keys, strict=True):
            if page is None:
                continue
            if key in table or flags[page]:
                if key in table and not flags[page] and held is not None and not held[table[key]]:
                    taken.append((page, key))  # its holder is only cached: taken over
                elif counting and key in table:
                    page_uses[table[key]] += 1  # computed again
                continue
            table[key] = page
            page_keys[page] = key
            flags[page] = 1
            if events is not None:
                events.stored(group, key)
            if counting:
                page_uses[page] = uses.pop(key, 0) + 1
        return taken

    def _fresh_run(self, group: int, pages: list[int | None], keys: list[bytes]) -> bool:
        """The common case, a run of fresh pages with new keys: the table updated in one call,
        the flags, keys and page counts in one numpy pass each.  False (nothing changed) otherwise."""
        try:
            ids = int64s(pages)
        except struct.error:  # a None
            return False
        registered = view(self.flags[group])
        if registered[ids].any() or not self._insert_fresh(self.table[group], keys, pages):
            return False
        self.keys[group][ids] = keys
        registered[ids] = 1
        if self.uses is not None:
            self._count_first_uses(group, keys, ids)
        return True

    @staticmethod
    def _insert_fresh(table: dict[bytes, int], keys: list[bytes], pages: list[int]) -> bool:
        """Insert every (key, page) when no key is in ``table`` and the keys are distinct (one
        probe per key: ``setdefault``); else change nothing and return False.  The caller made
        sure no page is registered, so a key already in ``table`` never maps to its own page."""
        n = len(table)
        got = list(map(table.setdefault, keys, pages))
        if len(table) - n == len(keys):
            return True
        for key, page, was in zip(keys, pages, got, strict=True):
            if was == page:  # inserted here: taken out again (a repeated key: once)
                table.pop(key, None)
        return False

    def _count_first_uses(self, group: int, keys: list[bytes], ids: np.ndarray) -> None:
        """The uses of freshly registered ``keys`` (of pages ``ids``): one more than each had
        when it left the index (it leaves ``uses``), else 1 (the usual case: one probe each, or
        none while ``uses`` is empty)."""
        uses = self.uses[group]
        if uses and not uses.keys().isdisjoint(keys):  # some were counted before (evicted since)
            view(self.page_uses[group])[ids] = np.fromiter(map(uses.pop, keys, repeat(0)), dtype=np.int64,
                                                           count=len(keys)) + 1
        else:
            view(self.page_uses[group])[ids] = 1

    def is_registered(self, group: int, page: int) -> bool:
        return self.flags[group][page] == 1

    def drop(self, group: int, page: int) -> None:
        self.version += 1
        flags = self.flags[group]
        assert flags[page], f"drop of unregistered page {group}:{page}"
        key = self.keys[group][page]
        del self.table[group][key]
        flags[page] = 0
        self.keys[group][page] = None
        if self.uses is not None:
            page_uses = self.page_uses[group]
            if page_uses[page]:
                self._gone(group, key, page_uses[page])
                page_uses[page] = 0
        if self.events is not None:
            self.events.removed(group, key)

    def drop_many(self, group: int, pages) -> None:
        """``drop`` each of ``pages`` (distinct; a list or an int array; a long run in one numpy
        pass each for the flags, keys and counts)."""
        self.version += 1
        if len(pages) <= BULK:
            for page in pages:
                self.drop(group, page)
            return
        ids = as_ids(pages)
        registered = view(self.flags[group])
        assert registered[ids].all(), f"drop of unregistered pages of group {group}"
        page_keys = self.keys[group]
        keys = page_keys[ids].tolist()
        table = self.table[group]
        for key in keys:
            del table[key]
        registered[ids] = 0
        page_keys[ids] = None
        if self.uses is not None:
            page_uses = view(self.page_uses[group])
            counts = page_uses[ids]
            counted = counts > 0
            if counted.any():  # ``_gone`` for each, in order; the longest gone trimmed after
                uses = self.uses[group]
                uses.update(zip(compress(keys, counted.tolist()), counts[counted].tolist(), strict=True))
                page_uses[ids] = 0
                while len(uses) > self.USES_KEPT:
                    del uses[next(iter(uses))]
        if self.events is not None:
            for key in keys:
                self.events.removed(group, key)

    def unregister(self, group: int, page: int) -> None:
        """A page registered before it was written leaves the index unwritten (its fill was
        aborted): it never counted as a use."""
        if self.uses is not None:
            self.uncount_use(group, page)
        self.drop(group, page)

    def __len__(self) -> int:
        return sum(len(t) for t in self.table)


# ---------------------------------------------------------------- block hashes (module doc: *Block hashes*)

DIGEST_BYTES = 16


def root_hash(cache_salt: str | None = None) -> bytes:
    """Root of a tenant's hash chains: no salt, and each salt string (``""`` included), differ."""
    if cache_salt is None:
        return blake3(b"jenga-root\x00").digest(DIGEST_BYTES)
    return blake3(b"jenga-root\x01" + cache_salt.encode()).digest(DIGEST_BYTES)


def image_key(root: bytes, image: ImageRef, page_index: int) -> bytes:
    """Key of page ``page_index`` of an image's own pages (cross KV, vision embeddings) for the
    tenant whose root hash is ``root``: same image (hash and size), same tenant -> same pages,
    wherever the image sits in the prompt."""
    digest = image.content_hash.encode()
    head = np.array([image.num_tokens, len(digest)], dtype=np.int64).tobytes()
    return blake3(b"img\x00" + root + head + digest + page_index.to_bytes(8, "little")).digest(DIGEST_BYTES)


def _framed(image: ImageRef, block_start: int) -> bytes:
    """``(offset - block_start, num_tokens, len(hash))`` as int64s, then the hash's bytes."""
    digest = image.content_hash.encode()
    return (np.array([image.offset - block_start, image.num_tokens, len(digest)], dtype=np.int64).tobytes()
            + digest)


def _u32_bytes(tokens: Sequence[int], lo: int, hi: int) -> bytes:
    """Tokens ``[lo, hi)`` as little-endian uint32s (a ``uint32`` array: a copy of its buffer;
    other sequences: ids outside ``[0, 2**32)`` raise ``OverflowError``, never wrap)."""
    part = tokens[lo:hi] if isinstance(tokens, array) and tokens.typecode == "I" else array("I", tokens[lo:hi])
    if _BIG_ENDIAN:
        part.byteswap()
    return part.tobytes()


_BIG_ENDIAN = sys.byteorder == "big"
# an unfed BLAKE2b state (default parameters): ``copy`` of it is ``blake2b()`` without the
# parameter parsing and set-up of a new object (~15 % less per block than ``blake2b(data)``)
_BLANK = blake2b()


def extend_block_hashes(hashes: list[bytes], tokens: Sequence[int], block: int, root: bytes,
                        images: Sequence[ImageRef] = (), stop: int | None = None) -> None:
    """Append to ``hashes`` the hashes of every full block of ``tokens`` not yet hashed
    (of the first ``stop`` blocks only, when given).

    Changes ``hashes`` in place; one BLAKE2b call per block (module doc).
    """
    start = len(hashes)
    end = len(tokens) // block if stop is None else min(stop, len(tokens) // block)
    if end <= start:
        return
    raw = _u32_bytes(tokens, start * block, end * block)
    width = block * 4
    parent = hashes[-1] if hashes else root
    if not images:  # the blocks' bytes split in C; each block a copy of a blank state fed parent, tokens
        fresh, append = _BLANK.copy, hashes.append
        for part in np.frombuffer(raw, dtype=f"V{width}").tolist():
            h = fresh()
            h.update(parent)
            h.update(part)
            append(parent := h.digest()[:DIGEST_BYTES])
        return
    append = hashes.append
    for i in range(start, end):
        lo, hi = i * block, (i + 1) * block
        msg = [parent, raw[(i - start) * width:(i - start + 1) * width]]
        msg += [_framed(img, lo) for img in images if img.offset < hi and img.offset + max(img.num_tokens, 1) > lo]
        parent = blake2b(b"".join(msg)).digest()[:DIGEST_BYTES]
        append(parent)


FIRST_CHUNK = 32  # pages hashed before the first look at the index


class IndexTables(Protocol):
    """What ``PromptHasher.for_lookup`` reads of the prefix index (the ledger's ``PageOps``)."""

    def index_table(self, group: int) -> Mapping[bytes, int]:
        """Group ``group``'s ``key -> page`` table, read only."""


class PromptHasher:
    """A request's block hashes, made when needed (module doc).  ``memo``: freed requests' hashes
    (a re-add); ``bound``: of the groups' ``policies`` (``jenga.core.policy``: ``bounds_hit``, ``gi``
    and ``tpp`` read), one whose hit needs every page below it (full attention), if any."""

    def __init__(self, policies: Sequence, block: int):
        self.block = block
        self.memo = HashMemo()
        self.bound = next((p for p in policies if p.bounds_hit), None)

    def hash_upto(self, req: Request, blocks: int) -> None:
        """Hash the request's first ``blocks`` blocks (those not hashed yet)."""
        hashes = req.hashes
        if blocks <= len(hashes):
            return
        source = req.source_hashes
        if source is not None:  # the caller's hashes (``add_request(block_hashes=...)``): read, not hashed
            step = req.hash_step
            stop = min(blocks, len(source) // step, len(req.tokens) // self.block)
            hashes.extend(source[(i + 1) * step - 1] for i in range(len(hashes), stop))
            return
        if req.images:
            extend_block_hashes(hashes, req.tokens, self.block, req.salt_root, req.images, stop=blocks)
            return
        memo = self.memo
        if not hashes:  # the first block names the donor, a recent prompt starting alike (``HashMemo``)
            extend_block_hashes(hashes, req.tokens, self.block, req.salt_root, stop=1)
            if not hashes:
                return
            req.lender = memo.donor(hashes[0])
            memo.offer(req.tokens, hashes)
        if req.lender is not None:
            memo.lend(req.lender, req.tokens, hashes, self.block, blocks)
        extend_block_hashes(hashes, req.tokens, self.block, req.salt_root, stop=blocks)

    def for_lookup(self, req: Request, top: int, ops: IndexTables) -> int:
        """Hash what a hit of at most ``top`` tokens can reach; returns a bound on the hit that
        leaves the longest common hit unchanged (the start of the first page the full-attention
        group misses, else ``top``)."""
        block = self.block
        bound = self.bound
        if bound is None:
            self.hash_upto(req, top // block)
            return top
        tpp = bound.tpp
        m = tpp // block
        table = ops.index_table(bound.gi)
        hashes = req.hashes
        npages = top // tpp
        i, chunk = 0, FIRST_CHUNK  # pages [0, i) are cached
        while i < npages:
            have = min(npages, len(hashes) // m)
            if have <= i:
                known = len(hashes)
                self.hash_upto(req, min(npages, i + chunk) * m)
                if len(hashes) == known:  # the caller's hashes end here
                    return i * tpp
                chunk *= 2
                continue
            found = list(map(table.__contains__, hashes[i * m + m - 1:have * m:m]))
            if not all(found):
                return (i + found.index(False)) * tpp
            i = have
        return top


class HashMemo:
    """The tokens and block hashes of the last ``size`` freed requests, and of the last ``size``
    image-free prompts by their first block hash (the donors).

    A preempted request comes back with its generated tokens under the same id; the
    blocks whose tokens, salt and images are unchanged reuse their hashes, so a long
    prompt is not hashed again.  A new image-free prompt whose first block hash (which folds in
    the salt) equals a donor's borrows the donor's hashes over their common token prefix
    (compared token by token in one numpy pass): ``h_i`` names exactly (salt, tokens ``[0, (i+1)
    * block)``), so the borrowed hashes are the ones hashing would give (``jenga.core.prefix.index``).
    """

    def __init__(self, size: int = 256):
        self.size = size
        self._memo: dict[object, tuple] = {}
        # first block hash -> (tokens, hashes) of the latest image-free prompt starting so
        self._donors: dict[bytes, tuple[array, list[bytes] | HashChain]] = {}

    def remember(self, request_id: object, tokens: array, hashes: list[bytes], root: bytes,
                 images: tuple[ImageRef, ...]) -> None:
        """A freed request's hashes, kept as a ``HashChain`` (which the garbage collector does
        not walk: the memo and the donors hold up to 512 prompts' hashes), also as the donor
        it may be (its list can no longer grow)."""
        memo = self._memo
        chain = HashChain(hashes)
        memo[request_id] = (tokens, chain, root, images)
        if len(memo) > self.size:
            del memo[next(iter(memo))]  # the oldest
        donor = self._donors.get(hashes[0]) if hashes else None
        if donor is not None and donor[1] is hashes:
            self._donors[hashes[0]] = (tokens, chain)  # the same place in the donors' order

    def recall(self, request_id: object, tokens: array, root: bytes, block: int,
               images: tuple[ImageRef, ...]) -> list[bytes]:
        """The remembered hashes still valid for ``tokens`` (forgotten either way)."""
        memo = self._memo.pop(request_id, None)
        if memo is None:
            return []
        old_tokens, old_hashes, old_root, old_images = memo
        n = min(len(old_hashes), len(tokens) // block)
        if old_root != root or old_images != images or \
                tokens[:n * block].tobytes() != old_tokens[:n * block].tobytes():  # uint32 arrays: memcmp
            return []
        return old_hashes[:n]

    def donor(self, first: bytes) -> tuple[array, list[bytes] | HashChain] | None:
        """The latest image-free prompt whose first block hash is ``first``."""
        return self._donors.get(first)

    def offer(self, tokens: array, hashes: list[bytes]) -> None:
        """An image-free prompt with its first hash: the newest donor for its first block (its
        own array and list: tokens are only appended, hashes cover known tokens only)."""
        donors = self._donors
        donors.pop(hashes[0], None)
        donors[hashes[0]] = (tokens, hashes)
        if len(donors) > self.size:
            del donors[next(iter(donors))]  # the oldest

    @staticmethod
    def lend(donor: tuple[array, list[bytes] | HashChain], tokens: array, hashes: list[bytes], block: int,
             stop: int) -> None:
        """Extend ``hashes`` (at least the first) towards ``stop`` blocks with ``donor``'s, over
        the blocks whose tokens both share."""
        d_tokens, d_hashes = donor
        have = len(hashes)
        top = min(stop, len(d_hashes), len(tokens) // block)
        if top <= have or d_hashes[have - 1] != hashes[have - 1]:  # equal: tokens [0, have * block) equal
            return
        lo, hi = have * block, top * block
        differ = np.flatnonzero(np.frombuffer(tokens, dtype=np.uint32, count=hi)[lo:]
                                != np.frombuffer(d_tokens, dtype=np.uint32, count=hi)[lo:])
        n = int(differ[0] if len(differ) else hi - lo) // block
        if n:
            hashes += d_hashes[have:have + n]


class HashChain:
    """The block hashes of a request that is gone (``h_i`` names its prefix ``[0, (i + 1) *
    block)``, ``jenga.core.prefix.index``), read as the list they were: ``len``, an index, a slice
    (a new ``list``), iteration, equality with a list.  Never changes.

    Stored in a numpy object array: Python's cyclic garbage collector walks every element of
    every list it tracks, numpy arrays not at all, and the hash memo keeps up to 512 prompts'
    hashes (a 20k-token article has 1,250, a 100k-token prompt 6,250) -- as lists, each
    collection that finds them young (or every full one) visits them all.  The elements are
    the same ``bytes`` objects (the prefix index's keys); bytes cannot form reference cycles.
    """

    __slots__ = ("_arr",)

    def __init__(self, hashes: Sequence[bytes]):
        self._arr = np.empty(len(hashes), dtype=object)
        self._arr[:] = hashes

    def __len__(self) -> int:
        return len(self._arr)

    def __getitem__(self, i):
        if type(i) is int:
            return self._arr[i]  # IndexError past either end, as a list
        return self._arr[i].tolist()

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._arr.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashChain):
            other = other[:]
        return isinstance(other, list) and self[:] == other

    __hash__ = None  # compared by value, like a list

    def __repr__(self) -> str:
        return f"HashChain({self[:]!r})"
