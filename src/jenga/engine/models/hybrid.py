"""Base of the families whose layers mix attention and recurrent-state mixers.

A decoder layer may hold a paged attention module, a state mixer (any module with
``state_shapes()``: Mamba-1/2, Gated DeltaNet), or both (Falcon-H1).  The model runner asks
:meth:`layer_attention` (``None`` for layers without attention) and :meth:`layer_states`
(``None`` for layers without state) to bind each layer to its cache group's views.
"""

from __future__ import annotations

from jenga.engine.models.common import LayerAttention, PagedAttentionBase, PagedCausalLM


class HybridCausalLM(PagedCausalLM):
    def layer_attention(self) -> list[LayerAttention | None]:
        return [next((m.info for m in layer.modules() if isinstance(m, PagedAttentionBase)), None)
                for layer in self.model.layers]

    def layer_states(self) -> list[tuple[tuple[int, ...], ...] | None]:
        """Per decoder layer: the shapes of its state tensors (conv, SSM), or None."""
        return [next((m.state_shapes() for m in layer.modules() if hasattr(m, "state_shapes")), None)
                for layer in self.model.layers]
