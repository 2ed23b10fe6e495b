"""Block hashes of freed requests, kept for a re-add under the same id."""

from __future__ import annotations

from array import array

from jenga.prefix.hashing import ImageRef


class HashMemo:
    """The tokens and block hashes of the last ``size`` freed requests.

    A preempted request comes back with its generated tokens under the same id; the
    blocks whose tokens, salt and images are unchanged reuse their hashes, so a long
    prompt is not hashed again.
    """

    def __init__(self, size: int = 256):
        self.size = size
        self._memo: dict[object, tuple] = {}

    def remember(self, request_id: object, tokens: array, hashes: list[bytes], root: bytes,
                 images: tuple[ImageRef, ...]) -> None:
        memo = self._memo
        memo[request_id] = (tokens, hashes, root, images)
        if len(memo) > self.size:
            del memo[next(iter(memo))]  # the oldest

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
