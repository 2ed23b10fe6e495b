"""VLM chunked prefill: vision embeddings cached in jenga's pages vs re-running the encoder per chunk.

The engine serves the same image requests twice in one process: with the embedding cache (the
default: each image is encoded once into the vision-embedding group's pages and every prefill
chunk that touches it reads its rows back) and with ``mm_embedding_cache=False`` (every chunk
that touches an image runs the vision encoder again and keeps only its slice, as an engine
without embedding pages must).  The model is a small random-weight Gemma-3 VLM (the tiny
Gemma-3 text model; a SigLIP tower of ``--vision-layers`` layers of width ``--vision-width`` on
224x224 images, 16x16 patches pooled to 64 tokens per image), fp32 on the CPU.  Prints encoder
runs, tokens/s (prompt + output tokens per wall second) and the ratio.

Usage: ``python benchmarks/vlm_embedding_cache.py [--requests 12] [--chunk 32] ...``;
``--markdown --outcome`` prints the columns every run of the same code prints alike (encoder runs,
steps; no times) as Markdown: the README's generated table.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def build_model_dir(path: str, layers: int, width: int) -> None:
    from jenga.engine.models.weights import tiny_gemma3_vision_config

    cfg = tiny_gemma3_vision_config(image_size=224, patch_size=14, mm_tokens_per_image=64,
                                    num_hidden_layers=6, sliding_window=64,
                                    layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    vc = cfg.vision_config
    vc.num_hidden_layers, vc.hidden_size, vc.intermediate_size, vc.num_attention_heads = layers, width, 4 * width, 4
    cfg.save_pretrained(path)


def make_requests(n: int, images_per: int, text: int, seed: int):
    import torch

    from jenga.engine.models.weights import TINY_BOI, TINY_EOI, TINY_IMAGE

    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids: list[int] = []
        imgs = []
        for _ in range(images_per):
            ids += torch.randint(3, 500, (text,), generator=gen).tolist()
            ids += [TINY_BOI] + [TINY_IMAGE] * 64 + [TINY_EOI]
            imgs.append(torch.randn(3, 224, 224, generator=gen))
        ids += torch.randint(3, 500, (text,), generator=gen).tolist()
        out.append({"prompt_token_ids": ids, "multi_modal_data": {"image": imgs}})
    return out


def run(path: str, cache: bool, reqs, args) -> dict:
    import jenga
    from jenga import SamplingParams

    llm = jenga.LLM(path, random_weights=True, kv_memory=args.kv_memory, max_num_batched_tokens=args.chunk,
                    mm_embedding_cache=cache)
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    llm.generate(make_requests(1, 1, 8, seed=99), SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    llm.reset_metrics()
    t0 = time.perf_counter()
    outs = llm.generate(reqs, params)
    wall = time.perf_counter() - t0
    m = llm.metrics
    tokens = m.prompt_tokens + m.output_tokens
    return dict(wall_s=wall, tokens_per_s=tokens / wall, encoder_runs=m.encoder_runs, steps=m.steps,
                tokens=[o.token_ids for o in outs])


def main(argv=None) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--images-per-request", type=int, default=2)
    ap.add_argument("--text-tokens", type=int, default=24, help="text tokens around each image")
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=32, help="max_num_batched_tokens (prefill chunk budget)")
    ap.add_argument("--kv-memory", default="32MiB")
    ap.add_argument("--vision-layers", type=int, default=4)
    ap.add_argument("--vision-width", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--outcome", action="store_true", help="only the columns that do not depend on the machine "
                    "(no tokens/s, no wall time)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        build_model_dir(d, args.vision_layers, args.vision_width)
        reqs = make_requests(args.requests, args.images_per_request, args.text_tokens, args.seed)
        res = {"embedding cache": run(d, True, reqs, args), "re-encode per chunk": run(d, False, reqs, args)}
    a, b = res["embedding cache"], res["re-encode per chunk"]
    if a["tokens"] != b["tokens"]:
        raise SystemExit("outputs differ between the two runs")
    if args.markdown:
        print(markdown(res, args.outcome))
        return 0
    t = Table(title=f"VLM chunked prefill: {args.requests} requests x {args.images_per_request} images "
                    f"(64 tokens each), {args.chunk}-token chunks")
    for col in ("", "encoder runs", "tokens/s", "steps", "wall s"):
        t.add_column(col, justify="right")
    for name, r in res.items():
        t.add_row(name, str(r["encoder_runs"]), f"{r['tokens_per_s']:.1f}", str(r["steps"]), f"{r['wall_s']:.2f}")
    t.add_row("cache / re-encode", f"{a['encoder_runs'] / b['encoder_runs']:.2f}x",
              f"[bold]{a['tokens_per_s'] / b['tokens_per_s']:.2f}x[/bold]", "", "")
    Console().print(t)
    return 0


def markdown(res: dict, outcome: bool) -> str:
    """The table as Markdown; ``outcome``: without tokens/s and wall time (machine-dependent)."""
    cols = ["", "encoder runs", "steps"] + ([] if outcome else ["tokens/s"])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, r in res.items():
        out.append("| " + " | ".join([name, str(r["encoder_runs"]), str(r["steps"])]
                                     + ([] if outcome else [f"{r['tokens_per_s']:.1f}"])) + " |")
    a, b = res["embedding cache"], res["re-encode per chunk"]
    out.append("| " + " | ".join(["cache / re-encode", f"{a['encoder_runs'] / b['encoder_runs']:.2f}x", ""]
                                 + ([] if outcome else [f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x"])) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
