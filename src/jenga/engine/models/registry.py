"""Map HF ``model_type`` / ``architectures`` to the paged model classes.

Multimodal wrappers (``gemma3``, ``llama4``, ``mllama``) resolve to their text decoder: :func:`text_config`
returns the ``text_config`` sub-config, which is what the model classes take.  The classes in
:data:`VISION_CLASSES` (``Gemma3ForConditionalGeneration``, ``MllamaForConditionalGeneration``; ``mllama``
by model type too, as its decoder needs the vision states) run the vision tower as well and
take the whole config.
"""

from __future__ import annotations

import torch

from jenga.engine.models.bamba import BambaForCausalLM
from jenga.engine.models.common import PagedCausalLM
from jenga.engine.models.falcon_h1 import FalconH1ForCausalLM
from jenga.engine.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM
from jenga.engine.models.gemma3_vision import Gemma3ForConditionalGeneration
from jenga.engine.models.granite_moe_hybrid import GraniteMoeHybridForCausalLM
from jenga.engine.models.jamba import JambaForCausalLM
from jenga.engine.models.llama import LlamaForCausalLM
from jenga.engine.models.llama4 import Llama4ForCausalLM
from jenga.engine.models.mllama import MllamaForConditionalGeneration
from jenga.engine.models.nemotron_h import NemotronHForCausalLM
from jenga.engine.models.qwen import QwenForCausalLM
from jenga.engine.models.qwen3_next import Qwen3NextForCausalLM
from jenga.errors import UnsupportedArchitectureError

MODEL_TYPES: dict[str, type[PagedCausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "ministral": LlamaForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "llama4_text": Llama4ForCausalLM,
    "llama4": Llama4ForCausalLM,
    "mllama": MllamaForConditionalGeneration,
    "jamba": JambaForCausalLM,
    "nemotron_h": NemotronHForCausalLM,
    "falcon_h1": FalconH1ForCausalLM,
    "qwen3_next": Qwen3NextForCausalLM,
    "qwen2": QwenForCausalLM,
    "qwen3": QwenForCausalLM,
    "qwen3_moe": QwenForCausalLM,
    "bamba": BambaForCausalLM,
    "granitemoehybrid": GraniteMoeHybridForCausalLM,
}

ARCHITECTURES: dict[str, type[PagedCausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "MinistralForCausalLM": LlamaForCausalLM,
    "Gemma2ForCausalLM": Gemma2ForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "Gemma3ForConditionalGeneration": Gemma3ForConditionalGeneration,
    "Llama4ForCausalLM": Llama4ForCausalLM,
    "Llama4ForConditionalGeneration": Llama4ForCausalLM,
    "MllamaForConditionalGeneration": MllamaForConditionalGeneration,
    "JambaForCausalLM": JambaForCausalLM,
    "NemotronHForCausalLM": NemotronHForCausalLM,
    "FalconH1ForCausalLM": FalconH1ForCausalLM,
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen2ForCausalLM": QwenForCausalLM,
    "Qwen3ForCausalLM": QwenForCausalLM,
    "Qwen3MoeForCausalLM": QwenForCausalLM,
    "BambaForCausalLM": BambaForCausalLM,
    "GraniteMoeHybridForCausalLM": GraniteMoeHybridForCausalLM,
}

#: model types whose checkpoints wrap the text decoder (weights live under a prefix).
MULTIMODAL_TYPES = frozenset({"gemma3", "llama4", "mllama"})

#: classes that run the vision tower too: they take the whole (multimodal) config.
VISION_CLASSES: frozenset[type] = frozenset({Gemma3ForConditionalGeneration, MllamaForConditionalGeneration})


def text_config(config):
    """The decoder config: ``config.text_config`` for multimodal wrappers, else ``config``."""
    if getattr(config, "model_type", None) in MULTIMODAL_TYPES and getattr(config, "text_config", None) is not None:
        return config.text_config
    return config


def model_class(config) -> type[PagedCausalLM]:
    """Class for a HF config: ``architectures[0]`` first, then ``model_type``;
    ``UnsupportedArchitectureError`` (a ``ValueError``) if unknown."""
    for arch in getattr(config, "architectures", None) or ():
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    raise UnsupportedArchitectureError(f"unsupported model {model_type!r} (architectures {getattr(config, 'architectures', None)}); "
                     f"supported model types: {sorted(MODEL_TYPES)}")


def build_model(config, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> PagedCausalLM:
    """Instantiate the paged model for ``config`` (uninitialised weights) on ``device`` in ``dtype``."""
    cls = model_class(config)
    with torch.device(device):
        model = cls(config if cls in VISION_CLASSES else text_config(config))
    return model.to(dtype=dtype).eval()
