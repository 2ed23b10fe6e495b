"""Llama-3.2-Vision in the engine: jenga's cross-attention pages vs vLLM v0's one page for every layer.

The engine serves the same image requests once per KV-cache manager, in one process, on the same
KV memory: ``jenga`` (self-attention layers keep text tokens only, the cross-attention group
keeps each image's K/V only in the cross-attention layers) against ``paged`` (vLLM v0: text and
image tokens in every layer) and the other baselines named by ``--managers``.  The model is a
random-weight Llama-3.2-Vision shape (``tiny_mllama_config`` with ``--layers`` decoder layers of
which ``--cross`` are cross-attention, Llama-3.2-11B's 1 in 5 by default; 2 tiles of 32x32 =
34 image tokens), fp32 on the CPU.  Prints the most requests running at once, preemptions,
tokens/s (prompt + output tokens per wall second), encoder runs and the mean KV waste; greedy
outputs must be identical across managers.

Usage: ``python benchmarks/mllama_cross_pages.py [--requests 24] [--kv-memory 6MiB] ...``;
``--markdown --outcome`` prints the columns every run of the same code prints alike (no times) as
Markdown: the README's generated table.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def build_model_dir(path: str, layers: int, cross: list[int]) -> None:
    from jenga.engine.models.weights import tiny_mllama_config

    cfg = tiny_mllama_config(num_hidden_layers=layers, cross_attention_layers=cross, bos_token_id=1,
                             eos_token_id=2, pad_token_id=0)
    cfg.save_pretrained(path)


def make_requests(n: int, text: int, seed: int):
    import torch

    from jenga.engine.models.weights import TINY_MLLAMA_IMAGE

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ratio = 1 + i % 3  # 1x1 (a padding tile), 1x2, 2x1
        pv = torch.randn(1, 1, 2, 3, 32, 32, generator=gen)
        mask = torch.tensor([[[1, 0]]]) if ratio == 1 else torch.tensor([[[1, 1]]])
        ids = [TINY_MLLAMA_IMAGE] + torch.randint(3, 500, (text,), generator=gen).tolist()
        out.append({"prompt_token_ids": ids, "multi_modal_data": {"image": {
            "pixel_values": pv, "aspect_ratio_ids": torch.tensor([[ratio]]), "aspect_ratio_mask": mask}}})
    return out


def run(path: str, manager: str, reqs, args) -> dict:
    import jenga
    from jenga import SamplingParams

    llm = jenga.LLM(path, random_weights=True, manager=manager, kv_memory=args.kv_memory,
                    max_num_batched_tokens=args.budget, track_kv_stats=True)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    llm.generate(make_requests(1, 8, seed=99), SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    llm.reset_metrics()
    t0 = time.perf_counter()
    outs = llm.generate(reqs, params)
    wall = time.perf_counter() - t0
    m, s = llm.metrics, llm.scheduler.stats
    return dict(wall_s=wall, tokens_per_s=(m.prompt_tokens + m.output_tokens) / wall, encoder_runs=m.encoder_runs,
                max_running=s.max_running, preemptions=s.preemptions, waste=m.waste_frac_mean,
                tokens=[o.token_ids for o in outs])


def main(argv=None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--text-tokens", type=int, default=40, help="text tokens after the image")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--kv-memory", default="6MiB")
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--cross", default="3,8", help="cross-attention layer indices")
    ap.add_argument("--managers", default="jenga,paged", help="comma-separated; the first is the reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--outcome", action="store_true", help="only the columns that do not depend on the machine "
                    "(no tokens/s, no wall time)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = args.managers.split(",")
    with tempfile.TemporaryDirectory() as d:
        build_model_dir(d, args.layers, [int(x) for x in args.cross.split(",")])
        reqs = make_requests(args.requests, args.text_tokens, args.seed)
        res = {name: run(d, name, reqs, args) for name in names}
    ref = res[names[0]]
    for name, r in res.items():
        if r["tokens"] != ref["tokens"]:
            raise SystemExit(f"outputs of {name} differ from {names[0]}'s")
    if args.markdown:
        print(markdown(res, names, args.outcome))
        return 0
    t = Table(title=f"Llama-3.2-Vision shape ({args.layers} layers, cross {args.cross}): {args.requests} requests "
                    f"x 1 image (34 tokens) + {args.text_tokens} text, {args.output_len} out, {args.kv_memory} KV")
    for col in ("manager", "max running", "preemptions", "tokens/s", "encoder runs", "KV waste", "wall s"):
        t.add_column(col, justify="right")
    for name, r in res.items():
        t.add_row(name, str(r["max_running"]), str(r["preemptions"]), f"{r['tokens_per_s']:.1f}",
                  str(r["encoder_runs"]), f"{100 * r['waste']:.1f} %", f"{r['wall_s']:.2f}")
    for name in names[1:]:
        r = res[name]
        t.add_row(f"{names[0]} / {name}", f"{ref['max_running'] / max(r['max_running'], 1):.2f}x", "",
                  f"[bold]{ref['tokens_per_s'] / r['tokens_per_s']:.2f}x[/bold]", "", "", "")
    Console().print(t)
    return 0


def markdown(res: dict, names: list[str], outcome: bool) -> str:
    """The table as Markdown; ``outcome``: without tokens/s and wall time (machine-dependent)."""
    cols = ["manager", "max running", "preemptions", "encoder runs", "KV waste"] + ([] if outcome else ["tokens/s"])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, r in res.items():
        cells = [name, str(r["max_running"]), str(r["preemptions"]), str(r["encoder_runs"]), f"{100 * r['waste']:.1f} %"]
        out.append("| " + " | ".join(cells + ([] if outcome else [f"{r['tokens_per_s']:.1f}"])) + " |")
    ref = res[names[0]]
    for name in names[1:]:
        r = res[name]
        cells = [f"{names[0]} / {name}", f"{ref['max_running'] / max(r['max_running'], 1):.2f}x", "", "", ""]
        out.append("| " + " | ".join(cells + ([] if outcome else [f"{ref['tokens_per_s'] / r['tokens_per_s']:.2f}x"]))
                   + " |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
