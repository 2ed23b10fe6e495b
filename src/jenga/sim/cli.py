"""``jenga simulate`` and ``jenga reproduce`` (loaded by :func:`jenga.cli.main`)."""

from __future__ import annotations

import json
import math
import sys

DEFAULT_MANAGERS = "jenga,paged,uniform"


def add_sim_parsers(sub) -> None:
    p = sub.add_parser("simulate", help="simulate continuous batching of a workload on several managers")
    p.add_argument("--model", default="ministral-8b", help="catalog model name: {catalog}; A,B: several models "
                   "on one GPU, one shared pool against a static even split")
    p.add_argument("--workload", default="decode-batch-20", help="workload ({workloads}) or a .jsonl trace path")
    p.add_argument("--gpu", default="h100-80gb", help="GPU: {gpus}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--scenarios", default="skewed,balanced",
                   help="with --model A,B: skewed (80/20 then swapped), balanced")
    p.add_argument("--weight-dtype", choices=("bf16", "fp8"), default="bf16", metavar="DTYPE",
                   help="the weights' dtype (bf16, fp8: vLLM's --quantization fp8); the KV cache stays bf16")
    p.add_argument("--manager", "--managers", dest="managers", metavar="LIST", default=DEFAULT_MANAGERS,
                   help="comma-separated managers: {managers}")
    p.add_argument("--requests", type=int, default=None, help="number of requests (default: workload's)")
    p.add_argument("--rate", type=float, default=math.inf, help="arrival rate req/s (default: all at t=0)")
    p.add_argument("--seed", type=int, default=0, help="arrival and workload seed (the artifact's runs: 55555)")
    p.add_argument("--articles", type=int, default=None, help="arxiv-multiq: number of documents")
    p.add_argument("--questions-per-article", type=int, default=None, help="arxiv-multiq: questions per document")
    p.add_argument("--order", choices=("interleaved", "grouped", "shuffled"), default=None, metavar="ORDER",
                   help="arxiv-multiq: interleaved, grouped or shuffled (Python's random.Random(seed), as the "
                        "artifact)")
    p.add_argument("--max-prompt-len", type=int, default=None,
                   help="arxiv-multiq: prompt + output cap (the artifact's --hf-max-len)")
    p.add_argument("--output-len", type=int, default=None, help="output tokens per request (workload's default)")
    p.add_argument("--draft", default=None, help="catalog draft model for speculative decoding "
                   "(default: llama-3.2-1b with the spec-decode workload, else none)")
    p.add_argument("--budget", type=int, default=8192,
                   help="max tokens per step; with --scheduler v0 at least max(max_model_len, 2048), as vLLM v0 "
                        "requires without chunked prefill")
    p.add_argument("--scheduler", choices=("chunked", "v0"), default="chunked", metavar="KIND",
                   help="chunked: vLLM v1-like mixed chunked prefill; v0: chunked prefill off (whole prompts, "
                        "prefill-only steps)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="most running requests per step")
    p.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    p.add_argument("--host-kv-memory", default=None, metavar="SIZE",
                   help="a host-memory KV tier (jenga's manager): bytes such as 64GiB, or Nx the device pool "
                        "(4x); its copies cost the GPU's host link bandwidth per step")
    p.add_argument("--record-every", type=int, default=1, help="record memory stats every N steps")
    p.add_argument("--calibration", choices=("fitted", "roofline"), default="fitted", metavar="TABLE",
                   help="cost model efficiencies: fitted (jenga.sim.calibration, the engine of --scheduler: "
                        "v0 or v1) or roofline (uncalibrated guesses)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="write a memory-timeline PNG")
    p.set_defaults(func=run_simulate)

    r = sub.add_parser("reproduce", help="the paper's headline numbers next to this reproduction's")
    r.add_argument("--quick", action="store_true",
                   help="smoke run: tiny request counts (seconds; for tests), not the paper's figures")
    r.add_argument("--section", action="append", default=None,
                   help="only this section (repeatable; default: all): {sections}")
    r.add_argument("--json", action="store_true", help="print JSON instead of the table")
    r.set_defaults(func=run_reproduce)


def _workload(args, max_len: int):
    from jenga.sim.traces import load_jsonl
    from jenga.sim.workloads import get_workload

    if args.workload.endswith(".jsonl"):
        w = load_jsonl(args.workload)
        return w[:args.requests] if args.requests else w
    kw = dict(rate=args.rate, seed=args.seed, max_len=min(max_len, 131072))
    if args.requests is not None:
        kw["num_requests"] = args.requests
    for flag, key in (("articles", "num_articles"), ("questions_per_article", "questions_per_article"),
                      ("order", "order"), ("max_prompt_len", "max_prompt_len"), ("output_len", "output_len")):
        if getattr(args, flag) is not None:
            kw[key] = getattr(args, flag)
    return get_workload(args.workload, **kw)


def run_simulate(args) -> int:
    if "," in args.model:  # several models: one shared pool against a static split
        from jenga.sim.multi_model import run_multi_simulate

        return run_multi_simulate(args)
    from jenga.errors import InvalidArgumentError
    from jenga.sim.report import print_simulate, simulate_payload
    from jenga.sim.setup import build_setup
    from jenga.sim.simulator import SimConfig, Simulator

    managers = [m.strip() for m in args.managers.split(",") if m.strip()]
    draft = args.draft
    if args.workload == "spec-decode" and draft is None:
        draft = "llama-3.2-1b"
    from jenga.sim.calibration import CALIBRATIONS

    calibration = CALIBRATIONS[args.calibration]
    engine = "v0" if args.scheduler == "v0" else "v1"
    setup = build_setup(args.model, args.gpu, args.tp, draft=draft, efficiency=calibration.cost_kwargs(engine),
                        weight_dtype=args.weight_dtype)
    try:
        w = _workload(args, setup.target.max_model_len)
    except (TypeError, ValueError) as e:
        print(f"jenga simulate: {e}", file=sys.stderr)
        return 2
    budget = args.budget
    if args.scheduler == "v0":
        from jenga.sched.v0_scheduler import v0_token_budget

        budget = max(budget, v0_token_budget(setup.target.max_model_len))
    host = None
    if args.host_kv_memory is not None:
        from jenga.units import parse_bytes_or_multiple

        try:
            host = parse_bytes_or_multiple(args.host_kv_memory, setup.memory_bytes)
        except InvalidArgumentError as e:
            print(f"jenga simulate: --host-kv-memory: {e}", file=sys.stderr)
            return 2
    cfg = SimConfig(max_num_batched_tokens=budget, max_num_seqs=args.max_num_seqs, seed=args.seed,
                    scheduler=args.scheduler, host_memory_bytes=host,
                    enable_prefix_caching=not args.no_prefix_caching, record_every=max(1, args.record_every))
    sim = Simulator(setup, cfg)
    unavailable: dict[str, str] = {}
    results = {}
    from jenga.progress import progress

    for name in managers:
        try:
            sim.make_manager(name)
        except (ImportError, NameError, AttributeError, InvalidArgumentError) as e:
            unavailable[name] = f"{type(e).__name__}: {e}"
            print(f"jenga simulate: manager {name!r} is not available yet ({e}); skipping it", file=sys.stderr)
            continue
        with progress(f"{name:>8}", len(w), prefix="jenga simulate") as bar:
            results[name] = sim.run(w, name, progress=bar.update)
    if not results:
        print("jenga simulate: none of the requested managers is available", file=sys.stderr)
        return 2
    meta = {"model": setup.model.name, "workload": w.info.name, "gpu": setup.gpu, "tp": setup.tp,
            "requests": len(w), "seed": args.seed, "rate": None if math.isinf(args.rate) else args.rate,
            "memory_bytes": setup.memory_bytes, "host_memory_bytes": host, "draft": draft,
            "calibration": {"engine": engine, **calibration.as_dict()}}
    if args.plot:
        from jenga.sim.plot import plot_timeline

        plot_timeline(results, args.plot, title=f"{meta['model']} / {meta['workload']} on {meta['gpu']}")
        meta["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(simulate_payload(results, meta, unavailable), indent=2))
    else:
        print_simulate(results, meta)
        if args.plot:
            print(f"memory timeline written to {args.plot}")
    return 0


def run_reproduce(args) -> int:
    from jenga.sim.report import print_reproduce
    from jenga.sim.reproduce import SECTIONS, reproduce

    if args.section:
        bad = [s for s in args.section if s not in SECTIONS]
        if bad:
            print(f"jenga reproduce: unknown section(s) {bad}; choose from {list(SECTIONS)}", file=sys.stderr)
            return 2
    from jenga.progress import ProgressLine

    todo = [s for s in SECTIONS if not args.section or s in args.section]
    with ProgressLine("sections", len(todo), unit="", prefix="jenga reproduce", enabled=not sys.stderr.isatty()) as line:
        def say(name: str) -> None:
            line.done = todo.index(name)
            line.unit = f"(now: {name})"
            if not args.json:
                print(f"... {name}", file=sys.stderr, flush=True)

        rows = reproduce(quick=args.quick, sections=args.section, progress=say)
        line.done, line.unit = len(todo), ""
    if args.json:
        from jenga.sim.calibration import FITTED
        from jenga.sim.report import reproduce_title

        print(json.dumps({"title": reproduce_title(args.quick), "quick": args.quick, "calibration": FITTED.as_dict(),
                          "rows": [r.as_dict() for r in rows]}, indent=2))
    else:
        print_reproduce(rows, quick=args.quick)
    return 0
