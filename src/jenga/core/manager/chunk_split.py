"""Chunk split: how many of a proposed chunk's tokens a request's step should run.

A scheduler proposes ``n`` new tokens for a request (what is left of its prompt, capped by
the step's budget) and asks the manager; each group's policy may end the step earlier
(``Policy.step_end``).  A state group ends a prefill step that would cross the prompt-end
checkpoint exactly on it, so the state at the prompt's last full block is the step's work
page, not a second page live beside it (vLLM's ``_mamba_block_aligned_split`` does the same
for its own manager); jenga's own state kind also ends the step of a short prompt resuming a
cached state below its junction on the junction.  Nothing changes without prefix caching (no checkpoints) or for
groups that store per-token pages.
"""

from __future__ import annotations

from jenga.core.validation import checked_int


class ChunkSplit:
    """``KVCacheManager`` mixin: ``chunk_tokens``."""

    def chunk_tokens(self, request_id: object, num_new_tokens: int) -> int:
        """The largest ``n' <= num_new_tokens`` every group accepts as the end of the
        request's next step (from its first unallocated token); ``num_new_tokens`` itself
        when no group asks to end earlier.  Changes nothing in the manager."""
        req = self._req(request_id)
        n = checked_int(num_new_tokens, "num_new_tokens", minimum=0)
        if not n or not self.caching:
            return n
        start = req.start
        stop = start + n
        for pol in self.policies:
            stop = pol.step_end(req, stop)
        return stop - start
