"""Which block hashes of a request are computed, and when: only those a lookup can reach.

A prompt's blocks are hashed as a chain (``jenga.core.prefix.hashing``: one BLAKE2b call per block,
the salt at the root), so a 128k-token prompt costs thousands of calls.  ``add_request`` only
takes what the hash memo remembers of the same request (a re-add after a preemption); ``lookup``
hashes block by block (in doubling chunks) only up to the first page a full-attention group has
not cached (no hit can pass a page every full-attention hit needs); the rest are hashed as the
tokens are computed (``append_tokens``), which is when their pages join the prefix index.  The
hashes are the same as hashing the whole prompt at once; fewer of them exist earlier.  A request
added with the caller's ``block_hashes`` (vLLM's) reads them from that sequence instead, as far as
it has them.

``PromptHasher`` owns the hash memo and knows the bounding full-attention policy; the manager
hands it the request.
"""

from __future__ import annotations

from jenga.core.policy.base import PageOps, Policy
from jenga.core.prefix.hash_memo import HashMemo
from jenga.core.prefix.hashing import extend_block_hashes
from jenga.core.request import Request

FIRST_CHUNK = 32  # pages hashed before the first look at the index


class PromptHasher:
    """A request's block hashes, made when needed (module doc).  ``memo``: freed requests' hashes
    (a re-add); ``bound``: a policy whose hit needs every page below it (full attention), if any."""

    def __init__(self, policies: list[Policy], block: int):
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
        if not hashes:  # the first block names the donor, a recent prompt starting alike (jenga.core.prefix.hash_memo)
            extend_block_hashes(hashes, req.tokens, self.block, req.salt_root, stop=1)
            if not hashes:
                return
            req.lender = memo.donor(hashes[0])
            memo.offer(req.tokens, hashes)
        if req.lender is not None:
            memo.lend(req.lender, req.tokens, hashes, self.block, blocks)
        extend_block_hashes(hashes, req.tokens, self.block, req.salt_root, stop=blocks)

    def for_lookup(self, req: Request, top: int, ops: PageOps) -> int:
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
