"""Ablations behind the README's calibration causes (figure-14 cells outside the goal).

Each section prints what the README's calibration prose cites, on the fitted table
(:data:`jenga.sim.calibration.FITTED`) unless it says otherwise:

* ``mllama``: Llama 3.2 Vision on H100 with the activation reserve raised by 0-25 GB (our
  reserve counts the decoder's profile activations only; vLLM v0's encoder-decoder profile run
  also encodes ``max_num_seqs`` dummy images of the most tiles): req/s, max batch and preemptions
  of paged, static and jenga, and jenga / paged.  A sensitivity, not a fit: nothing here is used
  by the simulator.
* ``gemma``: Gemma-3 on H100 as the artifact ran it, with caching off for both, and with both
  capped at paged's batch (``max_num_seqs`` 4 and 8).
* ``jamba``: Jamba's two cells under one table each — fitted on every cell, and on every cell but
  one of Jamba's — against the held-out table's pairing of two tables (needs the recorded cells of
  ``python -m jenga.sim.fit``: ``--cache F`` reads or writes them).

Usage: ``python benchmarks/calibration_causes.py [--only mllama|gemma|jamba] [--cache F]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
from dataclasses import replace

from jenga.sim.calibration import FITTED
from jenga.sim.figure14 import CASES, run_case

KEYS = ("throughput_req_s", "max_concurrent", "preemptions", "prefill_tokens", "prefix_hit_rate")


def _case(label: str):
    return next(c for c in CASES if c.label == label)


def _row(tag: str, r: dict, managers) -> str:
    parts = [f"{m} {r[m]['throughput_req_s']:.3f} req/s (batch {r[m]['max_concurrent']}, "
             f"{r[m]['preemptions']} preemptions, {r[m]['prefill_tokens'] / 1e6:.2f}M prefill, "
             f"hits {r[m]['prefix_hit_rate']:.2f})" for m in managers]
    return f"{tag}: " + "; ".join(parts) + f"; jenga / {managers[0]} {r['ratio']:.3f}x"


def mllama(extras=(0, 5, 10, 15, 20, 25)) -> None:
    case = _case("mllama")
    base = run_case(case, "h100-80gb", managers=("static",))
    print("mllama H100 (paper: vLLM 1.56, static 1.6, jenga 2.67 req/s, jenga / vLLM 1.712x)")
    for gb in extras:
        r = base if gb == 0 else run_case(replace(case, reserve_bytes=int(base["reserve_bytes"] + gb * 1e9)),
                                          "h100-80gb", managers=("static",))
        print(_row(f"  reserve {r['reserve_bytes'] / 1e9:.1f} GB (KV {r['memory_bytes'] / 1e9:.1f} GB)", r,
                   ("paged", "static", "jenga")))


def gemma() -> None:
    case = _case("Gemma-3")
    print("Gemma-3 H100 (paper: vLLM 0.18, jenga 0.25 req/s, 1.389x)")
    print(_row("  artifact flags", run_case(case), ("paged", "jenga")))
    print(_row("  caching off for both", run_case(case, prefix_caching=(False, False)), ("paged", "jenga")))
    for seqs in (4, 8):
        print(_row(f"  max_num_seqs {seqs} for both", run_case(replace(case, max_num_seqs=seqs)), ("paged", "jenga")))


def jamba(cache: str | None) -> None:
    from jenga.sim.fit import Cell, fit, record

    if cache and os.path.exists(cache):
        with open(cache, "rb") as f:
            cells = [Cell(**d) for d in pickle.load(f)]
    else:
        cells = record()
        if cache:
            with open(cache, "wb") as f:
                pickle.dump([vars(c) for c in cells], f)
    idx = [i for i, c in enumerate(cells) if c.case == "Jamba"]
    print("Jamba H100 (paper: static = vLLM 7.47, jenga 10.38 req/s, 1.390x)")

    def show(tag, table):
        got = {cells[i].column: cells[i].req_s(table) for i in idx}
        print(f"  {tag}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items())
              + f" req/s, jenga / static {got['jenga'] / got['vllm']:.3f}x")
    show("table fitted on every cell", fit(cells))
    for i in idx:
        show(f"table fitted without {cells[i].key}", fit(cells[:i] + cells[i + 1:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("mllama", "gemma", "jamba"), action="append")
    ap.add_argument("--cache", help="pickle of the fit's recorded cells (jamba section)")
    a = ap.parse_args(argv)
    only = a.only or ("mllama", "gemma", "jamba")
    print(f"calibration: {FITTED.name}")
    if "mllama" in only:
        mllama()
    if "gemma" in only:
        gemma()
    if "jamba" in only:
        jamba(a.cache)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
