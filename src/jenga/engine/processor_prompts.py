"""Text prompts with raw images, through the model directory's own HF processor.

``{"prompt": "... <start_of_image> ..." | "<|image|> ...", "multi_modal_data": {"image": <PIL image
| HWC uint8 numpy array | [3, H, W] tensor, or a list>}}`` runs the directory's processor
(``transformers.AutoProcessor.from_pretrained(path, local_files_only=True)``, loaded on first use):
it expands the image placeholders, resizes / tiles the images and writes ``pixel_values`` (and
Llama-3.2-Vision's aspect ratios and cross-attention mask).  The result is the engine's id +
tensor prompt (``prompt_token_ids`` + the model's image inputs, :mod:`jenga.engine.multimodal` /
:mod:`jenga.engine.mllama_images`), which is checked and queued as before.  A token-id prompt
with raw PIL / numpy images goes through the processor's image part only (its ids must already
hold the placeholders); tensors with token ids keep meaning pre-processed pixels.

How the processor's outputs become the model's image input is a function chosen by the model
class (:data:`IMAGE_INPUTS`).  Gemma-3's ``token_type_ids`` are dropped: the engine attends
causally over image tokens (vLLM's convention; HF uses them for bidirectional attention within
an image).  A model without processor files (or a tiny model) raises
:class:`~jenga.errors.InvalidArgumentError` naming what is missing, before anything is queued.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from torch import Tensor

from jenga.errors import InvalidArgumentError

#: a directory holding one of these has an HF processor (transformers v5 writes processor_config.json)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
MLLAMA_KEYS = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")


def _gemma3_images(out: Mapping) -> list[Tensor]:
    return list(out["pixel_values"])  # [N, 3, H, W] -> one tensor per placeholder run


def _mllama_images(out: Mapping) -> dict[str, Tensor]:
    return {k: out[k] for k in MLLAMA_KEYS if k in out}


#: model class -> processor outputs -> ``multi_modal_data["image"]`` of the id + tensor path
IMAGE_INPUTS: dict[str, Callable[[Mapping], object]] = {
    "Gemma3ForConditionalGeneration": _gemma3_images,
    "MllamaForConditionalGeneration": _mllama_images,
}


def has_processor_files(path: str | Path) -> bool:
    return any((Path(path) / f).is_file() for f in PROCESSOR_FILES)


def _is_raw(img) -> bool:
    """A PIL image or a numpy array: pixels the processor must still resize and normalise."""
    import numpy as np
    from PIL import Image

    return isinstance(img, (Image.Image, np.ndarray))


def _image_list(data) -> list:
    images = list(data) if isinstance(data, (list, tuple)) else [data]
    for img in images:
        if not (_is_raw(img) or isinstance(img, Tensor)):
            raise InvalidArgumentError(f"multi_modal_data images of a text prompt must be PIL images, HWC uint8 "
                                       f"numpy arrays or [3, H, W] tensors, got {type(img).__name__}")
    return images


class ProcessorPrompts:
    """Turns text + raw-image prompts into id + tensor prompts for one model."""

    def __init__(self, directory: str | Path | None, model):
        self.directory = None if directory is None else Path(directory)
        self.model = model
        self._processor = None

    def missing(self) -> str | None:
        """Why this model cannot process raw images (``None`` when it can)."""
        name = type(self.model).__name__
        if not getattr(self.model, "multimodal", False):
            return "this model takes no images (it has no vision tower)"
        if name not in IMAGE_INPUTS:
            return f"no processor prompts for {name} (supported: {', '.join(IMAGE_INPUTS)})"
        if self.directory is None:
            return ("a built-in tiny model has no HF processor; pass prompt_token_ids with the image placeholder "
                    "tokens and pre-processed image tensors")
        if not has_processor_files(self.directory):
            return (f"model directory {str(self.directory)!r} has no HF processor ({' / '.join(PROCESSOR_FILES)} "
                    "with tokenizer files); pass prompt_token_ids with pre-processed image tensors")
        return None

    @property
    def processor(self):
        if self._processor is None:
            from transformers import AutoProcessor

            try:
                self._processor = AutoProcessor.from_pretrained(str(self.directory), local_files_only=True)
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise InvalidArgumentError(f"cannot load the HF processor of {str(self.directory)!r}: {e}") from e
        return self._processor

    def _run(self, fn, **kwargs) -> Mapping:
        try:
            return fn(**kwargs, return_tensors="pt")
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidArgumentError(f"the model's HF processor rejected the prompt: {e}") from e

    def apply(self, prompt):
        """``prompt`` as the engine's id + tensor prompt when it holds text or raw images, else unchanged."""
        if not isinstance(prompt, Mapping) or not prompt.get("multi_modal_data"):
            return prompt
        mm = prompt["multi_modal_data"]
        has_ids = "prompt_token_ids" in prompt
        data = mm.get("image") if isinstance(mm, Mapping) else None
        if data is None or isinstance(data, Mapping):
            if not has_ids:
                raise InvalidArgumentError("a text prompt's multi_modal_data needs 'image': raw image(s)")
            return prompt  # token ids + the model's own tensors: the existing path checks them
        if has_ids and not any(_is_raw(img) for img in (data if isinstance(data, (list, tuple)) else [data])):
            return prompt  # token ids + pre-processed pixel tensors
        text = prompt.get("prompt")
        if not has_ids and not isinstance(text, str):
            raise InvalidArgumentError(f"prompt must be text with the model's image marker, got {type(text).__name__}")
        why = self.missing()
        if why is not None:
            raise InvalidArgumentError(f"cannot process raw images: {why}")
        images = _image_list(data)
        to_inputs = IMAGE_INPUTS[type(self.model).__name__]
        if has_ids:  # the ids already hold the placeholders: only the image part runs
            out = self._run(self.processor.image_processor, images=[images])
            ids = prompt["prompt_token_ids"]
        else:
            out = self._run(self.processor, text=text, images=[images])
            ids = out["input_ids"][0].tolist()
        return {**prompt, "prompt_token_ids": ids, "prompt": text,
                "multi_modal_data": {**mm, "image": to_inputs(out)}}
