"""The cost model's efficiency table: what the roofline lacks to land near measured req/s.

:class:`jenga.sim.gpu.CostModel` is a roofline (datasheet peaks and bandwidth); real engines
reach a fraction of them and pay fixed costs per step.  :class:`Calibration` is the one table of
those fractions and costs, per *engine* — ``v0`` (the artifact's vLLM ~0.6.3 fork: FlashAttention-2,
chunked prefill off, CUDA graphs for decode), ``v0-eager`` (the same with ``--enforce-eager``, as the
artifact runs Llama 3.2 Vision and Jamba: its kernels are v0's, only the step overhead is its own)
and ``v1`` (vLLM v1: CUDA graphs, FlashAttention-3 on Hopper) — plus two model-kind parameters
shared by every engine.  Nothing is per cell or per
model.  :data:`FITTED` was fitted by ``python -m jenga.sim.fit`` on the measured cells of
the artifact's ``logs/figure14.csv`` (:data:`jenga.sim.fit.MEASURED`); :data:`ROOFLINE` is the
uncalibrated model (the guesses documented on :class:`CostModel`).

===========================  ======================================================================
parameter                    meaning
===========================  ======================================================================
``step_overhead_s``          fixed seconds per engine step (scheduling, input preparation, kernel
                             launches; an eager v0 engine launches every kernel from Python)
``per_seq_overhead_s``       seconds per scheduled sequence (metadata, sampling, detokenizing)
``gemm_efficiency``          share of the weight dtype's dense peak reached by the GEMMs
``attention_efficiency``     share of the bf16 peak reached by the attention kernels
``scan_efficiency``          share of the bf16 peak reached by the state scans (Mamba, Gated DeltaNet;
                             :attr:`ModelCost.scan_flops_per_token`), both engines
``vision_efficiency``        share of peak reached by the vision tower (+ cross-attention K/V), both
                             engines
``bandwidth_efficiency``     share of datasheet HBM bandwidth (not fitted: 0.9)
===========================  ======================================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ENGINES = ("v0", "v0-eager", "v1")


@dataclass(frozen=True)
class EngineEfficiency:
    """The per-engine rows of the table (see the module docstring)."""

    step_overhead_s: float
    per_seq_overhead_s: float
    gemm_efficiency: float
    attention_efficiency: float


@dataclass(frozen=True)
class Calibration:
    """One efficiency table (module docstring); :meth:`cost_kwargs` gives a CostModel's arguments."""

    name: str
    engines: dict[str, EngineEfficiency]
    scan_efficiency: float | None
    vision_efficiency: float | None
    bandwidth_efficiency: float = 0.9
    source: str = field(default="", compare=False)

    def cost_kwargs(self, engine: str) -> dict:
        """Keyword arguments of :class:`jenga.sim.gpu.CostModel` for ``engine`` (``v0`` / ``v1``)."""
        try:
            e = self.engines[engine]
        except KeyError:
            raise ValueError(f"unknown engine {engine!r}; choose one of {sorted(self.engines)}") from None
        return dict(mfu=e.gemm_efficiency, attention_efficiency=e.attention_efficiency,
                    step_overhead_s=e.step_overhead_s, per_seq_overhead_s=e.per_seq_overhead_s,
                    scan_efficiency=self.scan_efficiency, vision_efficiency=self.vision_efficiency,
                    bandwidth_efficiency=self.bandwidth_efficiency)

    def as_dict(self) -> dict:
        return asdict(self)


#: The uncalibrated roofline: CostModel's documented guesses, FlashAttention-2 / -3 shares of
#: peak (35 % / 75 %, the FlashAttention-3 paper's abstract), no scan or tower penalty.
ROOFLINE = Calibration("roofline", {
    "v0": EngineEfficiency(2e-3, 20e-6, 0.6, 0.35),
    "v0-eager": EngineEfficiency(2e-3, 20e-6, 0.6, 0.35),
    "v1": EngineEfficiency(2e-3, 20e-6, 0.6, 0.75),
}, scan_efficiency=None, vision_efficiency=None, source="CostModel's guesses (no fit)")

#: Fitted by ``python -m jenga.sim.fit`` on all modelled cells (its last line; the held-out errors
#: are that command's leave-one-cell-out table, in the README).  ``scan_efficiency`` sits at its
#: bound: Jamba's state scans are too few FLOPs to matter at any plausible share of peak.
FITTED = Calibration("fitted", {
    "v0": EngineEfficiency(0.002555149300785527, 0.00014057903452983954, 0.11664650156819081, 0.869406808755618),
    "v0-eager": EngineEfficiency(0.07199023086072423, 0.00014057903452983954, 0.11664650156819081,
                                 0.869406808755618),
    "v1": EngineEfficiency(0.0027261602425085723, 0.00014057903452983954, 0.2674288835661846, 0.907498880869787),
}, scan_efficiency=0.9990000915589526, vision_efficiency=0.12380117450824195, bandwidth_efficiency=0.9,
    source="jenga.sim.fit on figure14.csv")

CALIBRATIONS = {"fitted": FITTED, "roofline": ROOFLINE}
