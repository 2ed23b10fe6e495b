"""The host tier inside vLLM on a CUDA machine: jenga's (``scheduler_cls`` + ``--kv-offloading-size``)
next to stock vLLM's own offloading, the same host bytes (``benchmarks/gpu_check.sh`` part 4).

Needs a CUDA device and a CUDA build of vLLM 0.32 / 0.33 / 0.34; exits 2 naming what is missing
otherwise (vLLM's CPU build refuses its own offloading, so this comparison cannot run on a CPU:
there, ``benchmarks/vllm_side_by_side.py --rows many`` compares jenga's tier with stock without one).

    python benchmarks/vllm_host_gpu.py [--articles 24] [--kv-gib 1] [--host-gib 4] [--markdown]

Model: Gemma-3-4B's text shape (34 layers, 5 sliding : 1 full, window 1024), random bf16 weights.
Workload: ``--articles`` articles of ``--length`` tokens, each round asks one question of every
article in the same cyclic order (the working set several times the device pool).  Engines, each
with ``kv_cache_memory_bytes`` = ``--kv-gib``: stock; stock with ``kv_offloading_size`` =
``--host-gib`` (vLLM's ``OffloadingConnector``); jenga; jenga with the same ``kv_offloading_size``
(jenga's per-kind host tier, copies by ``JengaConnector`` in vLLM's worker).  Per engine: prefix
hit rate (vLLM's ``num_cached_tokens``, host hits included), prompt tokens computed, preemptions,
generated tokens/s, and whether greedy tokens equal stock's (without offloading) per request.
An engine that fails to start or run is reported with its error, the others still run; the exit
status is 1 when one failed or jenga's tokens differ from stock's.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the counters read the scheduler in this process
sys.path.insert(0, str(Path(__file__).resolve().parent))

JENGA = "jenga.vllm.JengaScheduler"


def missing() -> str | None:
    """What this machine lacks for the comparison (None: nothing)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA device is visible (vLLM's CPU build refuses its own offloading)"
    try:
        import vllm  # noqa: F401

        from jenga.vllm import compat

        compat.check_version()
    except Exception as e:  # noqa: BLE001
        return f"no supported CUDA build of vLLM is importable ({type(e).__name__}: {e})"
    return None


def model_dir(root: Path) -> str:
    import torch
    import transformers as tf

    cfg = tf.Gemma3TextConfig(vocab_size=262208, hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                              num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=1024,
                              query_pre_attn_scalar=256, max_position_embeddings=8192)
    cfg.dtype = "bfloat16"
    out = root / "gemma3-4b-shape"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tf.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model.save_pretrained(out)
    del model
    torch.cuda.empty_cache()
    return str(out)


ENGINES = {  # name -> (jenga's scheduler?, host tier?)
    "stock": (False, False),
    "stock + offloading": (False, True),
    "jenga": (True, False),
    "jenga + host tier": (True, True),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--articles", type=int, default=24)
    ap.add_argument("--length", type=int, default=3000, help="tokens per article")
    ap.add_argument("--questions", type=int, default=3, help="rounds")
    ap.add_argument("--kv-gib", type=float, default=1.0, help="device KV bytes of every engine (GiB)")
    ap.add_argument("--host-gib", type=float, default=4.0, help="kv_offloading_size (GiB)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    why = missing()
    if why:
        print(f"vllm_host_gpu: cannot run here: {why}; this comparison needs a CUDA machine with vLLM "
              "(pip install '.[vllm-cuda]' vllm==0.34.0)", file=sys.stderr)
        return 2
    import torch
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
    from vllm_side_by_side import MAX_TOKENS, articles, ratio, run

    root = Path(tempfile.mkdtemp(prefix="jenga-host-gpu-"))
    path = model_dir(root)
    rounds = lambda: articles(0, args.articles, n_questions=args.questions, length=args.length)  # noqa: E731
    max_len = max(len(p) for r in rounds() for p in r) + MAX_TOKENS
    res, tokens, failed = {}, {}, []
    for name, (jenga, host) in ENGINES.items():
        kw = dict(model=path, dtype="bfloat16", max_model_len=max_len, kv_cache_memory_bytes=int(args.kv_gib * 2**30),
                  skip_tokenizer_init=True, seed=0, max_num_seqs=16)
        if jenga:
            kw["scheduler_cls"] = JENGA
        if host:
            kw["kv_offloading_size"] = args.host_gib
        try:
            llm = LLM(**kw)
            res[name] = run(llm, rounds())
            tokens[name] = res[name]["tokens"]
            llm.llm_engine.engine_core.shutdown()  # the next engine gets the GPU memory back
            del llm
        except Exception as e:  # noqa: BLE001
            failed.append(name)
            res[name] = None
            print(f"{name}: FAILED ({type(e).__name__}: {e})")
            traceback.print_exc()
        gc.collect()
        cleanup_dist_env_and_memory()
        torch.cuda.empty_cache()
    ref = tokens.get("stock")
    sep = " | " if args.markdown else "  "
    head = ["engine", "hit rate", "host hit", "prompt computed", "stock / this", "preempt", "tok/s", "equal to stock"]
    print(("| " if args.markdown else "") + sep.join(head) + (" |" if args.markdown else ""))
    if args.markdown:
        print("|" + "---|" * len(head))
    for name, r in res.items():
        if r is None:
            cells = [name, "failed", "", "", "", "", "", ""]
        else:
            same = "" if ref is None else f"{sum(tokens[name].get(k) == v for k, v in ref.items())}/{len(ref)}"
            if jenga_differs := (ENGINES[name][0] and ref is not None and same != f"{len(ref)}/{len(ref)}"):
                failed.append(f"{name} tokens")
            cells = [name, f"{r['hit']:.1%}", "" if r["host_hit"] is None else f"{r['host_hit']:.1%}",
                     f"{r['computed']}/{r['prompt']}",
                     ratio(res["stock"]["computed"], r["computed"]) if res.get("stock") else "",
                     str(r["preempt"]), f"{r['tps']:.1f}", same + (" (differs)" if jenga_differs else "")]
        print(("| " if args.markdown else "") + sep.join(cells) + (" |" if args.markdown else ""))
    if failed:
        print(f"vllm_host_gpu: FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
