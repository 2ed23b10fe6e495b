"""Speculative decoding inside vLLM with and without jenga: vLLM's own acceptance counters.

Needs the ``jenga[vllm]`` extra (``make test`` installs it into ``.venv``); runs on CPU:

    .venv/bin/python benchmarks/vllm_spec_acceptance.py [--markdown]

Tiny random-weight models of ``tests/vllm_support.py``, greedy, 16 new tokens per request, the
workloads of the vLLM tests: ``first`` + four ``shared`` prompts (one 150-token prefix) with
ample memory, then ``pressure`` (eight prompts over two 200-token documents) at a budget that
preempts (128 of vLLM's blocks for Gemma-3, 24 for Llama + draft / EAGLE / EAGLE-3 and for MiMo).  Rows:

* ``ngram``: n-gram proposals (k = 3, lookup 1..3 tokens) on the tiny Gemma-3 (5 sliding : 1 full);
* ``draft``: a separate draft model (the tiny Llama's weights plus noise 0.01, k = 3) on the tiny
  Llama; with jenga the draft's layers live in jenga's pool next to the target's;
* ``eagle``: a one-layer EAGLE head on the tiny Llama (k = 3; random quality, so vLLM rejects most of
  its proposals), its layer in jenga's pool likewise;
* ``eagle3``: a one-layer EAGLE-3 head on the tiny Llama over three of its hidden states, with a draft
  vocabulary of 3/4 of the target's (k = 3; built to mostly repeat the last token), in jenga's pool;
* ``mtp``: a tiny MiMo target (Qwen2 layers) whose one multi-token-prediction layer is the drafter
  (k = 3, the layer reused for each step), the MTP layer's KV in jenga's pool.

Per row and engine: draft tokens proposed, accepted, acceptance rate (accepted / proposed, from
vLLM's ``spec_decode_num_*`` counters), preemptions, and whether jenga's greedy tokens equal
stock's.  Every figure is a count: independent of the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

MAX_TOKENS = 16
K = 3
ROWS = ("ngram", "draft", "eagle", "eagle3", "mtp")


def run_row(method: str, root: Path) -> list[dict]:
    from vllm_support import (
        allow_engines_after_numba,
        close,
        draft_dir,
        eagle3_dir,
        eagle_dir,
        engine,
        greedy,
        mimo_dir,
        model_dir,
        scheduler,
        spec_stats,
        workloads,
    )

    allow_engines_after_numba()
    if method == "ngram":
        path, tight = model_dir("gemma3", root), 128
        spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    elif method == "draft":
        path, tight = model_dir("llama", root), 24
        spec = {"model": draft_dir(path, root), "num_speculative_tokens": K}
    elif method in ("eagle", "eagle3"):
        path, tight = model_dir("llama", root), 24
        head = (eagle_dir if method == "eagle" else eagle3_dir)(path, root)
        spec = {"method": method, "model": head, "num_speculative_tokens": K}
    elif method == "mtp":
        path, tight = mimo_dir(root), 24
        spec = {"method": "mtp", "num_speculative_tokens": K}
    else:
        raise SystemExit(f"unknown row {method!r}: {', '.join(ROWS)}")
    w = workloads()
    sets = {"ample": w["first"] + w["shared"][:4], "tight": w["pressure"]}
    rows, ref = [], {}
    for jenga in (False, True):
        for budget, prompts in sets.items():
            kw = dict(num_blocks=tight, max_model_len=320) if budget == "tight" else {}
            llm = engine(path, jenga=jenga, speculative_config=spec, disable_log_stats=False, **kw)
            before = spec_stats(llm)
            out = greedy(llm, prompts, max_tokens=MAX_TOKENS)
            after = spec_stats(llm)
            drafted = after["draft_tokens"] - before.get("draft_tokens", 0)
            accepted = after["accepted_tokens"] - before.get("accepted_tokens", 0)
            if not jenga:
                ref[budget] = out
            rows.append(dict(method=method, budget=budget, engine="vLLM + jenga" if jenga else "vLLM",
                             drafted=drafted, accepted=accepted, rate=accepted / drafted if drafted else 0.0,
                             preemptions=scheduler(llm).num_preemptions if jenga else None,
                             equal=(out == ref[budget]) if jenga else None))
            close(llm)
    return rows


def render(rows: list[dict], markdown: bool) -> str:
    head = ["method", "budget", "engine", "draft tokens", "accepted", "acceptance", "jenga preemptions",
            "tokens equal stock"]
    lines = []
    for r in rows:
        lines.append([r["method"], r["budget"], r["engine"], str(r["drafted"]), str(r["accepted"]),
                      f"{100 * r['rate']:.1f} %", "" if r["preemptions"] is None else str(r["preemptions"]),
                      "" if r["equal"] is None else ("yes" if r["equal"] else "NO")])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(x) + " |" for x in lines])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    return "\n".join("  ".join(c.ljust(wd) for c, wd in zip(x, widths, strict=True)) for x in [head, *lines])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated: {', '.join(ROWS)}")
    args = ap.parse_args(argv)
    rows = []
    with TemporaryDirectory() as tmp:
        for method in args.rows.split(","):
            rows += run_row(method, Path(tmp))
    print(render(rows, args.markdown))


if __name__ == "__main__":
    main()
