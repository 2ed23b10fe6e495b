"""The paper's headline numbers (``shared/reference/paper.md`` §7), recomputed.

Each check returns :class:`Row` records: what, the paper's figure, ours, and a one-line
reason when they differ.  Closed forms use the catalog specs' bytes per token per group;
capacities use :mod:`jenga.capacity` on the real managers; the rest run the simulator
(:mod:`jenga.sim.simulator`) on reduced request counts (``quick`` shrinks them further, for
tests).  Baseline: ``paged`` (vLLM v0 max page; for Gemma-3/Llama-4/Llama-3.1 the paper's v1
"vLLM" is ``--disable-hybrid-allocator``, which stores every layer as full attention too),
except Jamba, whose "vLLM" cell is the static partition (paper §7) — ``static`` when available.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from jenga.core.specs import ModelSpec
from jenga.sim.costing import group_costs
from jenga.sim.figure14 import LLAMA4_RESERVE, SEED
from jenga.sim.setup import build_setup
from jenga.sim.simulator import SimConfig, Simulator
from jenga.sim.workloads import get_workload


@dataclass(slots=True)
class Row:
    section: str
    what: str
    paper: str
    ours: str
    note: str = ""
    value: float | None = None  # ours, as a number (for tests and --json)

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------- closed form

def mllama_waste(model: str = "llama-3.2-11b-vision", text: int = 43, image: int = 6193) -> float:
    """Paged (every layer stores text + image tokens at the largest per-layer size) vs ideal
    (self-attention layers: text; cross-attention layers: image), paper §3.2."""
    attn = [c for c in group_costs(ModelSpec.from_hf_config(model)) if c.bytes_per_token]  # attention groups
    big = max(c.bytes_per_token // c.num_layers for c in attn)
    paged = (text + image) * sum(c.num_layers for c in attn) * big
    ideal = sum(c.bytes_per_token * (image if c.kind == "cross" else text) for c in attn)
    return 1.0 - ideal / paged


def swa_waste(model: str) -> float:
    """(SWA share of per-token KV bytes) x (1 - W / max_len): paper §3.2, at the longest request."""
    spec = ModelSpec.from_hf_config(model)
    attn = [c for c in group_costs(spec) if c.bytes_per_token]  # attention groups (per-kind cost records)
    total = sum(c.bytes_per_token for c in attn)
    return sum(c.bytes_per_token / total * (1 - c.window / spec.max_model_len) for c in attn if c.kind == "sliding")


def closed_form() -> list[Row]:
    rows = [Row("closed form", "mllama MMMU-pro waste (T=43, I=6193)", "79.6%", "", value=mllama_waste())]
    for model, label, paper in (("gemma-2-9b", "Gemma-2 SWA waste", "25%"),
                                ("ministral-8b", "Ministral SWA waste", "56.25%"),
                                ("gemma-3-27b", "Gemma-3-27B SWA waste", "83.2%"),
                                ("gemma-3-12b", "Gemma-3-12B SWA waste", "82.7%")):
        rows.append(Row("closed form", label, paper, "", value=swa_waste(model)))
    for r in rows:  # to the paper's printed precision
        digits = len(r.paper.rstrip("%").partition(".")[2])
        r.ours = f"{100 * r.value:.{digits}f}%"
        if r.ours != r.paper:
            r.note = "catalog config differs from the paper's rounding"
    return rows


# ------------------------------------------------------------------------------------ capacity

def llama4_context() -> list[Row]:
    from jenga.baselines import make_manager
    from jenga.capacity import max_context_tokens

    rows = []
    for gpu, paper in (("h100-80gb", ("1.3M", "5.2M")), ("h200-141gb", ("3.7M", "14.7M"))):
        st = build_setup("llama-4-scout", gpu, 8, activation_reserve_bytes=LLAMA4_RESERVE)
        for name, p in zip(("paged", "jenga"), paper, strict=True):
            n = max_context_tokens(make_manager(name, st.target, st.memory_bytes))
            rows.append(Row("Llama-4 context", f"Scout 8x{gpu.split('-')[0].upper()} {name}", p,
                            f"{n / 1e6:.2f}M", f"KV budget {st.memory_bytes / 1e9:.1f} GB (17.5 GB/GPU reserve, "
                            "as Table 2 implies)", value=float(n)))
    return rows


# ---------------------------------------------------------------------------------- simulations

def _sim(model: str, workload: str, n: int, managers, *, tp: int = 1, draft: str | None = None,
         record_every: int = 1, **wkw) -> dict[str, dict]:
    from jenga.capacity import max_context_tokens

    st = build_setup(model, "h100-80gb", tp, draft=draft)
    sim = Simulator(st, SimConfig(record_every=record_every))
    # every manager must hold one request alone (as a vLLM max-model-len that passes start-up)
    fit = min((c for m in managers if (c := max_context_tokens(sim.make_manager(m))) is not None),
              default=1 << 40)
    max_len = min(st.target.max_model_len, 131072, fit - fit // 50)
    w = get_workload(workload, num_requests=n, max_len=max_len, **wkw)
    return {m: sim.run(w, m).summary() for m in managers}


def _has(name: str) -> bool:
    import importlib.util
    return name in ("jenga", "paged") or importlib.util.find_spec(f"jenga.baselines.{name}") is not None


def ministral_waste(quick: bool) -> list[Row]:
    rows = []
    n = 4 if quick else 12
    notes = {"ministral-static": "U(16k, 115k) prompts", "ministral-dynamic": "mean swept 16k -> 115k"}
    for wl in ("ministral-static", "ministral-dynamic"):
        r = _sim("ministral-8b", wl, n, ("paged", "jenga"), record_every=2)
        for m, p in (("paged", "38.2%"), ("jenga", "0.04%")):
            v = r[m]["waste_frac_mean"]
            rows.append(Row("Ministral waste", f"{wl} {m} ({n} req)", p, f"{100 * v:.2f}%",
                            f"traces unpublished; ours: {notes[wl]}, 150 out", value=v))
    return rows


def decode_batch(quick: bool) -> list[Row]:
    n = 8 if quick else 20
    r = _sim("ministral-8b", "decode-batch-20", n, ("paged", "jenga"))
    out = []
    for m, p, steps in (("paged", "2.63", "~600"), ("jenga", "5.39", "~300")):
        out.append(Row("decode batch", f"Ministral decode-batch-20 {m}", f"{p} ({steps} steps)",
                       f"{r[m]['decode_batch_mean']:.2f} ({r[m]['steps']} steps)",
                       "roofline cost model; our scheduler (v1-style mixed chunked prefill) admits the next "
                       "request sooner than v0", value=r[m]["decode_batch_mean"]))
    return out


def _geo(xs) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def _why(case, r: dict, gpu: str, quick: bool) -> str:
    """The main measured cause of a > 15 % gap: an ablation run, and the absolute speeds."""
    from jenga.sim.figure14 import run_case

    b, j = r[case.baseline], r["jenga"]
    pj, pv = case.paper[gpu]
    parts = [f"abs req/s ours {j['throughput_req_s']:.3g}/{b['throughput_req_s']:.3g} vs paper {pj}/{pv} "
             f"({j['throughput_req_s'] / pj:.2f}x the paper's jenga, {b['throughput_req_s'] / pv:.2f}x its baseline)"]
    if abs(j["prefix_hit_rate"] - b["prefix_hit_rate"]) > 0.1 and not quick:
        off = run_case(case, gpu, quick, prefix_caching=(False, False))
        parts.append(f"with prefix caching off for both: {off['ratio']:.2f}x (prefill tokens computed "
                     f"{off['jenga']['prefill_tokens'] / 1e6:.2f}M vs {off[case.baseline]['prefill_tokens'] / 1e6:.2f}M, "
                     f"preemptions {off['jenga']['preemptions']} vs {off[case.baseline]['preemptions']})")
    parts.append(f"max batch {j['max_concurrent']} vs {b['max_concurrent']}, prefix hits {j['prefix_hit_rate']:.2f} "
                 f"vs {b['prefix_hit_rate']:.2f}, prefill tokens computed {j['prefill_tokens'] / 1e6:.2f}M vs "
                 f"{b['prefill_tokens'] / 1e6:.2f}M, preemptions {j['preemptions']} vs {b['preemptions']}")
    return "; ".join(parts)


def throughput_rows(gpu: str, quick: bool) -> list[Row]:
    """Figure 14 on ``gpu``: one row per catalog model on the artifact's settings, then the
    geometric means (over models whose paper baseline did not OOM)."""
    from jenga.sim.figure14 import CASES, paper_ratio, run_case

    tag = "H100" if gpu.startswith("h100") else "L4"
    rows, ours, paper = [], [], []
    for case in CASES:
        if gpu not in case.paper:
            continue
        r = run_case(case, gpu, quick)
        p = paper_ratio(case, gpu)
        b, j = r[case.baseline], r["jenga"]
        wl = f"{case.workload} {r['requests']} req"
        note = (f"{r['model']} TP{r['tp']}, {wl}, max_num_seqs {r['max_num_seqs']}, {r['budget']} tokens/step, "
                f"reserve {r['reserve_bytes'] / 1e9:.1f} GB/GPU; vs {case.baseline_label()}; "
                f"jenga {j['throughput_req_s']:.3f} vs {b['throughput_req_s']:.3f} req/s")
        if case.note(gpu):
            note += f"; {case.note(gpu)}"
        if "reusable_share" in r:
            end, aligned = r["reusable_share"]
            note += (f"; had its Jenga run with prefix caching, as its server command says (figure14.md), its fork "
                     f"keeps states at {case.state_cache_alignment}-token multiples only: at most {aligned:.0%} of "
                     f"the prompt tokens reusable on this trace, against {end:.0%} at each prefix's end (ours)")
        if p is None:
            note += "; paper's baseline OOM: not in the mean"
        else:
            ours.append(r["ratio"])
            paper.append(p)
            if abs(r["ratio"] / p - 1) > 0.15:
                note += "; >15% off: " + _why(case, r, gpu, quick)
        rows.append(Row(f"throughput {tag}", f"{case.label} ({r['model']}, {wl}) jenga/{case.baseline} "
                        f"[{case.engine}]", "OOM" if p is None else f"{p:.3f}x", f"{r['ratio']:.3f}x", note,
                        value=r["ratio"]))
    full = {"h100-80gb": "1.46x (8 models)", "l4-24gb": "1.65x (5 models)"}[gpu]
    rows.append(Row(f"throughput {tag}", f"geometric mean ({len(ours)} catalog models)",
                    f"{full}; {_geo(paper):.2f}x on these", f"{_geo(ours):.2f}x",
                    "no character / PyramidKV models (not in the catalog)", value=_geo(ours)))
    return rows


def throughput(quick: bool) -> list[Row]:
    return throughput_rows("h100-80gb", quick)


def prefix_hits(quick: bool) -> list[Row]:
    arts = (4, 2) if quick else (12, 3)
    r = _sim("ministral-8b", "arxiv-multiq", arts[0] * arts[1], ("paged", "jenga"), record_every=4,
             num_articles=arts[0], questions_per_article=arts[1], order="shuffled", rate=0.25, seed=SEED)
    hp, hj = r["paged"]["prefix_hit_rate"], r["jenga"]["prefix_hit_rate"]
    ratio = hj / hp if hp else math.inf
    return [Row("prefix caching", f"arxiv-multiq hit rate jenga/paged (Ministral, {arts[0]} articles x {arts[1]}, "
                                  "shuffled, 0.25 req/s)",
                "1.60x", f"{ratio:.2f}x",
                f"hit rate {hj:.3f} vs {hp:.3f}; the artifact publishes no figure-17 commands (ours: its "
                "arxiv documents, seed 55555 shuffle); no common-prefix ('important') SWA pool in jenga.core.evict, so "
                "plain LRU drops an old article's full-layer pages before newer out-of-window SWA pages",
                value=ratio)]


def spec_decoding(quick: bool) -> list[Row]:
    """Figure 20's Ministral row on the artifact's settings (``figure20.md``): Ministral-8B with a
    Llama-3.2-1B-shaped draft, 3 speculative tokens at a fixed 0.7 acceptance, chunked prefill
    off, 32 arXiv prompts of one question each (subset ``ministralrep1``, no length cap), 150
    output tokens, no prefix caching; ``vllm-max`` = the large model's page for both (paged)."""
    from jenga.sched.v0_scheduler import v0_token_budget
    from jenga.sim.activation import profile_reserve_bytes

    n = 4 if quick else 32
    probe = build_setup("ministral-8b", memory_bytes=1)
    budget = v0_token_budget(probe.target.max_model_len)
    st = build_setup("ministral-8b", draft="llama-3.2-1b",
                     activation_reserve_bytes=profile_reserve_bytes(probe.target.hf_config, budget))
    w = get_workload("spec-decode", base="arxiv-multiq", num_articles=n, questions_per_article=1, order="shuffled",
                     seed=SEED, max_len=st.target.max_model_len, num_spec_tokens=3, acceptance=0.7,
                     max_prompt_len=16384 if quick else None)
    cfg = SimConfig(max_num_batched_tokens=budget, scheduler="v0", enable_prefix_caching=False, seed=SEED,
                    record_every=8)
    r = {m: Simulator(st, cfg).run(w, m).summary() for m in ("paged", "jenga")}
    ratio = r["jenga"]["throughput_req_s"] / r["paged"]["throughput_req_s"]
    return [Row("spec decoding", f"Ministral-8B + Llama-3.2-1B draft, k=3, a=0.7 ({n} arxiv prompts, v0) jenga/max",
                f"{0.896 / 0.793:.3f}x (0.896 vs 0.793)", f"{ratio:.3f}x",
                f"{r['jenga']['throughput_req_s']:.3f} vs {r['paged']['throughput_req_s']:.3f} req/s, max batch "
                f"{r['jenga']['max_concurrent']} vs {r['paged']['max_concurrent']}; artifact figure20.md settings "
                "(eager mode and the fixed-acceptance sampler are not modelled)", value=ratio)]


SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "closed form": lambda quick: closed_form(),
    "Llama-4 context": lambda quick: llama4_context(),
    "Ministral waste": ministral_waste,
    "decode batch": decode_batch,
    "throughput": throughput,
    "throughput L4": lambda quick: throughput_rows("l4-24gb", quick),
    "prefix caching": prefix_hits,
    "spec decoding": spec_decoding,
}


def reproduce(quick: bool = False, sections=None, progress: Callable[[str], None] | None = None) -> list[Row]:
    """All headline rows (or only ``sections``, names of :data:`SECTIONS`)."""
    rows: list[Row] = []
    for name, fn in SECTIONS.items():
        if sections and name not in sections:
            continue
        if progress:
            progress(name)
        rows.extend(fn(quick))
    return rows
