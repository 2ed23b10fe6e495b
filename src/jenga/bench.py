"""``jenga bench``: the real engine under ``jenga`` and under ``paged``, same requests, same memory.

Default setup (chosen so the workload's KV need, ~26 MiB with every request resident and the
shared prefix held once, exceeds the budget): the built-in ``tiny-gemma3`` model (random weights;
6 layers, 5 sliding with a 64-token window : 1 full, like Gemma-3), 48 requests with 256-448-token
prompts whose first 192 tokens (a system prompt, three windows long: the paper's case) are the
same, and 64 output tokens each (EOS ignored, so both managers do exactly the same work),
``--kv-memory 12MiB`` of fp32 KV, 512-token step budget (chunked prefill); ``--shared-prefix N``
sets the shared tokens (0: none).  PagedAttention v0 keeps every token in every layer; jenga keeps
only the window in the sliding layers (and, of the shared prefix, what a hit reads: every token of
the full layer, the window at the prefix's end in the sliding ones), so the same memory holds
more running requests -> bigger decode batches -> more tokens per second (a decode step's cost is
mostly per-step, not per-request, at these batch sizes).

Prefix hits are reported in two rows that mean different things: the share of prompt tokens found
cached when a request is first admitted (the shared prefix at work), and the tokens a request
preempted by recompute finds again when it is re-admitted (its own pages, still cached: a
re-read, which only a manager that preempts gets).  Everything runs in this process on
the CPU with one torch thread (tiny kernels: more threads mostly add synchronisation, and
collapse when other processes share the cores), timed end to end (scheduling, manager,
metadata, forward, sampling) after a short untimed warm-up per engine.

Public: :func:`add_bench_parser` (wired into ``jenga.cli``), :func:`run_bench` (returns the
exit code), :func:`bench_data` (the ``--json`` object).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

DEFAULTS = dict(model="tiny-gemma3", kv_memory="12MiB", requests=48, prompt_min=256, prompt_max=448,
                output_len=64, shared_prefix=192, max_num_batched_tokens=512, managers="jenga,paged", seed=0,
                threads=1, device="cpu", dtype="fp32")


#: the manager's host-tier counters a bench run reports (differences over the timed part)
HOST_COUNTERS = ("host_hit_tokens", "promotions", "demotions", "bytes_promoted", "bytes_demoted")


@dataclass
class Workload:
    prompts: list[list[int]]
    output_len: int
    shared_prefix: int = 0  # the first tokens, the same in every prompt


def make_workload(num: int, lo: int, hi: int, output_len: int, vocab: int, seed: int,
                  shared_prefix: int = 0) -> Workload:
    """``num`` seeded random prompts, lengths uniform in ``[lo, hi]``, ids in ``[3, vocab)``; the
    first ``shared_prefix`` tokens (a system prompt) are the same in every prompt."""
    import random

    if not 0 <= shared_prefix < lo <= hi:
        from jenga.errors import InvalidArgumentError

        raise InvalidArgumentError(f"need 0 <= shared prefix ({shared_prefix}) < prompt min ({lo}) <= prompt max ({hi})")
    rng = random.Random(seed)
    system = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    prompts = [system + [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi) - shared_prefix)]
               for _ in range(num)]
    return Workload(prompts, output_len, shared_prefix)


def workload_kv_bytes(spec, work: Workload) -> int:
    """KV bytes the workload needs with every request resident at its final length (real model:
    sliding layers keep their window, chunked layers their chunk, full layers everything); the
    whole pages of a shared prefix that requests keep are counted once, as a prefix cache holds them."""
    total = 0
    for g in spec.groups:
        window, chunk = g.spec.span()
        per = g.spec.bytes_per_token() * g.num_layers
        shared = work.shared_prefix // g.tokens_per_page * g.tokens_per_page
        low = shared  # the lowest shared position some request keeps
        for p in work.prompts:
            n = len(p) + work.output_len
            keep = min(n, window or chunk or n)
            low = min(low, n - keep)
            total += (keep - max(0, shared - (n - keep))) * per  # its own kept tokens
            total += 0 if g.spec.per_token else g.useful_page_bytes  # one running state
        total += (shared - low) * per if g.spec.per_token else 0
    return total


def bench_workload(args) -> Workload:
    """The prompts ``jenga bench`` serves for ``args`` (ids within its model's vocabulary: a built-in
    tiny model's, or a local HF model's config)."""
    from jenga.engine.tiny import is_tiny, tiny_hf_config

    if is_tiny(args.model):
        vocab = tiny_hf_config(args.model).vocab_size
    else:
        from jenga.engine.models.registry import text_config
        from jenga.engine.models.weights import load_config

        vocab = text_config(load_config(args.model)).vocab_size
    return make_workload(args.requests, args.prompt_min, args.prompt_max, args.output_len, vocab, args.seed,
                         args.shared_prefix)


def run_engine(name: str, args, work: Workload, progress=None, *, track_kv_stats: bool = True) -> dict:
    """Serve ``work`` with a fresh engine using manager ``name``; the per-manager result dict.

    ``args`` needs ``model, kv_memory, seed, max_num_batched_tokens``; ``progress(n)`` is called
    with the number of requests each step finished.  ``model_s`` is time in
    the model forward, ``overhead_s`` the rest of the engine steps (scheduler, manager, metadata,
    sampling).  ``track_kv_stats=False`` skips the per-step ``manager.stats()`` sample (peak
    and waste figures are then 0)."""
    from jenga.engine.llm import LLM
    from jenga.sched.sampling_params import SamplingParams

    llm = LLM(args.model, manager=name, kv_memory=args.kv_memory, random_weights=True, seed=args.seed,
              device=args.device, dtype=args.dtype,
              max_num_batched_tokens=args.max_num_batched_tokens, track_kv_stats=track_kv_stats,
              state_checkpoint_interval=getattr(args, "state_checkpoint_interval", None),
              host_kv_memory=getattr(args, "host_kv_memory", None))
    params = SamplingParams(max_tokens=work.output_len, ignore_eos=True)
    llm.generate([list(range(3, 40)), list(range(50, 70))], SamplingParams(max_tokens=4, ignore_eos=True))
    llm.reset_metrics()
    st0 = llm.manager.stats()
    t0 = time.perf_counter()
    for p in work.prompts:
        llm.add_request(p, params)
    while llm.scheduler.has_unfinished:
        finished = llm.step()
        if progress is not None and finished:
            progress(len(finished))
    if llm.device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    m, s, st = llm.metrics, llm.scheduler.stats, llm.manager.stats()
    queries = st.prefix_query_tokens - st0.prefix_query_tokens
    first = st.first_query_tokens - st0.first_query_tokens
    host = {} if llm.host_pool is None else {
        key: getattr(st, key) - getattr(st0, key) for key in HOST_COUNTERS} | {"host_total_bytes": st.host_total_bytes}
    return {
        **host,
        "wall_s": wall,
        "tokens_per_s": m.output_tokens / wall,
        "requests_per_s": m.finished / wall,
        "output_tokens": m.output_tokens,
        "steps": s.steps,
        "decode_batch_mean": s.decode_batch_mean,
        "batch_mean": s.batch_mean,
        "max_running": s.max_running,
        "preemptions": s.preemptions,
        "prefix_hit_rate": (st.prefix_hit_tokens - st0.prefix_hit_tokens) / queries if queries else 0.0,
        # the manager counts a request's first lookup apart from its re-adds after a preemption
        "first_admission_hit_rate": (st.first_hit_tokens - st0.first_hit_tokens) / first if first else 0.0,
        "readmission_hit_tokens": st.repeat_hit_tokens - st0.repeat_hit_tokens,
        "evicted_pages": st.evicted_pages - st0.evicted_pages,
        "peak_kv_used_bytes": m.peak_used_bytes,
        "peak_kv_needed_bytes": m.peak_needed_bytes,
        "waste_frac_mean": m.waste_frac_mean,
        "model_s": m.model_s,
        "overhead_s": m.overhead_s,
        "kv_pool_bytes": llm.manager.total_bytes,
        "kv_spec_bytes": workload_kv_bytes(llm.spec, work),
    }


def check_args(args) -> None:
    """Counts and sizes of a bench run, checked before anything is built (``InvalidArgumentError``)."""
    from jenga.baselines import MANAGER_NAMES
    from jenga.core.validation import checked_int
    from jenga.errors import InvalidArgumentError
    from jenga.units import parse_bytes

    for field in ("requests", "prompt_min", "prompt_max", "output_len", "max_num_batched_tokens", "threads"):
        checked_int(getattr(args, field), "--" + field.replace("_", "-"))
    checked_int(args.shared_prefix, "--shared-prefix", minimum=0)
    checked_int(getattr(args, "repeats", 1), "--repeats")
    parse_bytes(args.kv_memory)
    if getattr(args, "host_kv_memory", None) is not None:
        parse_bytes(args.host_kv_memory)
    names = [n.strip() for n in args.managers.split(",") if n.strip()]
    bad = [n for n in names if n not in MANAGER_NAMES] or ([] if names else ["(none)"])
    if bad:
        raise InvalidArgumentError(f"unknown manager(s) {', '.join(bad)}; choose from {', '.join(MANAGER_NAMES)}")


def bench_data(args) -> dict:
    """Run every manager in ``args.managers`` on one workload; the ``--json`` object.  Progress
    goes to stderr (a bar on a terminal, else a plain line every few seconds)."""
    check_args(args)
    import torch

    from jenga.units import parse_bytes

    torch.set_num_threads(args.threads)
    work = bench_workload(args)
    names = [n.strip() for n in args.managers.split(",") if n.strip()]
    from jenga.progress import progress

    results = {}
    for name in names:
        with progress(f"{name:>6}", len(work.prompts), prefix="jenga bench") as bar:
            results[name] = run_engine(name, args, work, bar.update)
    first = next(iter(results.values()))
    data = {
        "model": args.model,
        "kv_memory_bytes": parse_bytes(args.kv_memory),
        "requests": args.requests,
        "prompt_tokens": sum(len(p) for p in work.prompts),
        "output_len": args.output_len,
        "shared_prefix": args.shared_prefix,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "threads": args.threads,
        "device": args.device,
        "dtype": args.dtype,
        "workload_kv_bytes": first["kv_spec_bytes"],
        "managers": results,
    }
    if "jenga" in results and "paged" in results:
        data["ratio_tokens_per_s"] = results["jenga"]["tokens_per_s"] / results["paged"]["tokens_per_s"]
    return data


def _legend(data: dict) -> list[str]:
    """What the rows a newcomer misreads mean, printed under the table."""
    prefix = (f"every prompt starts with the same {data['shared_prefix']} tokens (--shared-prefix)"
              if data["shared_prefix"] else "no prompt shares a prefix (--shared-prefix 0)")
    return [f"{prefix}; \"prefix hits at first admission\": the share of prompt tokens a request finds cached "
            "when it first arrives (the shared prefix at work)",
            "\"tokens re-read after preemption\": a preempted request's own pages found again when it comes back "
            "(recompute saved, not a cache win: only a manager that preempts gets them)",
            "\"peak KV needed\": what the real model reads (sliding layers: their window; a token several requests "
            "hold counted once); \"mean waste\": the rest of what the manager holds"]


def _print_table(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from jenga.units import fmt_bytes

    res = data["managers"]
    t = Table(title=f"jenga bench: {data['model']}, {data['requests']} requests "
                    f"({data['prompt_tokens']} prompt tokens, {data['output_len']} out each), "
                    f"KV memory {fmt_bytes(data['kv_memory_bytes'])}")
    t.add_column("metric")
    for name in res:
        t.add_column(name, justify="right")
    has_ratio = "jenga" in res and "paged" in res
    if has_ratio:
        t.add_column("jenga / paged", justify="right")
    rows = [("tokens/s", "tokens_per_s", "{:.1f}", True), ("requests/s", "requests_per_s", "{:.2f}", True),
            ("mean decode batch", "decode_batch_mean", "{:.1f}", True), ("max running", "max_running", "{}", True),
            ("peak KV held", "peak_kv_used_bytes", "bytes", False),
            ("peak KV needed", "peak_kv_needed_bytes", "bytes", False),
            ("mean waste", "waste_frac_mean", "pct", False), ("preemptions", "preemptions", "{}", False),
            ("prefix hits at first admission", "first_admission_hit_rate", "pct", False),
            ("tokens re-read after preemption", "readmission_hit_tokens", "{}", False),
            ("evicted pages", "evicted_pages", "{}", False),
            ("steps", "steps", "{}", False), ("wall time", "wall_s", "{:.1f} s", False)]
    if all("host_hit_tokens" in r for r in res.values()):  # --host-kv-memory
        rows += [("host tier", "host_total_bytes", "bytes", False), ("host hit tokens", "host_hit_tokens", "{}", False),
                 ("bytes demoted", "bytes_demoted", "bytes", False), ("bytes promoted", "bytes_promoted", "bytes", False)]
    for label, key, fmt, ratio in rows:
        cells = []
        for name in res:
            v = res[name][key]
            cells.append(fmt_bytes(v) if fmt == "bytes" else f"{100 * v:.1f}%" if fmt == "pct" else fmt.format(v))
        if has_ratio:
            a, b = res["jenga"][key], res["paged"][key]
            cells.append(f"{a / b:.2f}x" if ratio and b else "")
        t.add_row(label, *cells)
    con = Console()
    con.print(t)
    con.print(f"workload KV need with all requests resident: {fmt_bytes(data['workload_kv_bytes'])} "
              f"(budget {fmt_bytes(data['kv_memory_bytes'])})")
    for line in _legend(data):
        con.print(line)
    if "ratio_tokens_per_s" in data:
        con.print(f"[bold]throughput jenga / paged = {data['ratio_tokens_per_s']:.2f}x[/bold]")


def run_bench(args) -> int:
    """``jenga bench``: table (or ``--json``) of both managers on the same workload; several models
    (``--model A,B``): one shared pool against a static split (:mod:`jenga.multi_bench`)."""
    if "," in args.model:
        from jenga.multi_bench import run_multi_bench

        return run_multi_bench(args)
    data = bench_data(args)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        _print_table(data)
    return 0


def add_bench_parser(subparsers) -> None:
    """Register ``bench`` on an argparse subparsers object."""
    d = DEFAULTS
    p = subparsers.add_parser("bench", help="real-engine throughput: jenga vs paged on one workload (CPU)")
    p.add_argument("--model", default=d["model"], help="built-in tiny model ({tiny}) or a local HF model "
                   "directory (random weights either way); A,B: several models, one shared pool against a "
                   "static even split of the same bytes")
    p.add_argument("--scenarios", default="skewed,balanced",
                   help="with --model A,B: skewed (80/20 then swapped), balanced")
    p.add_argument("--repeats", type=int, default=1,
                   help="with --model A,B: serve each scenario N times per engine, alternating, and keep "
                        "each engine's fastest CPU time (the counts must match)")
    p.add_argument("--kv-memory", default=d["kv_memory"], help="KV cache budget, e.g. 24MiB")
    p.add_argument("--host-kv-memory", default=None, metavar="SIZE",
                   help="a host-memory KV tier behind the device pool, e.g. 48MiB (default: none)")
    p.add_argument("--requests", type=int, default=d["requests"], help="number of requests")
    p.add_argument("--prompt-min", type=int, default=d["prompt_min"], help="shortest prompt (tokens)")
    p.add_argument("--prompt-max", type=int, default=d["prompt_max"], help="longest prompt (tokens)")
    p.add_argument("--shared-prefix", type=int, default=d["shared_prefix"],
                   help="tokens of a system prompt shared by every request")
    p.add_argument("--output-len", type=int, default=d["output_len"], help="generated tokens per request")
    p.add_argument("--max-num-batched-tokens", type=int, default=d["max_num_batched_tokens"],
                   help="per-step token budget (chunked prefill)")
    p.add_argument("--manager", "--managers", dest="managers", metavar="LIST", default=d["managers"],
                   help="comma-separated managers: {managers}")
    p.add_argument("--state-checkpoint-interval", type=int, default=None,
                   help="tokens between Mamba / linear-attention state checkpoints (default 512)")
    p.add_argument("--seed", type=int, default=d["seed"], help="workload and weights seed")
    p.add_argument("--threads", type=int, default=d["threads"], help="torch CPU threads")
    p.add_argument("--device", default=d["device"], help="torch device of the engine (cpu, cuda)")
    p.add_argument("--dtype", default=d["dtype"], help="weights and KV dtype: fp32, bf16, fp16")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of the table")
    p.set_defaults(func=run_bench)
