"""Block hashes kept for reuse: a freed request's for its re-add under the same id, a recent
prompt's lent to a new prompt that starts with the same tokens."""

from __future__ import annotations

from array import array

import numpy as np

from jenga.core.prefix.hash_chain import HashChain
from jenga.core.prefix.hashing import ImageRef


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
