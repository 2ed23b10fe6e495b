"""Gemma-3 with images (``Gemma3ForConditionalGeneration``, HF parameter names).

``model.vision_tower`` (SigLIP) + ``model.multi_modal_projector`` (average pool to
``mm_tokens_per_image`` tokens, RMSNorm, projection to the text width) + ``model.language_model``
(the paged Gemma-3 text decoder of :mod:`jenga.engine.models.gemma`) + ``lm_head`` (tied).

The vision tower and the projector hold no cache, so they are transformers' own modules built
from the config (``AutoModel.from_config`` as HF builds them): the engine's work is where their
output lives (jenga's vision-embedding pages, :mod:`jenga.engine.vision_cache`), not the
encoder arithmetic.  :meth:`encode_images` maps ``pixel_values [N, 3, H, W]`` to
``[N, mm_tokens_per_image, hidden]``; the decoder's forward takes ``embeds = (rows, values)``
that replace the token embeddings of the step's image-placeholder tokens, as HF's
``masked_scatter`` does (after the ``sqrt(hidden)`` scaling of the text embeddings).

Attention over image tokens is causal, which is what HF computes for ``input_ids`` +
``pixel_values`` without ``token_type_ids`` (vLLM's prompt convention).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import PagedCausalLM, softcap
from jenga.engine.models.gemma import GemmaModel


class Gemma3VisionInner(nn.Module):
    """``model.*`` of HF's ``Gemma3ForConditionalGeneration``."""

    def __init__(self, config):
        super().__init__()
        from transformers import AutoModel
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(config)
        self.language_model = GemmaModel(config.text_config, gemma3=True)

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                embeds: tuple[Tensor, Tensor] | None = None) -> Tensor:
        return self.language_model(input_ids, positions, ctx, embeds=embeds)


class Gemma3ForConditionalGeneration(PagedCausalLM):
    """Gemma-3 VLM: SigLIP tower + projector + paged Gemma-3 text decoder."""

    multimodal = True

    def __init__(self, config):
        super().__init__(config.text_config)
        self.mm_config = config
        self.image_token_id = int(config.image_token_id)
        self.mm_tokens_per_image = int(config.mm_tokens_per_image)
        vc = config.vision_config
        self.image_shape = (int(vc.num_channels), int(vc.image_size), int(vc.image_size))
        self.model = Gemma3VisionInner(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.final_logit_softcapping = getattr(config.text_config, "final_logit_softcapping", None)
        if getattr(config.text_config, "tie_word_embeddings", True):
            self.lm_head.weight = self.model.language_model.embed_tokens.weight

    @property
    def embed_dim(self) -> int:
        return int(self.config.hidden_size)

    def encode_images(self, pixel_values: Tensor) -> Tensor:
        """``[N, 3, H, W]`` -> ``[N, mm_tokens_per_image, hidden]`` (HF's ``get_image_features``)."""
        dtype = self.model.multi_modal_projector.mm_input_projection_weight.dtype
        out = self.model.vision_tower(pixel_values=pixel_values.to(dtype)).last_hidden_state
        return self.model.multi_modal_projector(out)

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None, embeds: tuple[Tensor, Tensor] | None = None) -> Tensor:
        hidden = self.model(input_ids, positions, ctx, embeds=embeds)
        if logits_indices is not None:
            hidden = hidden[logits_indices]
        return softcap(self.lm_head(hidden), self.final_logit_softcapping)

    def layer_attention(self):
        return [layer.self_attn.info for layer in self.model.language_model.layers]


@torch.no_grad()
def init_vision_weights(model: Gemma3ForConditionalGeneration) -> None:
    """Random-weight init helper: LayerNorms of the vision tower around 1 (they multiply)."""
    for mod in model.model.vision_tower.modules():
        if isinstance(mod, nn.LayerNorm):
            mod.weight.add_(1.0)
