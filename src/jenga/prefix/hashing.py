"""Chained, collision-resistant block hashes over token ids.

``h_i = blake3(h_{i-1} || tokens_i as little-endian int64 || images of block i)``, each image
overlapping block i framed as ``(offset - block start, num_tokens, len(hash))`` int64s then the
hash's bytes, so an image at another offset or of another length never hits, and ``"ab","c"``
never equals ``"a","bc"``.  The root ``h_{-1}`` folds in the cache salt (``None`` and ``""`` are
distinct tenants), and so does every image page's key, so tenants with different salts never
share a page, text or image.  blake3 is a cryptographic hash: a crafted prompt cannot collide with
another tenant's prefix (vLLM moved from Python's ``hash`` to sha256 after such an
advisory), and it runs at GB/s, so one call per page never dominates a step.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from blake3 import blake3

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


def _int64_bytes(tokens: Sequence[int], lo: int, hi: int) -> bytes:
    """Tokens ``[lo, hi)`` as little-endian int64s (a ``uint32`` array: straight from its buffer)."""
    if isinstance(tokens, array) and tokens.typecode == "I":
        view = np.frombuffer(tokens, dtype=np.uint32, count=hi - lo, offset=4 * lo)
        raw = view.astype("<i8").tobytes()
        del view  # the array may grow again only once no view holds its buffer
        return raw
    return np.asarray(tokens[lo:hi], dtype="<i8").tobytes()


def extend_block_hashes(hashes: list[bytes], tokens: Sequence[int], block: int, root: bytes,
                        images: Sequence[ImageRef] = (), stop: int | None = None) -> None:
    """Append to ``hashes`` the hashes of every full block of ``tokens`` not yet hashed
    (of the first ``stop`` blocks only, when given).

    Changes ``hashes`` in place; one blake3 call per block, the blocks' bytes packed by numpy.
    """
    start = len(hashes)
    end = len(tokens) // block if stop is None else min(stop, len(tokens) // block)
    if end <= start:
        return
    raw = _int64_bytes(tokens, start * block, end * block)
    width = block * 8
    parent = hashes[-1] if hashes else root
    if not images:
        new = [None] * (end - start)
        b3 = blake3
        for j, off in enumerate(range(0, (end - start) * width, width)):
            parent = new[j] = b3(parent + raw[off:off + width]).digest(DIGEST_BYTES)
        hashes += new
        return
    for i in range(start, end):
        h = blake3(parent)
        h.update(raw[(i - start) * width:(i - start + 1) * width])
        lo, hi = i * block, (i + 1) * block
        for img in images:
            if img.offset < hi and img.offset + max(img.num_tokens, 1) > lo:
                h.update(_framed(img, lo))
        parent = h.digest(DIGEST_BYTES)
        hashes.append(parent)
