"""Lets vLLM 0.32's Gemma-3 multimodal model import on a machine without torchvision.

``vllm/model_executor/models/gemma3_mm.py`` imports ``Gemma3ImageProcessor`` from
``transformers.models.gemma3.image_processing_gemma3`` and uses the name only as an annotation
of local variables.  That transformers module is the torchvision backend of the processor and
imports torchvision, whose CPU build for this install's torch is not reachable from this
machine's package index (the index only offers CUDA builds, whose ``_C.so`` needs
``libtorch_cuda.so``; the Makefile uninstalls torchvision).  transformers ships the same
processor on its PIL backend (``image_processing_pil_gemma3.Gemma3ImageProcessorPil``), which is
what a checkpoint saved with that processor loads anyway.

:func:`install` puts a meta-path finder first that answers that one module name, only while
torchvision is not installed, with a module exposing the PIL processor's names plus
``Gemma3ImageProcessor`` bound to ``Gemma3ImageProcessorPil``.  Nothing is loaded until that
module is imported.  ``sitecustomize.py`` next to this file installs it in every Python process
started with this folder on ``PYTHONPATH`` (vLLM inspects a model class in a subprocess the
first time it sees it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

TARGET = "transformers.models.gemma3.image_processing_gemma3"
PIL_MODULE = "transformers.models.gemma3.image_processing_pil_gemma3"


class _PilLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # the default module object

    def exec_module(self, module) -> None:
        pil = importlib.import_module(PIL_MODULE)
        module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
        module.Gemma3ImageProcessor = pil.Gemma3ImageProcessorPil
        module.__all__ = ["Gemma3ImageProcessor", *getattr(pil, "__all__", ())]


class Gemma3PilFinder(importlib.abc.MetaPathFinder):
    """Answers :data:`TARGET` with the PIL processor while torchvision is missing; defers otherwise."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET or importlib.util.find_spec("torchvision") is not None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _PilLoader())


def install() -> bool:
    """Put the finder first on ``sys.meta_path`` (once).  True when torchvision is missing, i.e.
    when the finder will answer."""
    if not any(isinstance(f, Gemma3PilFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, Gemma3PilFinder())
    return importlib.util.find_spec("torchvision") is None
