"""A trace's prompt as the model's decoder sees it: cross-attention images leave the sequence.

A trace (:class:`jenga.sim.workloads.SimRequest`) writes each image as a span of prompt
positions.  That is what a model that embeds image tokens in its text (Llama 4, Gemma 3) runs.
A model that reads images through cross-attention layers (Llama 3.2 Vision) does not: the image
tokens are the encoder's, and the decoder's prompt holds one image token per image (vLLM's
``<|image|>``; ``jenga.engine.mllama_images`` gives the manager ``ImageRef(position, tokens, hash)``
the same way).  So for such a model the scheduler's token budget, the prefill token count and
the self-attention layers' pages see the text and one token per image, and the manager gets
each image at its token's position with its encoder token count (its cross-attention pages).

:class:`DecoderView` keeps the map back to the trace's positions, so the cost model (which
takes trace positions and leaves the image positions out of the language model itself,
:mod:`jenga.sim.costing`) prices the same work as before: a decoder range ``[s, e)`` is the
trace range ``[expanded(s), expanded(e))``, each image token standing for its whole span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class DecoderView:
    """The decoder's prompt ids and images, and the map to trace positions."""

    ids: np.ndarray
    images: tuple[tuple[int, int, str], ...]  # (decoder position, image tokens, hash)
    positions: np.ndarray  # decoder positions of the image tokens, sorted (empty: the identity map)
    extra: np.ndarray  # trace positions each image token stands for beyond itself, cumulative

    def expanded(self, pos: int) -> int:
        """The trace position of decoder position ``pos`` (the end of a decoder range)."""
        k = int(np.searchsorted(self.positions, pos, side="left"))
        return pos + (int(self.extra[k - 1]) if k else 0)


def decoder_view(ids: np.ndarray, images, cross_attention: bool) -> DecoderView:
    """The decoder's view of a prompt of trace ``ids`` with image spans ``images``
    (``(offset, num_tokens, hash)``): unchanged unless ``cross_attention``, else every span
    replaced by its first token (one image token per image; equal images, equal ids)."""
    images = tuple(images)
    none = np.zeros(0, np.int64)
    if not cross_attention or not images:
        return DecoderView(ids, images, none, none)
    keep, out, pos, prev = [], [], [], 0
    for off, n, h in images:
        keep.append(ids[prev:off + 1])  # the text before the image and its first token
        pos.append(off - sum(m - 1 for _, m, _ in out))
        out.append((pos[-1], n, h))
        prev = off + n
    keep.append(ids[prev:])
    extra = np.cumsum([n - 1 for _, n, _ in images], dtype=np.int64)
    return DecoderView(np.concatenate(keep), tuple(out), np.array(pos, np.int64), extra)
