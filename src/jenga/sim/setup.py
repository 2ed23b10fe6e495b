"""A target (+ draft) model on a GPU for the simulator: its specs, cost models and KV byte budget
(:func:`build_setup`)."""

from __future__ import annotations

from dataclasses import dataclass

from jenga.core.specs import ModelSpec
from jenga.sim.costing import StepCoster
from jenga.sim.gpu import CostModel, get_gpu, memory_budget
from jenga.sim.model_cost import ModelCost


@dataclass
class Setup:
    """A target (+ draft) model on a GPU: specs, cost models and the KV budget."""

    model: ModelSpec  # the manager's model: target, or target.combine(draft)
    target: ModelSpec
    cost: CostModel
    coster: StepCoster
    memory_bytes: int
    draft: ModelSpec | None = None
    draft_cost: CostModel | None = None
    draft_coster: StepCoster | None = None
    gpu: str = ""
    tp: int = 1


def model_cost(spec: ModelSpec, weight_dtype: str = "bf16") -> ModelCost:
    """``ModelCost`` of a catalog model, read straight from its (complete) ``config.json``."""
    return ModelCost.from_hf_config(spec.hf_config, name=spec.name, dtype=weight_dtype)


def _coster(spec: ModelSpec, mc: ModelCost) -> StepCoster:
    return StepCoster(spec, mc.num_attention_heads, mc.head_dim)


def build_setup(model: str, gpu: str = "h100-80gb", tp: int = 1, *, draft: str | None = None,
                dtype: str = "bf16", tokens_per_page: int = 16, utilization: float = 0.9,
                activation_reserve_bytes: int | None = None, memory_bytes: int | None = None,
                weight_dtype: str = "bf16", efficiency: dict | None = None) -> Setup:
    """Whole-model specs (``tp = 1`` shapes) and budget = ``memory_budget(gpu, weights) x tp``
    (target + draft weights), unless ``memory_bytes`` is given.  ``dtype`` is the KV cache's,
    ``weight_dtype`` the target's weights' (e.g. ``fp8`` for vLLM ``--quantization fp8``);
    ``efficiency``: :class:`CostModel` keyword arguments (``Calibration.cost_kwargs``), both models."""
    g = get_gpu(gpu)
    target = ModelSpec.from_hf_config(model, dtype=dtype, tokens_per_page=tokens_per_page)
    tcost = model_cost(target, weight_dtype)
    weights = tcost.weight_bytes
    d_spec = d_cost = None
    if draft:
        d_spec = ModelSpec.from_hf_config(draft, dtype=dtype, tokens_per_page=tokens_per_page)
        d_cost = model_cost(d_spec)
        weights += d_cost.weight_bytes
    if memory_bytes is None:
        kw = {} if activation_reserve_bytes is None else {"activation_reserve_bytes": activation_reserve_bytes}
        memory_bytes = memory_budget(g, weights, tp=tp, utilization=utilization, **kw) * tp
    combined = target.combine(d_spec) if d_spec is not None else target
    ae = efficiency or {}
    return Setup(combined, target, CostModel(g, tcost, tp=tp, **ae), _coster(target, tcost), memory_bytes, d_spec,
                 CostModel(g, d_cost, tp=tp, **ae) if d_cost else None, _coster(d_spec, d_cost) if d_spec else None,
                 g.name, tp)
