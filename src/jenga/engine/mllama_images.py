"""Llama-3.2-Vision image inputs of a prompt -> jenga ``ImageRef``s + the cross-attention masks.

Accepted input (vLLM's prompt convention, HF processor outputs for the prompt's images)::

    {"prompt_token_ids": [... one <|image|> id per image ...],
     "multi_modal_data": {"image": {
         "pixel_values":      [num_images, max_num_tiles, 3, H, W] float,
         "aspect_ratio_ids":  [num_images] int (1-based index into supported_aspect_ratios),
         "aspect_ratio_mask": [num_images, max_num_tiles] 0/1 (1 for the image's real tiles),
         "cross_attention_mask": optional [len(prompt), num_images, max_num_tiles]}}}

Each tensor may carry the processor's leading batch dimension of 1.  ``cross_attention_mask``
is computed here from the ``<|image|>`` positions as HF's processor does (image ``j`` is seen
from its token up to the next image token, a run of consecutive image tokens to the end of the
prompt, the real tiles only); a given one must equal it (custom masks are not supported).
Decode tokens see what the last prompt token sees (HF repeats the last row).

Every bad input is an :class:`~jenga.errors.InvalidArgumentError` before anything is queued.
``seq.images``: one :class:`~jenga.core.request.ImageRef` per image of
``model.tokens_per_image`` cross tokens (all tiles x patches), ``offset`` 0 -- HF's text rows
that see no image still attend to every image (their mask row is all zero), so every text
token of the request depends on all of its images and each image is framed into the first
prefix block's hash; ``content_hash`` covers pixels, aspect-ratio id and mask.  ``seq.mm``: an
:class:`MllamaImages`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from jenga.core.request import ImageRef
from jenga.engine.multimodal import pixel_hash
from jenga.errors import InvalidArgumentError

KEYS = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")


@dataclass(frozen=True)
class MllamaImages:
    """One prompt's images, checked: what the encoder and the cross-attention masks need."""

    pixel_values: Tensor  # [N, tiles, 3, H, W]
    aspect_ratio_ids: Tensor  # [N] long
    aspect_ratio_mask: Tensor  # [N, tiles] long
    num_tiles: tuple[int, ...]  # real tiles of each image
    ranges: tuple[tuple[int, int], ...]  # text positions [start, end) that see image j
    prompt_len: int


def image_ranges(ids: Sequence[int], image_token_id: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the text positions seeing each image (HF processor's rule)."""
    locs = [i for i, t in enumerate(ids) if t == image_token_id]
    if not locs:
        return []
    ranges = [[s, e] for s, e in zip(locs, locs[1:] + [len(ids)], strict=True)]
    last = len(ids)
    for r in reversed(ranges):  # consecutive image tokens: all of them to the end of the group
        if r[1] == r[0] + 1:
            r[1] = last
        last = r[1]
    return [(s, e) for s, e in ranges]


def dense_mask(ranges: Sequence[tuple[int, int]], num_tiles: Sequence[int], max_tiles: int, length: int) -> Tensor:
    """HF's ``cross_attention_mask`` ``[length, N, max_tiles]`` (1: the token sees the tile)."""
    out = torch.zeros(length, len(ranges), max_tiles, dtype=torch.long)
    for j, ((s, e), t) in enumerate(zip(ranges, num_tiles, strict=True)):
        out[s:e, j, :t] = 1
    return out


def _tensor(data: Mapping, key: str, dims: int, rid) -> Tensor:
    value = data.get(key)
    if not isinstance(value, Tensor):
        raise InvalidArgumentError(f"request {rid!r}: multi_modal_data['image'][{key!r}] must be a torch tensor, "
                                   f"got {type(value).__name__}")
    if value.dim() == dims + 1 and value.shape[0] == 1:
        value = value[0]  # the processor's batch dimension
    if value.dim() != dims:
        raise InvalidArgumentError(f"request {rid!r}: {key} has shape {tuple(value.shape)}, expected {dims} "
                                   f"dimensions (one prompt's images; an optional leading batch dimension of 1)")
    return value


def _tiles(ids: Tensor, mask: Tensor, model, rid) -> tuple[int, ...]:
    """Real tiles per image, checked against the aspect-ratio ids and the mask's shape (1..1 0..0)."""
    ratios = model.supported_aspect_ratios
    tiles = []
    for j, (a, m) in enumerate(zip(ids.tolist(), mask.tolist(), strict=True)):
        if not 1 <= a <= len(ratios):
            raise InvalidArgumentError(f"request {rid!r}: image {j} has aspect_ratio_id {a}; the model supports "
                                       f"1..{len(ratios)} ({ratios})")
        n = math.prod(ratios[a - 1])
        if m != [1] * n + [0] * (len(m) - n):
            raise InvalidArgumentError(f"request {rid!r}: image {j}: aspect_ratio_mask {m} does not mark the "
                                       f"{n} tiles of aspect ratio {ratios[a - 1]} (id {a})")
        tiles.append(n)
    return tuple(tiles)


def attach_mllama_images(seq, data, model) -> None:
    """Validate ``multi_modal_data["image"]`` against ``model`` and set ``seq.images`` / ``seq.mm``."""
    rid = seq.request_id
    if not isinstance(data, Mapping):
        raise InvalidArgumentError(f"request {rid!r}: Llama-3.2-Vision takes multi_modal_data['image'] as a mapping "
                                   f"with {', '.join(KEYS[:3])} (the HF processor's outputs), got "
                                   f"{type(data).__name__}")
    unknown = set(data) - set(KEYS)
    if unknown:
        raise InvalidArgumentError(f"request {rid!r}: unknown image inputs {sorted(unknown)}; expected {KEYS}")
    pixels = _tensor(data, "pixel_values", 5, rid)
    n, T = int(pixels.shape[0]), model.max_num_tiles
    if not pixels.is_floating_point() or tuple(pixels.shape[1:]) != (T, *model.tile_shape):
        raise InvalidArgumentError(f"request {rid!r}: pixel_values {pixels.dtype} {tuple(pixels.shape)}, the vision "
                                   f"model takes float [num_images, {T}, {', '.join(map(str, model.tile_shape))}] "
                                   f"(tiles padded to max_num_tiles, as the processor writes them)")
    ar_ids = _tensor(data, "aspect_ratio_ids", 1, rid)
    ar_mask = _tensor(data, "aspect_ratio_mask", 2, rid)
    if tuple(ar_ids.shape) != (n,) or tuple(ar_mask.shape) != (n, T):
        raise InvalidArgumentError(f"request {rid!r}: aspect_ratio_ids {tuple(ar_ids.shape)} / aspect_ratio_mask "
                                   f"{tuple(ar_mask.shape)} do not match {n} images of {T} tiles")
    ids = seq.prompt_token_ids
    ranges = image_ranges(ids, model.image_token_id)
    if len(ranges) != n:
        raise InvalidArgumentError(f"request {rid!r}: {n} images but {len(ranges)} image tokens "
                                   f"({model.image_token_id}) in the prompt")
    tiles = _tiles(ar_ids, ar_mask, model, rid)
    given = data.get("cross_attention_mask")
    if given is not None:
        given = _tensor(data, "cross_attention_mask", 3, rid)
        if not torch.equal(given.long().cpu(), dense_mask(ranges, tiles, T, len(ids))):
            raise InvalidArgumentError(f"request {rid!r}: cross_attention_mask differs from the one the image "
                                       "token positions give (custom masks are not supported)")
    refs = []
    for j in range(n):
        bits = "".join(map(str, ar_mask[j].tolist()))
        refs.append(ImageRef(0, model.tokens_per_image, f"{pixel_hash(pixels[j])}-{int(ar_ids[j])}-{bits}"))
    seq.images = tuple(refs)
    seq.mm = MllamaImages(pixels, ar_ids.long(), ar_mask.long(), tiles, tuple(ranges), len(ids))
