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

from jenga.sim.simulator import SimConfig, Simulator, build_setup
from jenga.sim.workloads import get_workload
from jenga.specs import (
    AttentionSpec,
    CrossAttentionSpec,
    ModelSpec,
    SlidingWindowSpec,
)


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
    spec = ModelSpec.from_hf_config(model)
    attn = [g for g in spec.groups if isinstance(g.spec, AttentionSpec)]
    big = max(g.spec.bytes_per_token() for g in attn)
    paged = (text + image) * sum(g.num_layers for g in attn) * big
    ideal = sum(g.num_layers * g.spec.bytes_per_token() * (image if isinstance(g.spec, CrossAttentionSpec)
                                                           else text) for g in attn)
    return 1.0 - ideal / paged


def swa_waste(model: str) -> float:
    """(SWA share of per-token KV bytes) x (1 - W / max_len): paper §3.2, at the longest request."""
    spec = ModelSpec.from_hf_config(model)
    attn = [g for g in spec.groups if isinstance(g.spec, AttentionSpec)]
    total = sum(g.num_layers * g.spec.bytes_per_token() for g in attn)
    return sum(g.num_layers * g.spec.bytes_per_token() / total * (1 - g.spec.window / spec.max_model_len)
               for g in attn if isinstance(g.spec, SlidingWindowSpec))


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

#: Activation reserve per GPU implied by paper Table 2 (vLLM's profile run at a 1M max length).
LLAMA4_RESERVE = int(17.5e9)


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


_PREFILL = "all at t=0: makespan is mostly prefill compute, which no manager changes; decodes ride in mixed steps"
#: (label, model, tp, workload, requests full/quick, paper H100 ratio, why ours differs)
THROUGHPUT_CASES = (
    ("mllama", "llama-3.2-11b-vision", 1, "mmmu-pro", (80, 12), 2.67 / 1.56, _PREFILL),
    ("Gemma-3", "gemma-3-12b", 1, "arxiv-qa", (20, 4), 0.25 / 0.18, _PREFILL),
    ("Ministral", "ministral-8b", 1, "arxiv-qa", (20, 4), 0.3042 / 0.2025, _PREFILL),
    ("Llama 4", "llama-4-scout", 8, "arxiv-qa", (24, 4), 1.16 / 0.67,
     "prefill-paced: ~14 requests in flight whatever the memory (1M-token max-model-len not modelled)"),
    ("Jamba", "jamba-1.5-mini", 4, "mmlu-pro", (300, 30), 10.38 / 7.47,
     "batch capped by max_num_seqs, not memory (short prompts, 196 GB KV); v0's static Mamba cache not modelled"),
    ("Llama 3.1", "llama-3.1-70b", 4, "mmlu-pro", (200, 20), 9.21 / 9.23, "homogeneous control: same pages"),
)


def throughput(quick: bool) -> list[Row]:
    rows, ours, paper = [], [], []
    for label, model, tp, wl, counts, p, why in THROUGHPUT_CASES:
        base = "static" if label == "Jamba" and _has("static") else "paged"
        n = counts[1] if quick else counts[0]
        r = _sim(model, wl, n, (base, "jenga"), tp=tp, record_every=4)
        ratio = r["jenga"]["throughput_req_s"] / r[base]["throughput_req_s"]
        ours.append(ratio)
        paper.append(p)
        rows.append(Row("throughput H100", f"{label} ({model} TP{tp}, {wl}, {n} req) jenga/{base}",
                        f"{p:.3f}x", f"{ratio:.3f}x",
                        f"jenga {r['jenga']['throughput_req_s']:.3f} vs {r[base]['throughput_req_s']:.3f} req/s, "
                        f"max batch {r['jenga']['max_concurrent']} vs {r[base]['max_concurrent']}; {why}",
                        value=ratio))
    g = math.exp(sum(map(math.log, ours)) / len(ours))
    gp = math.exp(sum(map(math.log, paper)) / len(paper))
    rows.append(Row("throughput H100", "geometric mean (these 6 models)", f"1.46x (8 models; {gp:.2f}x on these 6)",
                    f"{g:.2f}x", "no character/PyramidKV models (not in the catalog); roofline cost model",
                    value=g))
    return rows


def prefix_hits(quick: bool) -> list[Row]:
    arts = (4, 2) if quick else (12, 3)
    r = _sim("ministral-8b", "arxiv-multiq", arts[0] * arts[1], ("paged", "jenga"), record_every=4,
             num_articles=arts[0], questions_per_article=arts[1], order="shuffled", rate=0.25)
    hp, hj = r["paged"]["prefix_hit_rate"], r["jenga"]["prefix_hit_rate"]
    ratio = hj / hp if hp else math.inf
    return [Row("prefix caching", f"arxiv-multiq hit rate jenga/paged (Ministral, {arts[0]} articles x {arts[1]}, "
                                  "shuffled, 0.25 req/s)",
                "1.60x", f"{ratio:.2f}x",
                f"hit rate {hj:.3f} vs {hp:.3f}; no common-prefix ('important') SWA pool in jenga.prefix, so "
                "plain LRU drops an old article's full-layer pages before newer out-of-window SWA pages",
                value=ratio)]


def spec_decoding(quick: bool) -> list[Row]:
    n = 4 if quick else 12
    r = _sim("ministral-8b", "spec-decode", n, ("paged", "jenga"), draft="llama-3.2-1b", base="arxiv-qa",
             record_every=4)
    ratio = r["jenga"]["throughput_req_s"] / r["paged"]["throughput_req_s"]
    return [Row("spec decoding", f"Ministral-8B + Llama-3.2-1B draft, k=3, a=0.7 ({n} arxiv-qa req) jenga/max",
                f"{0.896 / 0.793:.3f}x (0.896 vs 0.793)", f"{ratio:.3f}x",
                f"{r['jenga']['throughput_req_s']:.3f} vs {r['paged']['throughput_req_s']:.3f} req/s; paper's "
                "workload for this pair is not stated (ours: arxiv-qa)", value=ratio)]


SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "closed form": lambda quick: closed_form(),
    "Llama-4 context": lambda quick: llama4_context(),
    "Ministral waste": ministral_waste,
    "decode batch": decode_batch,
    "throughput": throughput,
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
