"""Chained, collision-resistant block hashes over token ids.

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

import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from hashlib import blake2b
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
from blake3 import blake3

if TYPE_CHECKING:  # annotations only: a request record carries this module's ``ImageRef``
    from jenga.core.request import Request

DIGEST_BYTES = 16


class ImageRef(NamedTuple):
    """An image inside a request: ``num_tokens`` tokens from ``offset`` (text position for
    in-sequence images; for cross-attention images, the position of the image token)."""

    offset: int
    num_tokens: int
    content_hash: str


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
    * block)``), so the borrowed hashes are the ones hashing would give (``jenga.core.prefix.hashing``).
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
    block)``, ``jenga.core.prefix.hashing``), read as the list they were: ``len``, an index, a slice
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
