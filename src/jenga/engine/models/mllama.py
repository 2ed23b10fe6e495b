"""Llama-3.2-Vision (``MllamaForConditionalGeneration``, HF parameter names) on jenga pages.

``model.vision_model`` (tiled ViT with local + global encoders) + ``model.multi_modal_projector``
(one linear layer to the text width) + ``model.language_model`` (Llama decoder whose layers in
``cross_attention_layers`` attend to the image instead of the text) + ``lm_head``.

The vision model and the projector hold no cache: they are transformers' own modules built from
the config.  :meth:`MllamaForConditionalGeneration.encode_images` maps one prompt's images to
the projected vision states ``[N, tiles * patches, hidden]``; :meth:`cross_kv` projects them into
one cross-attention layer's K/V (``k_norm`` on K, as HF does), which the engine stores in jenga's
cross-attention pages once per image (:mod:`jenga.engine.cross_attention`).

Decoder: self-attention layers are the engine's paged Llama layers (text tokens only).  A
cross-attention layer attends the step's text tokens of requests with images to their images'
K/V through :class:`~jenga.engine.cross_attention.CrossStep` (HF's masks: tiles, image ranges,
``full_text_row_masked_out_mask`` zeroing the MLP of rows that see no image).  Tokens of
requests without images skip cross-attention layers, as HF skips them without vision states.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import GatedMLP, PagedCausalLM, RMSNorm, Rotary, cfg, rope_parameters
from jenga.engine.models.decoder import DecoderModel
from jenga.engine.models.llama import LlamaDecoderLayer


class MllamaTextCrossAttention(nn.Module):
    """q/k/v/o projections + per-head q/k RMSNorm (HF names); no RoPE."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        h, d, eps = config.hidden_size, self.head_dim, cfg(config, "rms_norm_eps", 1e-5)
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, eps)
        self.k_norm = RMSNorm(d, eps)

    def kv(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """``[L, hidden]`` vision states -> ``(k, v) [L, H_kv, D]`` (what the cross pages hold)."""
        L = states.shape[0]
        k = self.k_norm(self.k_proj(states).view(L, self.num_kv_heads, self.head_dim))
        return k, self.v_proj(states).view(L, self.num_kv_heads, self.head_dim)

    def forward(self, x: Tensor, cross) -> Tensor:
        q = self.q_norm(self.q_proj(x).view(x.shape[0], self.num_heads, self.head_dim))
        out = cross.attend(self.layer_idx, q, scale=self.scale)
        return self.o_proj(out.reshape(out.shape[0], -1))


class MllamaCrossAttentionDecoderLayer(nn.Module):
    """Tanh-gated cross-attention and MLP (HF's ``MllamaCrossAttentionDecoderLayer``)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        eps = cfg(config, "rms_norm_eps", 1e-5)
        self.cross_attn = MllamaTextCrossAttention(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.cross_attn_attn_gate = nn.Parameter(torch.zeros(1))
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, cfg(config, "hidden_act", "silu"))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.cross_attn_mlp_gate = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor, cos_sin, ctx: ForwardContext) -> Tensor:  # no RoPE: cos_sin unused
        cross = ctx.cross
        if cross is None or cross.rows.numel() == 0:
            return x  # no request of the step shows an image: HF skips the layer
        h = x[cross.rows]
        h = h + self.cross_attn_attn_gate.tanh() * self.cross_attn(self.input_layernorm(h), cross)
        m = self.mlp(self.post_attention_layernorm(h)) * cross.row_sees_image[:, None].to(h.dtype)
        h = h + self.cross_attn_mlp_gate.tanh() * m
        return x.index_copy(0, cross.rows, h)


class MllamaTextModel(DecoderModel):
    """``model.language_model``: the decoder skeleton (embeddings of ``vocab + 8`` rows) over Llama
    layers and, at ``config.cross_attention_layers``, cross-attention layers (which read the step's
    images from ``ctx.cross``)."""

    def __init__(self, config):
        cross = tuple(config.cross_attention_layers or ())
        rotary = Rotary(rope_parameters(config), config.hidden_size // config.num_attention_heads)
        super().__init__(config, lambda i: MllamaCrossAttentionDecoderLayer(config, i) if i in cross
                         else LlamaDecoderLayer(config, i, None, rotary),
                         RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", 1e-5)), rotary=rotary,
                         vocab_size=config.vocab_size + 8)
        self.cross_attention_layers = cross


class MllamaInner(nn.Module):
    """``model.*`` of HF's ``MllamaForConditionalGeneration``."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.mllama.modeling_mllama import MllamaVisionModel

        self.vision_model = MllamaVisionModel._from_config(config.vision_config)
        self.language_model = MllamaTextModel(config.text_config)
        self.multi_modal_projector = nn.Linear(config.vision_config.vision_output_dim,
                                               config.text_config.hidden_size, bias=True)

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext, cross=None) -> Tensor:
        return self.language_model(input_ids, positions, ctx if cross is None else replace(ctx, cross=cross))


class MllamaForConditionalGeneration(PagedCausalLM):
    """Llama-3.2-Vision: tiled vision encoder + projector + paged decoder with cross-attention layers."""

    multimodal = True

    def __init__(self, config):
        super().__init__(config.text_config)
        self.mm_config = config
        self.image_token_id = int(config.image_token_index)
        vc = config.vision_config
        self.max_num_tiles = int(vc.max_num_tiles)
        self.tile_shape = (int(vc.num_channels), int(vc.image_size), int(vc.image_size))
        self.patches_per_tile = (int(vc.image_size) // int(vc.patch_size)) ** 2 + 1
        self.supported_aspect_ratios = [tuple(r) for r in vc.supported_aspect_ratios]
        self.model = MllamaInner(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)

    @property
    def cross_attention_layers(self) -> tuple[int, ...]:
        return self.model.language_model.cross_attention_layers

    @property
    def input_vocab_size(self) -> int:
        """Token ids the embeddings take: the text vocabulary + 8 (``<|image|>`` is one of them)."""
        return int(self.model.language_model.embed_tokens.num_embeddings)

    @property
    def tokens_per_image(self) -> int:
        """Cross-attention tokens of one image: every tile (padding tiles too, as HF keeps them) x patches."""
        return self.max_num_tiles * self.patches_per_tile

    def attach_images(self, seq, data) -> None:
        """Parse a prompt's ``multi_modal_data["image"]`` (see :mod:`jenga.engine.mllama_images`)."""
        from jenga.engine.mllama_images import attach_mllama_images

        attach_mllama_images(seq, data, self)

    def encode_images(self, pixel_values: Tensor, aspect_ratio_ids: Tensor, aspect_ratio_mask: Tensor) -> Tensor:
        """``[N, tiles, 3, H, W]``, ``[N]``, ``[N, tiles]`` -> projected states ``[N, tiles * patches, hidden]``."""
        dtype = self.model.multi_modal_projector.weight.dtype
        out = self.model.vision_model(pixel_values=pixel_values[None].to(dtype),
                                      aspect_ratio_ids=aspect_ratio_ids[None],
                                      aspect_ratio_mask=aspect_ratio_mask[None]).last_hidden_state
        states = self.model.multi_modal_projector(out[0])  # [N, tiles, patches, hidden]
        return states.reshape(states.shape[0], -1, states.shape[-1])

    def cross_kv(self, layer: int, states: Tensor) -> tuple[Tensor, Tensor]:
        """K/V ``[L, H_kv, D]`` of cross-attention layer ``layer`` for one image's states ``[L, hidden]``."""
        return self.model.language_model.layers[layer].cross_attn.kv(states)

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                logits_indices: Tensor | None = None, cross=None) -> Tensor:
        hidden = self.model(input_ids, positions, ctx, cross=cross)
        if logits_indices is not None:
            hidden = hidden[logits_indices]
        return self.lm_head(hidden)

    def layer_attention(self):
        """Self-attention layers' paged K/V; ``None`` for cross-attention layers (their K/V are the
        image's, kept in the cross group by :mod:`jenga.engine.cross_attention`)."""
        return [None if i in self.cross_attention_layers else layer.self_attn.info
                for i, layer in enumerate(self.model.language_model.layers)]


@torch.no_grad()
def init_mllama_weights(model: MllamaForConditionalGeneration, seed: int = 0) -> None:
    """Random-weight init helper, after :func:`~jenga.engine.tiny.init_random_weights` (which puts
    every ``*norm.weight`` around 1): the vision model's ``layernorm_pre`` / ``layernorm_post``
    around 1 too, and the tanh gates (one element each) in ``[0.5, 1.5]`` so the image visibly
    changes the text (HF initialises the gates at 0)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(("layernorm_pre.weight", "layernorm_post.weight")):
            p.add_(1.0)
        elif p.numel() == 1:
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))
