"""The paper's figure 14 (end-to-end throughput) on the artifact's own settings, per model.

Settings are the commands of heheda12345/Jenga-SOSP25-AE ``figure14.md``; the paper's req/s are
its ``logs/figure14.csv``.  Every run sends all requests at t = 0 with ``--seed 55555
--ignore-eos`` at ``gpu_memory_utilization`` 0.9.  Two baselines:

* ``v0`` — the vLLM ~0.6.3 fork with chunked prefill off (Llama 3.2 Vision, Ministral, Jamba):
  :class:`jenga.sched.v0_scheduler.V0Scheduler`, token budget ``max(max_model_len, 2048)``;
  its memory is the ``paged`` manager (every layer keeps every token at one page size), except
  Jamba, whose "vLLM" cell is the fork's static partition (``static``).  Jenga runs in the same
  fork, so it gets the same scheduler.
* ``v1`` — vLLM v1 with ``--disable-hybrid-allocator`` (Gemma-3, Llama 4, Llama 3.1): chunked
  prefill, 8,192 tokens and 1,024 sequences per step on H100; ``paged`` memory (sliding-window
  and chunked layers stored as full attention).

Step times use the efficiency table of :mod:`jenga.sim.calibration` for the case's engine
(:data:`~jenga.sim.calibration.FITTED` unless told otherwise).  The activation reserve is vLLM's profile run (:mod:`jenga.sim.activation`) at the run's token
budget; Llama 4's is the 17.5 GB/GPU that paper Table 2 implies for its 1M max-model-len.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from jenga.sched.v0_scheduler import v0_token_budget
from jenga.sim.activation import profile_reserve_bytes
from jenga.sim.artifact_workloads import reusable_prefix_share
from jenga.sim.calibration import FITTED, Calibration
from jenga.sim.gpu import DEFAULT_ACTIVATION_RESERVE_BYTES
from jenga.sim.setup import build_setup
from jenga.sim.simulator import SimConfig, Simulator
from jenga.sim.workloads import get_workload

SEED = 55555
#: Activation reserve per GPU implied by paper Table 2 (vLLM's profile run at a 1M max length).
LLAMA4_RESERVE = int(17.5e9)
#: vLLM v1 serving defaults (``EngineArgs``): GPUs with >= 70 GiB get 8,192 tokens and 1,024
#: sequences per step, smaller ones (L4) 2,048 and 256.
V1_H100_BATCHED_TOKENS, V1_H100_MAX_SEQS = 8192, 1024
V1_SMALL_BATCHED_TOKENS, V1_SMALL_MAX_SEQS = 2048, 256
@dataclass(frozen=True)
class Case:
    """One bar pair of figure 14: a model, its workload and the baseline the paper used."""

    label: str
    model: str
    tp: int
    workload: str
    workload_kw: dict
    quick_kw: dict  # replaces workload_kw entries under --quick
    baseline: str  # manager name
    engine: str  # "v0" (chunked prefill off) or "v1" (--disable-hybrid-allocator)
    max_num_seqs: int
    max_model_len: int  # vLLM's --max-model-len (the v0 token budget; prompts must fit)
    prefix_caching: tuple[bool, bool]  # (baseline, jenga), as the artifact's flags
    paper: dict = field(default_factory=dict)  # gpu -> (jenga req/s, vLLM req/s or None for OOM)
    reserve_bytes: int | None = None  # per GPU; None = profile run at the token budget
    weight_dtype: dict = field(default_factory=dict)  # gpu -> weight dtype (L4 runs use fp8)
    notes: dict = field(default_factory=dict)  # gpu (or "*" for every GPU) -> a note on that GPU's row
    eager: bool = False  # the artifact's --enforce-eager (no CUDA graphs)
    #: where the artifact's fork may cache a state (Mamba) prefix: multiples of --linear-chunk-size
    state_cache_alignment: int | None = None

    @property
    def calibration_engine(self) -> str:
        """The row of :class:`jenga.sim.calibration.Calibration` this case's engine uses."""
        return "v0-eager" if self.eager else self.engine

    def note(self, gpu: str) -> str:
        return "; ".join(n for n in (self.notes.get("*"), self.notes.get(gpu)) if n)

    @property
    def scheduler(self) -> str:
        return "v0" if self.engine == "v0" else "chunked"

    @property
    def budget(self) -> int:
        return v0_token_budget(self.max_model_len) if self.engine == "v0" else V1_H100_BATCHED_TOKENS

    def baseline_label(self) -> str:
        return (f"vLLM v0 no chunked prefill ({self.baseline})" if self.engine == "v0"
                else f"vLLM v1 --disable-hybrid-allocator ({self.baseline})")


_ARXIV = "arxiv-multiq"
CASES: tuple[Case, ...] = (
    Case("mllama", "llama-3.2-11b-vision", 1, "mmmu-pro", dict(num_requests=200, output_len=200),
         dict(num_requests=16), "paged", "v0", 52, 131072, (False, False),
         {"h100-80gb": (2.67, 1.56), "l4-24gb": (0.69, 0.32)}, weight_dtype={"l4-24gb": "fp8"}, eager=True),
    Case("Gemma-3", "gemma-3-12b", 1, _ARXIV,
         dict(num_articles=10, questions_per_article=4, order="shuffled", max_prompt_len=90000),
         dict(num_articles=2, max_prompt_len=16384), "paged", "v1", V1_H100_MAX_SEQS, 131072, (True, True),
         {"h100-80gb": (0.25, 0.18), "l4-24gb": (0.14, 0.09)}, weight_dtype={"l4-24gb": "fp8"},
         notes={"l4-24gb": "L4 precision not stated (ours: fp8 weights)"}),
    Case("Ministral", "ministral-8b", 1, _ARXIV,
         dict(num_articles=8, questions_per_article=4, order="shuffled", max_prompt_len=80000),
         dict(num_articles=2, max_prompt_len=16384), "paged", "v0", 256, 131072, (True, True),
         {"h100-80gb": (0.3042, 0.2025), "l4-24gb": (0.08, None)}, weight_dtype={"l4-24gb": "fp8"}),
    Case("Llama 4", "llama-4-scout", 8, _ARXIV, dict(num_articles=40, questions_per_article=4, order="shuffled"),
         dict(num_articles=2, max_prompt_len=32768), "paged", "v1", V1_H100_MAX_SEQS, 1_000_000, (True, True),
         {"h100-80gb": (1.16, 0.67)}, reserve_bytes=LLAMA4_RESERVE),
    # Prefix caching off for both: the baseline's server command has no --enable-prefix-caching
    # (figure14.md line 153) and the Jenga bar's result file is jamba-tp4.sys-no-cache.mmlu.json
    # (line 165), although its server command (line 163) carries the flag.  Had caching been on,
    # the artifact's fork keeps Mamba states only at --linear-chunk-size (1024-token) boundaries
    # (branch vllm-v0-jenga, vllm/core/block_v3/custom_block.py, get_prefix_cache_alignment),
    # not at each 5-shot prefix's end as jenga.core.policy.state does.
    Case("Jamba", "jamba-1.5-mini", 4, "mmlu-pro-5shot", dict(num_requests=1000, output_len=20),
         dict(num_requests=64), "static", "v0", 1024, 8192, (False, False),
         {"h100-80gb": (10.38, 7.47)}, eager=True, state_cache_alignment=1024,
         notes={"*": "prefix caching off for both (the artifact's Jenga result file is "
                     "jamba-tp4.sys-no-cache.mmlu.json, figure14.md)"}),
    Case("Llama 3.1", "llama-3.1-70b", 4, "mmlu-pro-5shot", dict(num_requests=200, output_len=256),
         dict(num_requests=24), "paged", "v1", V1_H100_MAX_SEQS, 131072, (True, True),
         {"h100-80gb": (9.21, 9.23), "l4-24gb": (0.66, 0.66)},
         notes={"*": "output = the 405B reference answers' lengths (unpublished; ours 256)"}),
)
#: L4 runs use the 8B Llama 3.1 (paper §7 table) on one GPU.
L4_MODEL = {"Llama 3.1": ("llama-3.1-8b", 1)}


def paper_ratio(case: Case, gpu: str) -> float | None:
    j, v = case.paper.get(gpu, (None, None))
    return None if j is None or v is None else j / v


def _limits(case: Case, gpu: str, model: str, tp: int) -> tuple[int, int, int, int]:
    """(max_model_len, token budget, max_num_seqs, reserve per GPU) of ``case`` on ``gpu``.

    H100: the artifact's.  L4 (commands not published): vLLM v1's defaults below 70 GiB of GPU
    memory (2,048 tokens, 256 sequences), the flat 2 GiB reserve, and a max-model-len the
    baseline can hold (as a server must, to start)."""
    if gpu == "h100-80gb":
        reserve = case.reserve_bytes
        if reserve is None:
            reserve = profile_reserve_bytes(build_setup(model, gpu, tp, memory_bytes=1).target.hf_config,
                                            case.budget, tp)
        return case.max_model_len, case.budget, case.max_num_seqs, reserve
    from jenga.capacity import max_context_tokens

    st = build_setup(model, gpu, tp, weight_dtype=case.weight_dtype.get(gpu, "bf16"))
    fit = max_context_tokens(Simulator(st).make_manager(case.baseline)) or case.max_model_len
    max_len = min(case.max_model_len, fit - fit // 50)
    if case.engine == "v0":
        return max_len, v0_token_budget(max_len), case.max_num_seqs, DEFAULT_ACTIVATION_RESERVE_BYTES
    return max_len, V1_SMALL_BATCHED_TOKENS, V1_SMALL_MAX_SEQS, DEFAULT_ACTIVATION_RESERVE_BYTES


def run_case(case: Case, gpu: str = "h100-80gb", quick: bool = False, record_every: int = 8,
             prefix_caching: tuple[bool, bool] | None = None, calibration: Calibration = FITTED,
             managers: tuple[str, ...] = (), record_terms: bool = False) -> dict:
    """Simulate the baseline and jenga (and ``managers``) for ``case`` on ``gpu``; returns their
    summaries and the settings.  ``prefix_caching`` overrides the artifact's (baseline, jenga)
    flags (for ablations; extra managers get the baseline's); ``record_terms`` adds
    ``out["terms"][manager]`` (every step's :meth:`CostModel.terms`) and ``out["cost"]``.  A case
    with a ``state_cache_alignment`` adds ``out["reusable_share"]``: the share of the prompt tokens a
    prefix cache could serve on this trace, at each prefix's end and at that alignment."""
    model, tp = L4_MODEL.get(case.label, (case.model, case.tp)) if gpu != "h100-80gb" else (case.model, case.tp)
    max_len, budget, seqs, reserve = _limits(case, gpu, model, tp)
    st = build_setup(model, gpu, tp, activation_reserve_bytes=reserve, weight_dtype=case.weight_dtype.get(gpu, "bf16"),
                     efficiency=calibration.cost_kwargs(case.calibration_engine))
    kw = dict(case.workload_kw, **(case.quick_kw if quick else {}))
    max_len = min(max_len, st.target.max_model_len)
    if kw.get("max_prompt_len") or (case.workload == "arxiv-multiq" and max_len < case.max_model_len):
        kw["max_prompt_len"] = min(kw.get("max_prompt_len") or max_len, max_len)
    w = get_workload(case.workload, seed=SEED, max_len=max_len, **kw)
    out = {"model": model, "tp": tp, "reserve_bytes": reserve, "memory_bytes": st.memory_bytes,
           "requests": len(w), "budget": budget, "max_num_seqs": seqs, "max_model_len": max_len,
           "calibration": calibration.name, "terms": {}, "cost": st.cost}
    caching = case.prefix_caching if prefix_caching is None else prefix_caching
    runs = {case.baseline: caching[0], "jenga": caching[1]}
    runs.update({m: caching[0] for m in managers if m not in runs})
    for name, cache in runs.items():
        cfg = SimConfig(max_num_batched_tokens=budget, max_num_seqs=seqs, scheduler=case.scheduler,
                        enable_prefix_caching=cache, seed=SEED, record_every=record_every, record_terms=record_terms)
        res = Simulator(st, cfg).run(w, name)
        out[name] = res.summary()
        if record_terms:
            out["terms"][name] = res.step_terms
    b, j = out[case.baseline], out["jenga"]
    out["ratio"] = (j["throughput_req_s"] / b["throughput_req_s"]) if b["throughput_req_s"] else math.inf
    if case.state_cache_alignment:
        out["reusable_share"] = (reusable_prefix_share(w), reusable_prefix_share(w, case.state_cache_alignment))
    return out
