"""GPU datasheet constants, the KV memory budget and a roofline step-time model.

* :class:`GPUSpec` / :func:`get_gpu` — public datasheet numbers (dense tensor-core peaks,
  HBM bandwidth, interconnect, host link) for the GPUs of the paper's §7 (H100 80 GB, L4 24 GB,
  H200 141 GB) and GH200 (a host tier over NVLink-C2C).
* :class:`~jenga.sim.model_cost.ModelCost` (in :mod:`jenga.sim.model_cost`) — parameter counts
  and weight bytes estimated from a Hugging Face ``config.json``; the input to :class:`CostModel`.
* :class:`CostModel` — seconds for one engine step:
  ``max(memory time, compute time) + TP all-reduce time + fixed overheads`` where
  memory time = (weights read per GPU + KV bytes read per GPU) / (HBM bandwidth x efficiency)
  and compute time = (2 x active matmul params x tokens + attention FLOPs) / TP / (peak x MFU).
* :func:`memory_budget` — KV-cache bytes per GPU, as vLLM sizes it:
  ``memory x utilization - weights/TP - activation reserve``.

All of it is an approximation meant for *relative* comparisons in a simulator; the
constants are documented where they are defined.  Nothing here knows about the manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jenga.sim.model_cost import ModelCost

# --------------------------------------------------------------------------------------- errors


class UnknownGPUError(KeyError):
    """``get_gpu`` got a name that is not in :data:`GPUS`."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else "unknown GPU"


class ModelDoesNotFitError(ValueError):
    """The weights (plus reserve) leave no room for a KV cache on this GPU / TP degree."""


# ----------------------------------------------------------------------------------------- GPUs

_MIB = 1 << 20


@dataclass(frozen=True)
class GPUSpec:
    """One GPU.  Rates are per GPU, dense (no 2:4 sparsity), in bytes/s and FLOP/s.

    ``memory_bytes`` is the capacity the driver reports (``nvidia-smi`` / ``torch`` total
    memory), which is what vLLM multiplies by ``gpu_memory_utilization``; it is a little
    above the marketing figure in decimal GB.  ``interconnect_bytes_per_s`` is the
    per-direction GPU-to-GPU bandwidth used for tensor-parallel all-reduce, and
    ``allreduce_latency_s`` a rough fixed cost per all-reduce call (NCCL, small messages).

    ``host_link_bytes_per_s`` is the effective per-direction bandwidth between one GPU and host
    memory (the host KV tier's copies): :data:`HOST_LINK_EFFICIENCY` x the datasheet figure of the
    link each GPU sits on -- PCIe Gen5 x16 (64 GB/s per direction) for H100 / H200 SXM in HGX
    hosts, PCIe Gen4 x16 (32 GB/s per direction) for L4 (and A100 PCIe), NVLink-C2C (900 GB/s
    total = 450 GB/s per direction) for GH200.
    """

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    peak_flops_bf16: float
    peak_flops_fp8: float
    interconnect_bytes_per_s: float
    allreduce_latency_s: float
    host_link_bytes_per_s: float = 0.0
    source: str = field(default="", compare=False)

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense peak for the compute dtype: fp8/int8 use the 8-bit peak, everything else bf16."""
        return self.peak_flops_fp8 if dtype in ("fp8", "int8") else self.peak_flops_bf16


#: Share of a host link's datasheet per-direction bandwidth that pinned-memory copies of KV pages
#: reach: 55 GB/s of PCIe Gen5 x16's 64 GB/s, the effective figure host-offload write-ups quote
#: for H100 hosts (a guess for the other links, which get the same ratio).
HOST_LINK_EFFICIENCY = 55 / 64

#: NVIDIA H100 SXM5 80 GB (H100 datasheet): HBM3 3.35 TB/s; 989 TFLOPS dense bf16
#: (1,979 with sparsity); 1,979 TFLOPS dense fp8; NVLink 4 900 GB/s total = 450 GB/s per
#: direction.  Driver-reported memory 81,559 MiB (80 GB marketing).  Paper §7 main GPU.
H100_80GB = GPUSpec("h100-80gb", 81_559 * _MIB, 3.35e12, 989.4e12, 1978.9e12, 450e9, 8e-6,
                    host_link_bytes_per_s=64e9 * HOST_LINK_EFFICIENCY,
                    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5)")

#: NVIDIA L4 24 GB (L4 datasheet): GDDR6 300 GB/s; 121 TFLOPS dense bf16 (242 sparse);
#: 242.5 TFLOPS dense fp8 (485 sparse); PCIe Gen4 x16, 64 GB/s total = 32 GB/s per direction
#: (no NVLink).  Driver-reported memory 23,034 MiB (24 GB marketing).  Paper §7 second GPU.
L4_24GB = GPUSpec("l4-24gb", 23_034 * _MIB, 300e9, 121e12, 242.5e12, 32e9, 20e-6,
                  host_link_bytes_per_s=32e9 * HOST_LINK_EFFICIENCY,
                  source="NVIDIA L4 Tensor Core GPU datasheet")

#: NVIDIA H200 SXM 141 GB (H200 datasheet): HBM3e 4.8 TB/s; same tensor cores as H100 SXM
#: (989 TFLOPS dense bf16, 1,979 dense fp8); NVLink 900 GB/s total.  Driver-reported memory
#: 143,771 MiB (141 GB marketing).  Used for the Llama 4 context-length run (paper Table 2).
H200_141GB = GPUSpec("h200-141gb", 143_771 * _MIB, 4.8e12, 989.4e12, 1978.9e12, 450e9, 8e-6,
                     host_link_bytes_per_s=64e9 * HOST_LINK_EFFICIENCY,
                     source="NVIDIA H200 Tensor Core GPU datasheet (SXM)")

#: NVIDIA GH200 Grace Hopper Superchip, 144 GB HBM3e (GH200 datasheet): 4.9 TB/s; the H100's tensor
#: cores (989 TFLOPS dense bf16, 1,979 dense fp8); NVLink 4 900 GB/s total to other GPUs; the GPU
#: reaches the Grace CPU's LPDDR5X over NVLink-C2C, 900 GB/s total = 450 GB/s per direction.  Memory
#: is the datasheet's 144 GB (decimal): no driver-reported figure is in this table's sources.
GH200_144GB = GPUSpec("gh200-144gb", 144 * 10**9, 4.9e12, 989.4e12, 1978.9e12, 450e9, 8e-6,
                      host_link_bytes_per_s=450e9 * HOST_LINK_EFFICIENCY,
                      source="NVIDIA GH200 Grace Hopper Superchip datasheet (144 GB HBM3e)")

GPUS: dict[str, GPUSpec] = {g.name: g for g in (H100_80GB, L4_24GB, H200_141GB, GH200_144GB)}


def get_gpu(name: str) -> GPUSpec:
    """The :class:`GPUSpec` called ``name`` (case-insensitive); ``UnknownGPUError`` lists the names."""
    try:
        return GPUS[name.lower()]
    except (KeyError, AttributeError):
        raise UnknownGPUError(f"unknown GPU {name!r}; choose one of {sorted(GPUS)}") from None


# ------------------------------------------------------------------------------ memory budget

#: Default activation + CUDA-graph + NCCL reserve per GPU (bytes), for ordinary
#: max-model-len / 8k-token batches.  vLLM measures this with a profile run; a 1M-token
#: profile is much larger — paper Table 2 (Llama 4 Scout, TP8) implies ~17.5 GB on both
#: H100 and H200 given the driver-reported capacities above and ``utilization=0.9``.
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 << 30


def memory_budget(gpu: GPUSpec, weight_bytes: int, tp: int = 1, utilization: float = 0.9,
                  activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES) -> int:
    """KV-cache bytes available **per GPU**: ``memory x utilization - weights/tp - reserve``.

    The whole-model KV budget is ``tp x`` this (heads are split across GPUs).  Raises
    ``ModelDoesNotFitError`` when nothing is left and ``ValueError`` for bad arguments.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if weight_bytes < 0 or activation_reserve_bytes < 0:
        raise ValueError("weight_bytes and activation_reserve_bytes must be non-negative")
    budget = int(gpu.memory_bytes * utilization) - -(-weight_bytes // tp) - activation_reserve_bytes
    if budget <= 0:
        raise ModelDoesNotFitError(
            f"{weight_bytes / 1e9:.1f} GB of weights at TP{tp} + {activation_reserve_bytes / 1e9:.1f} GB "
            f"reserve exceed {utilization:.0%} of {gpu.name} ({gpu.memory_bytes / 1e9:.1f} GB)")
    return budget


# ----------------------------------------------------------------------------------- cost model

#: Columns of :meth:`CostModel.terms`: GEMM, attention, image-tower and state-scan FLOPs (whole
#: model), HBM bytes per GPU, all-reduce seconds, scheduled sequences, 1 for a non-empty step.
TERMS = ("gemm_flops", "attention_flops", "image_flops", "scan_flops", "hbm_bytes_per_gpu", "allreduce_s",
         "num_seqs", "busy")


@dataclass(frozen=True)
class CostModel:
    """Roofline step time of one engine step on ``tp`` GPUs of kind ``gpu``.

    Constants (guesses unless a source is named; none is tuned to a paper result):

    * ``mfu`` = 0.6 — fraction of dense peak FLOPs reached by prefill GEMMs (+ the elementwise
      kernels around them).  Guess; bounded above by the measured "maximum achievable matmul
      FLOPS" of H100 SXM bf16, ~80 % of peak (S. Bekman, *Machine Learning Engineering*, MAMF
      finder table).
    * ``attention_efficiency`` — fraction of peak reached by attention kernels; ``None`` = ``mfu``.
      Public figures: FlashAttention-2 reaches ~35 % of H100 bf16 peak and FlashAttention-3 up
      to 75 % (740 TFLOPS) (Shah et al., *FlashAttention-3*, 2024, abstract); FlashAttention-2
      reaches 50-73 % of A100 peak (Dao, *FlashAttention-2*, 2023, abstract; used for Ada/L4,
      which FlashAttention-3 does not support).  vLLM 0.6.x uses FlashAttention-2, vLLM v1 on
      Hopper FlashAttention-3.
    * ``bandwidth_efficiency`` = 0.9 — fraction of datasheet HBM bandwidth reached by weight
      and KV streaming (guess: memcpy-class kernels).
    * ``step_overhead_s`` = 2 ms — scheduler, input preparation, sampling, launch per step (guess).
    * ``per_seq_overhead_s`` = 20 us — per scheduled sequence (metadata, sampling, detokenize; guess).
    * ``vision_efficiency`` — the vision tower's share of peak; ``None`` = ``mfu``.
    * ``scan_efficiency`` — state scans' (Mamba, Gated DeltaNet) share of bf16 peak; ``None`` = not
      costed (the roofline alone).

    The figure-14 runs replace these guesses by the fitted table of :mod:`jenga.sim.calibration`.

    With ``bandwidth_efficiency=1`` and zero overheads, a batch-1 decode of Llama-3.1-8B on an
    H100 costs 16.06 GB / 3.35 TB/s = 4.8 ms.
    """

    gpu: GPUSpec
    model_info: ModelCost
    tp: int = 1
    mfu: float = 0.6
    bandwidth_efficiency: float = 0.9
    step_overhead_s: float = 2e-3
    per_seq_overhead_s: float = 20e-6
    attention_efficiency: float | None = None
    vision_efficiency: float | None = None
    scan_efficiency: float | None = None

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        for name in ("attention_efficiency", "vision_efficiency", "scan_efficiency"):
            v = getattr(self, name)
            if v is not None and not 0 < v <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {v}")
        if not (0 < self.mfu <= 1 and 0 < self.bandwidth_efficiency <= 1):
            raise ValueError(f"mfu and bandwidth_efficiency must be in (0, 1], got "
                             f"{self.mfu}, {self.bandwidth_efficiency}")
        if self.step_overhead_s < 0 or self.per_seq_overhead_s < 0:
            raise ValueError("overheads must be non-negative")

    def host_copy_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` (whole model, all TP ranks) between the GPUs and host memory in
        one direction: each GPU copies its ``1/tp`` share over its own host link."""
        if nbytes <= 0:
            return 0.0
        return nbytes / self.tp / self.gpu.host_link_bytes_per_s

    def allreduce_time(self, num_tokens: int) -> float:
        """TP all-reduce cost: 2 per layer of ``tokens x hidden`` bf16 activations (ring: 2(t-1)/t)."""
        if self.tp == 1 or num_tokens <= 0:
            return 0.0
        nbytes = num_tokens * self.model_info.hidden_size * 2
        one = self.gpu.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * nbytes / self.gpu.interconnect_bytes_per_s
        return 2 * self.model_info.num_layers * one

    def step_time(self, num_prefill_tokens: int, num_decode_tokens: int, kv_bytes_read: float = 0.0, *,
                  attention_flops: float | None = None, query_lens=None, context_lens=None,
                  num_seqs: int | None = None, num_image_tokens: int = 0) -> float:
        """Seconds for one step that computes ``num_prefill_tokens + num_decode_tokens`` tokens:
        :meth:`time_of` the step's :meth:`terms` (same arguments).  An empty step costs 0."""
        return self.time_of(self.terms(num_prefill_tokens, num_decode_tokens, kv_bytes_read,
                                       attention_flops=attention_flops, query_lens=query_lens,
                                       context_lens=context_lens, num_seqs=num_seqs,
                                       num_image_tokens=num_image_tokens))

    def terms(self, num_prefill_tokens: int, num_decode_tokens: int, kv_bytes_read: float = 0.0, *,
              attention_flops: float | None = None, query_lens=None, context_lens=None,
              num_seqs: int | None = None, num_image_tokens: int = 0) -> np.ndarray:
        """The step's work, independent of every efficiency: :data:`TERMS` as one float array.

        ``kv_bytes_read`` is the whole model's KV (and state) bytes the step reads, over all
        GPUs.  Attention FLOPs are ``attention_flops`` if given, else estimated from
        ``context_lens`` (cached tokens per sequence) and ``query_lens`` (new tokens per sequence;
        default 1 each, i.e. decode) with :meth:`ModelCost.attention_flops`, else 0.
        ``num_seqs`` defaults to ``num_decode_tokens + (1 if num_prefill_tokens else 0)`` and sets
        both the per-sequence overhead and the number of lm_head rows.  ``num_image_tokens`` of
        the prefill tokens are image positions: they cost :meth:`ModelCost.image_flops` and the
        tower's weights, and language-model work only when ``images_in_lm`` (not for
        cross-attention models, whose image positions never enter the decoder).  Every token
        through the language model costs :attr:`ModelCost.scan_flops_per_token` of state scans.
        """
        if num_prefill_tokens < 0 or num_decode_tokens < 0 or kv_bytes_read < 0:
            raise ValueError("token counts and kv_bytes_read must be non-negative")
        if not 0 <= num_image_tokens <= num_prefill_tokens:
            raise ValueError(f"num_image_tokens ({num_image_tokens}) must be within the {num_prefill_tokens} "
                             "prefill tokens")
        if num_prefill_tokens + num_decode_tokens == 0:
            return np.zeros(len(TERMS))
        m = self.model_info
        tokens = num_prefill_tokens + num_decode_tokens - (0 if m.images_in_lm else num_image_tokens)
        if attention_flops is None:
            if context_lens is not None:
                ctx = np.asarray(context_lens)
                q = np.ones_like(ctx) if query_lens is None else query_lens
                attention_flops = m.attention_flops(q, ctx)
            else:
                attention_flops = 0.0
        if num_seqs is None:
            num_seqs = num_decode_tokens + (1 if num_prefill_tokens else 0)
        mem_bytes = (m.weight_bytes_read(tokens, num_image_tokens) + kv_bytes_read) / self.tp
        return np.array([m.matmul_flops(tokens, min(tokens, num_seqs)), attention_flops,
                         m.image_flops(num_image_tokens), m.scan_flops_per_token * tokens, mem_bytes,
                         self.allreduce_time(tokens), num_seqs, 1.0])

    def time_of(self, terms: np.ndarray) -> np.ndarray | float:
        """Seconds of steps whose :meth:`terms` are ``terms`` (one step, or rows of many):
        ``max(compute, memory) + all-reduce + step overhead + per-sequence overhead``, where
        compute = GEMM FLOPs / (peak x mfu) + attention / (bf16 peak x attention efficiency)
        + image tower / (peak x vision efficiency) + state scans / (bf16 peak x scan efficiency)."""
        t = np.asarray(terms, dtype=np.float64)
        gemm, attn, image, scan, mem, allreduce, seqs, busy = (t[..., i] for i in range(len(TERMS)))
        m = self.model_info
        peak = self.gpu.peak_flops(m.dtype) * self.tp
        bf16 = self.gpu.peak_flops_bf16 * self.tp
        attn_eff = self.mfu if self.attention_efficiency is None else self.attention_efficiency
        vis_eff = self.mfu if self.vision_efficiency is None else self.vision_efficiency
        compute = gemm / (peak * self.mfu) + attn / (bf16 * attn_eff) + image / (peak * vis_eff)
        if self.scan_efficiency is not None:
            compute = compute + scan / (bf16 * self.scan_efficiency)
        memory = mem / (self.gpu.hbm_bytes_per_s * self.bandwidth_efficiency)
        out = (np.maximum(compute, memory) + allreduce + self.step_overhead_s + self.per_seq_overhead_s * seqs) * busy
        return float(out) if out.ndim == 0 else out
