"""``jenga bench --model A,B``: several models in one jenga pool against a static even split.

Same requests, same total KV bytes, same step loop: **shared** is one
:class:`~jenga.engine.multi_llm.MultiLLM` (one pool, memory follows the load, per-model floors);
**static** gives each model its own ``LLM`` with ``kv_memory / len(models)`` (what one process per
model with a fixed memory share does).  Each step runs one step of every model with work, in both.

Scenarios (two waves of ``--requests`` each; the second wave is submitted when the first is done):
``skewed`` sends 80% of the first wave to the first model and 20% to the second, then the other
way round; ``balanced`` splits both waves evenly.  Reported per scenario and engine: output
tokens/s over both waves, preemptions, model forwards (one per model per step: the same in every
run of the same code, unlike the timings) and the mean decode batch, and TTFT p50 / p99 (a request's submission to its first
token, in the same loop), with the shared / static ratios.  Models have random weights (tiny
names or directories), EOS is ignored so both engines do the same work; CPU, one torch thread.

Seconds are this process's CPU time (``time.process_time``): with one torch thread, what the wall
clock reads on an idle core, and unlike the wall clock on a shared machine they do not count the
time other processes hold the core (the wall-clock tokens/s is in the JSON, ``wall_tokens_per_s``).
Other processes still slow a core down (shared caches, frequency), so ``--repeats N`` serves each
scenario N times per engine, the engines alternating, and keeps each engine's fastest run: the
counts (tokens, forwards, preemptions) must be the same in every repeat, only the clock differs.
"""

from __future__ import annotations

import json
import random
import time

SCENARIOS = {"skewed": (0.8, 0.2), "balanced": (0.5, 0.5)}  # share of each wave sent to the first model
DEFAULTS = dict(model="tiny-llama,tiny-gemma3", kv_memory="3MiB", requests=16, prompt_min=48, prompt_max=160,
                output_len=24, max_num_batched_tokens=512, seed=0, threads=1, scenarios="skewed,balanced",
                repeats=1)
COUNTS = ("output_tokens", "forwards", "preemptions", "preemptions_by_model", "decode_batch_mean")


def waves(models: list[str], share_first: tuple[float, float], n: int, lo: int, hi: int, vocab: dict, seed: int):
    """Two waves of ``n`` (model, prompt) pairs; wave ``i`` sends ``share_first[i]`` of its requests
    to ``models[0]`` and the rest evenly to the others, interleaved by a seeded shuffle."""
    rng = random.Random(seed)
    out = []
    for share in share_first:
        k = round(share * n)
        names = [models[0]] * k + [models[1 + i % (len(models) - 1)] for i in range(n - k)]
        rng.shuffle(names)
        out.append([(m, [rng.randrange(3, vocab[m]) for _ in range(rng.randint(lo, hi))]) for m in names])
    return out


class _Static:
    """One ``LLM`` per model, each with its own share of the bytes; stepped like ``MultiLLM``."""

    def __init__(self, models: list[str], kv_memory: int, **kw):
        from jenga.engine.llm import LLM

        self.lanes = {m: LLM(m, kv_memory=kv_memory // len(models), **kw) for m in models}

    def add_request(self, model, prompt, params):
        return self.lanes[model].add_request(prompt, params)

    @property
    def has_unfinished(self) -> bool:
        return any(llm.has_unfinished for llm in self.lanes.values())

    def step(self) -> None:
        for llm in self.lanes.values():
            if llm.has_unfinished:
                llm.step()


def _engine(kind: str, models: list[str], args, max_len: int):
    from jenga.engine.multi_llm import MultiLLM
    from jenga.units import parse_bytes

    kw = dict(random_weights=True, seed=args.seed, max_num_batched_tokens=args.max_num_batched_tokens)
    if kind == "shared":
        return MultiLLM(models, kv_memory=parse_bytes(args.kv_memory), max_model_len=max_len, **kw)
    return _Static(models, parse_bytes(args.kv_memory), **kw)


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def run_scenario(kind: str, models: list[str], work: list, args, max_len: int) -> dict:
    """Serve both waves of ``work`` on a fresh engine of ``kind``; its result dict."""
    from jenga.sched.sampling_params import SamplingParams

    eng = _engine(kind, models, args, max_len)
    warm = SamplingParams(max_tokens=2, ignore_eos=True)
    for m in models:  # untimed warm-up of every model
        eng.add_request(m, list(range(3, 20)), warm)
    while eng.has_unfinished:
        eng.step()
    pre0 = {m: lane.scheduler.stats.preemptions for m, lane in eng.lanes.items()}
    st0 = [(lane.scheduler.stats.steps, lane.scheduler.stats.decode_steps, lane.scheduler.stats.decode_batch_sum)
           for lane in eng.lanes.values()]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True)
    ttft: dict[str, list[float]] = {m: [] for m in models}
    out_tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for wave in work:
        live = []
        t_add = time.process_time()
        for m, p in wave:
            live.append((m, eng.add_request(m, p, params)))
        pending = list(live)
        while eng.has_unfinished:
            eng.step()
            now = time.process_time()
            still = []
            for m, seq in pending:
                if seq.output_token_ids:
                    ttft[m].append(now - t_add)
                else:
                    still.append((m, seq))
            pending = still
        out_tokens += sum(len(seq.output_token_ids) for _, seq in live)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    all_ttft = [x for xs in ttft.values() for x in xs]
    preempt = {m: lane.scheduler.stats.preemptions - pre0[m] for m, lane in eng.lanes.items()}
    st = [(lane.scheduler.stats.steps, lane.scheduler.stats.decode_steps, lane.scheduler.stats.decode_batch_sum)
          for lane in eng.lanes.values()]
    forwards = sum(a[0] - b[0] for a, b in zip(st, st0, strict=True))
    dec_steps = sum(a[1] - b[1] for a, b in zip(st, st0, strict=True))
    dec_sum = sum(a[2] - b[2] for a, b in zip(st, st0, strict=True))
    return {"cpu_s": cpu, "wall_s": wall, "tokens_per_s": out_tokens / cpu, "wall_tokens_per_s": out_tokens / wall,
            "output_tokens": out_tokens,
            "forwards": forwards, "decode_batch_mean": dec_sum / dec_steps if dec_steps else 0.0,
            "preemptions": sum(preempt.values()), "preemptions_by_model": preempt,
            "ttft_p50_s": _percentile(all_ttft, 0.5), "ttft_p99_s": _percentile(all_ttft, 0.99)}


def _fastest(models: list[str], work: list, args, max_len: int) -> dict:
    """Each engine's fastest of ``--repeats`` runs of ``work``, the engines alternating; raises when
    a repeat's counts differ from the first run's (the engines are deterministic)."""
    best: dict[str, dict] = {}
    for _ in range(max(1, getattr(args, "repeats", 1))):
        for kind in ("shared", "static"):
            r = run_scenario(kind, models, work, args, max_len)
            if kind in best and any(r[k] != best[kind][k] for k in COUNTS):
                raise RuntimeError(f"{kind}: a repeat served the same work differently "
                                   f"({ {k: (best[kind][k], r[k]) for k in COUNTS} })")
            if kind not in best or r["cpu_s"] < best[kind]["cpu_s"]:
                best[kind] = r
    return best


def multi_bench_data(args) -> dict:
    """Every scenario on both engines; the ``--json`` object."""
    import torch

    from jenga.bench import check_args
    from jenga.engine.tiny import is_tiny, tiny_hf_config
    from jenga.errors import InvalidArgumentError
    from jenga.units import parse_bytes

    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if len(models) < 2 or len(set(models)) != len(models):
        raise InvalidArgumentError(f"--model needs two or more distinct models, got {args.model!r}")
    args.managers = "jenga"
    check_args(args)
    scenarios = [s.strip() for s in getattr(args, "scenarios", DEFAULTS["scenarios"]).split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise InvalidArgumentError(f"unknown scenario(s) {', '.join(bad)}; choose from {', '.join(SCENARIOS)}")
    torch.set_num_threads(args.threads)
    vocab = {}
    for m in models:
        if is_tiny(m):
            vocab[m] = tiny_hf_config(m).vocab_size
        else:
            from jenga.engine.models.registry import text_config
            from jenga.engine.models.weights import load_config

            vocab[m] = text_config(load_config(m)).vocab_size
    max_len = args.prompt_max + args.output_len
    results = {}
    for sc in scenarios:
        work = waves(models, SCENARIOS[sc], args.requests, args.prompt_min, args.prompt_max, vocab, args.seed)
        res = _fastest(models, work, args, max_len)
        sh, st = res["shared"], res["static"]
        res["ratio"] = {k: sh[k] / st[k] if st[k] else None for k in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s")}
        results[sc] = res
    return {"models": models, "kv_memory_bytes": parse_bytes(args.kv_memory), "requests_per_wave": args.requests,
            "prompt_tokens": [args.prompt_min, args.prompt_max], "output_len": args.output_len,
            "threads": args.threads, "repeats": max(1, getattr(args, "repeats", 1)), "scenarios": results}


def _print(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from jenga.units import fmt_bytes

    t = Table(title=f"jenga bench: {' + '.join(data['models'])} in {fmt_bytes(data['kv_memory_bytes'])} of KV, "
                    f"2 waves x {data['requests_per_wave']} requests ({data['prompt_tokens'][0]}-"
                    f"{data['prompt_tokens'][1]} prompt tokens, {data['output_len']} out)")
    for col in ("scenario", "engine", "tokens/CPU-s", "preemptions", "forwards", "decode batch", "TTFT p50",
                "TTFT p99"):
        t.add_column(col, justify="left" if col in ("scenario", "engine") else "right")
    for sc, res in data["scenarios"].items():
        for kind, label in (("shared", "one shared pool"), ("static", "static even split")):
            r = res[kind]
            t.add_row(sc, label, f"{r['tokens_per_s']:.1f}", str(r["preemptions"]), str(r["forwards"]),
                      f"{r['decode_batch_mean']:.1f}", f"{r['ttft_p50_s']:.2f} s",
                      f"{r['ttft_p99_s']:.2f} s")
        q = res["ratio"]
        t.add_row(sc, "shared / static", f"{q['tokens_per_s']:.2f}x", "", "", "",
                  f"{q['ttft_p50_s']:.2f}x" if q["ttft_p50_s"] else "", f"{q['ttft_p99_s']:.2f}x" if q["ttft_p99_s"] else "")
    t.caption = ("seconds: this process's CPU time (one torch thread; the fastest of "
                 f"{data['repeats']} alternating runs), TTFT from a wave's submission")
    con = Console()
    if not con.is_terminal:
        con = Console(width=124)  # the table's eight columns
    con.print(t)


def run_multi_bench(args) -> int:
    data = multi_bench_data(args)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        _print(data)
    return 0
