"""The decoder skeleton every text family shares: embed → layers → final norm (→ head, in
:class:`~jenga.engine.models.common.PagedCausalLM`).

A family provides its decoder layer and its quirks; the loop is written once here.

* ``layer(i)`` builds decoder layer ``i`` (all ``config.num_hidden_layers`` of them).
* ``norm``: the final norm module; ``embed_name`` / ``norm_name``: the attribute names Hugging
  Face gives the embedding and the final norm (``embed_tokens`` / ``embeddings``, ``norm`` /
  ``final_layernorm`` / ``norm_f``), so ``load_state_dict`` of HF weights works unchanged.
* ``rotary``: the RoPE module shared by the layers (registered as ``rotary_emb``); its cos / sin
  table is computed once per step and handed to every layer.  None for families without RoPE.
* ``embed_multiplier``: a scalar the token embeddings are multiplied by (Falcon-H1, Granite);
  Gemma's ``sqrt(hidden)`` scale goes through :meth:`DecoderModel.embed`.

Layers are called as ``layer(x, *self.layer_args(positions, ctx))``; the default arguments are
``(cos_sin, ctx)``.  A family whose layers want other arguments (no RoPE at all, positions for
Llama-4's NoPE layers, one table per layer type for Gemma) overrides :meth:`layer_args`.
``embeds = (rows, values)`` replaces the (scaled) embeddings of some rows of the step with other
vectors (a VLM's image features), for every family alike.

:meth:`DecoderModel.with_rope` builds the skeleton of a RoPE family (one rotary for all layers, a
final RMSNorm); :class:`PreNormDecoderLayer` is the pre-norm residual layer most families share.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from jenga.engine.attention import ForwardContext
from jenga.engine.models.common import RMSNorm, Rotary, cfg, head_dim_of, rope_parameters


class DecoderModel(nn.Module):
    """See the module docstring."""

    def __init__(self, config, layer: Callable[[int], nn.Module], norm: nn.Module, *,
                 rotary: nn.Module | None = None, embed_name: str = "embed_tokens", norm_name: str = "norm",
                 embed_multiplier: float | None = None, vocab_size: int | None = None):
        super().__init__()
        self.rotary_emb = rotary
        self._embed_name, self._norm_name = embed_name, norm_name
        setattr(self, embed_name, nn.Embedding(vocab_size or config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(layer(i) for i in range(config.num_hidden_layers))
        setattr(self, norm_name, norm)
        self.embed_multiplier = embed_multiplier

    @classmethod
    def with_rope(cls, config, layer: Callable[[int, nn.Module], nn.Module], *,
                  rotary_cls: Callable[[dict, int], nn.Module] | None = Rotary, offset: bool = False,
                  eps: float = 1e-6, **kwargs) -> DecoderModel:
        """The skeleton of a RoPE family: one ``rotary_cls(rope_parameters, head_dim)`` shared by
        ``layer(i, rotary)`` for every layer (``rotary_cls`` None: no RoPE, ``rotary`` is None) and a
        final RMSNorm of ``rms_norm_eps`` (``eps`` when the config has none; ``offset``: Gemma's
        ``1 + w``).  ``kwargs`` go to the constructor (``norm_name``, ``embed_multiplier``)."""
        rotary = None if rotary_cls is None else rotary_cls(rope_parameters(config), head_dim_of(config))
        norm = RMSNorm(config.hidden_size, cfg(config, "rms_norm_eps", eps), offset=offset)
        return cls(config, lambda i: layer(i, rotary), norm, rotary=rotary, **kwargs)

    @property
    def embedding(self) -> nn.Embedding:
        """The token embedding, whatever HF calls it (what a tied ``lm_head`` shares)."""
        return getattr(self, self._embed_name)

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embedding(input_ids)
        return x if self.embed_multiplier is None else x * self.embed_multiplier

    def layer_args(self, positions: Tensor, ctx: ForwardContext) -> tuple:
        """What every layer gets after the hidden states: ``(cos_sin, ctx)`` by default."""
        return (None if self.rotary_emb is None else self.rotary_emb.cos_sin(positions)), ctx

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext,
                embeds: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = self.embed(input_ids)
        if embeds is not None:
            rows, values = embeds
            x = x.index_copy(0, rows, values.to(x.dtype))
        args = self.layer_args(positions, ctx)
        for layer in self.layers:
            x = layer(x, *args)
        return getattr(self, self._norm_name)(x)


class PreNormDecoderLayer(nn.Module):
    """The pre-norm residual layer most families share::

        x = x + mix(input_layernorm(x), *args)
        x = x + ff(ff_norm(x))

    ``parts``: the family's modules under their HF names, mixer(s) first (``self_attn``, ``mamba``,
    ``linear_attn``), the feed-forward ``ff`` last (``mlp``, ``feed_forward``); they are registered
    in that order, then the two RMSNorms ``input_layernorm`` and ``ff_norm``
    (``post_attention_layernorm`` or ``pre_ff_layernorm``; ``offset``: Gemma's ``1 + w``), which
    is the order :func:`~jenga.engine.models.weights.randomize_` fills parameters in (so a tiny
    random model keeps its weights).  ``args`` are what :meth:`DecoderModel.layer_args` gives, ``ctx`` last.  :meth:`mix`
    runs ``self_attn(h, *args)``, or in a layer without attention its state mixer ``mamba(h, ctx)``;
    a family with another mixer (Gated DeltaNet) overrides it, and one with scaled residuals or
    two mixers each added to the residual (Granite, Falcon-H1) overrides :meth:`forward`.
    """

    def __init__(self, hidden: int, eps: float, *, offset: bool = False,
                 ff_norm: str = "post_attention_layernorm", **parts: nn.Module):
        super().__init__()
        for name, part in parts.items():
            setattr(self, name, part)
        self._ff, self._ff_norm = next(reversed(parts)), ff_norm
        self.input_layernorm = RMSNorm(hidden, eps, offset=offset)
        setattr(self, ff_norm, RMSNorm(hidden, eps, offset=offset))

    def mix(self, h: Tensor, *args) -> Tensor:
        return self.self_attn(h, *args) if hasattr(self, "self_attn") else self.mamba(h, args[-1])

    def forward(self, x: Tensor, *args) -> Tensor:
        x = x + self.mix(self.input_layernorm(x), *args)
        return x + getattr(self, self._ff)(getattr(self, self._ff_norm)(x))
