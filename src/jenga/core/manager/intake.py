"""``RequestIntake``: a caller's new request checked, then turned into the manager's record.

Every check runs before anything changes (a bad id, prompt, image, salt or hash block raises a
typed error and leaves the manager as it was).  The record starts with the block hashes the
hash memo recalls for the same prompt (a re-add after a preemption; the rest are made lazily,
:mod:`jenga.core.prefix.index`), one empty state per group from its policy, the salt's
root hash, and whether it is a repeat (:mod:`jenga.core.manager.admission`).  A request added
with the caller's ``block_hashes`` keeps them and jenga hashes nothing for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from jenga.core.manager.admission import HitCounts
from jenga.core.policy.base import Policy
from jenga.core.prefix.index import PromptHasher, root_hash
from jenga.core.request import ImageRef, Request
from jenga.core.validation import checked_images, checked_int, checked_salt, token_array
from jenga.errors import DuplicateRequestError, InvalidArgumentError, SequenceTooLongError


class RequestIntake:
    """Builds records for ``KVCacheManager.add_request``.  ``in_sequence_images``: images are text
    spans that must lie inside the prompt (some group embeds them in-sequence)."""

    def __init__(self, policies: list[Policy], block: int, caching: bool, max_model_len: int,
                 in_sequence_images: bool, hasher: PromptHasher, hits: HitCounts):
        self.policies, self.block, self.caching = policies, block, caching
        self.max_model_len, self.in_sequence_images = max_model_len, in_sequence_images
        self.hasher, self.hits = hasher, hits

    def new_request(self, request_id: object, prompt_token_ids: Sequence[int], images: Sequence,
                    cache_salt: str | None, block_hashes: Sequence[bytes] | None, hash_block: int | None,
                    live: dict, prompt_checkpoint: int | None = None) -> Request:
        """The checked record of a new request (not yet in ``live``, the manager's live records)."""
        step = 1
        if block_hashes is not None:
            hb = checked_int(hash_block if hash_block is not None else self.block, "hash_block")
            if self.block % hb:
                raise InvalidArgumentError(f"request {request_id!r}: hash_block {hb} does not divide the manager's "
                                           f"block of {self.block} tokens")
            step = self.block // hb
        try:
            duplicate = request_id in live
        except TypeError:
            raise InvalidArgumentError(f"request id {request_id!r} is not hashable") from None
        if duplicate:
            raise DuplicateRequestError(f"request id {request_id!r} is already live")
        tokens = token_array(prompt_token_ids, f"request {request_id!r} prompt")  # a copy: flat uint32
        if not tokens:
            raise InvalidArgumentError(f"request {request_id!r}: empty prompt")
        if len(tokens) > self.max_model_len:
            raise SequenceTooLongError(f"request {request_id!r}: prompt of {len(tokens)} tokens exceeds the "
                                       f"model's max length {self.max_model_len}")
        if prompt_checkpoint is not None:
            pos = checked_int(prompt_checkpoint, "prompt_checkpoint", minimum=0)
            if not 0 <= pos <= len(tokens) or pos % self.block:
                raise InvalidArgumentError(f"request {request_id!r}: prompt_checkpoint {pos} is not a multiple of "
                                           f"the block ({self.block}) in [0, {len(tokens)}]")
        refs = tuple(ImageRef(*img) for img in checked_images(images, len(tokens), self.in_sequence_images,
                                                              f"request {request_id!r}"))
        hashes: list[bytes] = []
        root = root_hash(checked_salt(cache_salt)) if self.caching else b""
        repeat = self.hits.is_repeat(request_id)
        if self.caching and block_hashes is None:
            hashes = self.hasher.memo.recall(request_id, tokens, root, self.block, refs)  # the rest: lazily
        req = Request(request_id, tokens, len(tokens), refs, hashes, [pol.state_type() for pol in self.policies])
        req.salt_root, req.repeat, req.prompt_checkpoint = root, repeat, prompt_checkpoint
        req.source_hashes, req.hash_step = block_hashes, step
        return req
