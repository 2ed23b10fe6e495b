"""Image inputs of a prompt (vLLM's convention) -> jenga ``ImageRef``s + pixel tensors.

A prompt ``{"prompt_token_ids": [...], "multi_modal_data": {"image": <[3, H, W] tensor or a
list of them>}, "cache_salt": ...}`` carries one run of ``mm_tokens_per_image`` image
placeholder tokens per image, in order, as HF's processor writes them (``boi``, the run,
``eoi``).  :func:`attach_images` checks that (a typed :class:`~jenga.errors.InvalidArgumentError`
before anything is queued) and gives the sequence:

* ``seq.images``: one :class:`~jenga.core.request.ImageRef` per image, ``offset`` = the
  position of its first placeholder, ``num_tokens`` = the run length, ``content_hash`` =
  :func:`pixel_hash` of its pixels (the manager folds in the request's salt);
* ``seq.mm``: the pixel tensors, read only when the encoder must run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from blake3 import blake3
from torch import Tensor

from jenga.core.request import ImageRef
from jenga.errors import InvalidArgumentError


def pixel_hash(pixels: Tensor) -> str:
    """Content hash of an image: blake3 over dtype, shape and the raw pixel bytes."""
    t = pixels.detach().to("cpu").contiguous()
    h = blake3(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest(length=16)


def placeholder_runs(ids: Sequence[int], token_id: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of every maximal run of ``token_id`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, t in enumerate(ids):
        if t == token_id and start is None:
            start = i
        elif t != token_id and start is not None:
            runs.append((start, i - start))
            start = None
    if start is not None:
        runs.append((start, len(ids) - start))
    return runs


def _as_images(data) -> list[Tensor]:
    images = data if isinstance(data, (list, tuple)) else [data]
    out = []
    for img in images:
        if not isinstance(img, Tensor):
            raise InvalidArgumentError(f"multi_modal_data images must be torch tensors [3, H, W], got {type(img)}")
        out.append(img)
    return out


def attach_images(seq, multi_modal_data: dict, model) -> None:
    """Validate the prompt's images against ``model`` and set ``seq.images`` / ``seq.mm``."""
    unknown = set(multi_modal_data) - {"image"}
    if unknown:
        raise InvalidArgumentError(f"unsupported multi_modal_data {sorted(unknown)}; this engine takes 'image'")
    if not getattr(model, "multimodal", False):
        raise InvalidArgumentError("this model takes no images (it has no vision tower)")
    if hasattr(model, "attach_images"):  # the model's own input format (Llama-3.2-Vision: processor outputs)
        model.attach_images(seq, multi_modal_data.get("image"))
        return
    images = _as_images(multi_modal_data.get("image", []))
    runs = placeholder_runs(seq.prompt_token_ids, model.image_token_id)
    if len(runs) != len(images):
        raise InvalidArgumentError(f"request {seq.request_id!r}: {len(images)} images but {len(runs)} runs of the "
                                   f"image token {model.image_token_id} in the prompt")
    refs = []
    for (offset, n), img in zip(runs, images, strict=True):
        if n != model.mm_tokens_per_image:
            raise InvalidArgumentError(f"request {seq.request_id!r}: image run at {offset} has {n} tokens, the "
                                       f"model writes {model.mm_tokens_per_image} per image")
        if tuple(img.shape) != model.image_shape:
            raise InvalidArgumentError(f"request {seq.request_id!r}: image of shape {tuple(img.shape)}, the vision "
                                       f"tower takes {model.image_shape} (resize with the model's processor)")
        refs.append(ImageRef(offset, n, pixel_hash(img)))
    seq.images = tuple(refs)
    seq.mm = images
