"""``jenga`` command line: plan, bench, simulate, reproduce, serve."""

from __future__ import annotations

import argparse
import json
import sys

from jenga.errors import JengaError


def _add_plan(sub) -> None:
    p = sub.add_parser("plan", help="page sizes, LCM page and capacity of a model in a memory budget")
    p.add_argument("--model", default="gemma-3-27b",
                   help="catalog name ({catalog}) or a local HF model directory / config.json; A,B: several "
                   "models in one pool next to a static even split")
    p.add_argument("--memory", default=None, help="KV memory, e.g. 64GiB (default: from --gpu, else 64GiB)")
    p.add_argument("--gpu", default=None, help="derive the KV budget from a GPU: {gpus}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (with --gpu)")
    p.add_argument("--tokens-per-page", type=int, default=16, help="base page (and prefix-hash block) size")
    p.add_argument("--dtype", default="bf16", help="KV dtype: {dtypes}")
    p.add_argument("--short-tokens", type=int, default=1024, help="length of the 'many short requests' case")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="with --model A,B: the longest request per model, which sets its floor (default: the model's)")
    p.add_argument("--manager", "--managers", dest="managers", metavar="LIST", default="jenga,paged",
                   help="comma-separated managers to compare: {managers}")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    p.set_defaults(func=run_plan)


def plan_data(args) -> dict:
    return plan_and_model(args)[0]


def plan_and_model(args) -> tuple[dict, object]:
    """``jenga plan``'s figures and the model spec they are of."""
    from jenga.baselines import make_manager
    from jenga.capacity import max_concurrent_requests, max_context_tokens
    from jenga.core.specs import ModelSpec

    check_plan_args(args)
    model = ModelSpec.from_hf_config(args.model, dtype=args.dtype, tokens_per_page=args.tokens_per_page,
                                     tp=args.tp)
    memory, budget_note = _budget(args, model)
    managers = [m.strip() for m in args.managers.split(",") if m.strip()]
    if "jenga" not in managers:
        managers.insert(0, "jenga")
    # the spec is one tensor-parallel rank's (KV heads / tp), so each rank gets memory / tp
    per_rank = memory // args.tp
    built = {name: make_manager(name, model, per_rank, tokens_per_page=args.tokens_per_page) for name in managers}
    jenga = built["jenga"]
    plan = jenga.page_plan
    data = {
        "model": model.name,
        "memory_bytes": memory,
        "tp": args.tp,
        "memory_source": budget_note,
        "groups": [{"name": g.name, "kind": g.kind, "layers": g.num_layers, "layer_ids": list(g.layers),
                    "page_bytes": g.page_bytes, "pad_bytes": g.pad_bytes, "tokens_per_page": g.tokens_per_page,
                    "small_pages_per_large": k}
                   for g, k in zip(jenga.model.groups, jenga.pool.small_per_large, strict=True)],
        "lcm_page_bytes": jenga.large_page_bytes,
        "raw_lcm_page_bytes": plan.raw_lcm_page_bytes if plan else jenga.large_page_bytes,
        "lcm_ratio": jenga.large_page_bytes / jenga.model.max_small_page_bytes,
        "pad_frac": plan.pad_frac if plan else 0.0,
        "num_large_pages": jenga.pool.num_large_pages,
        "short_tokens": args.short_tokens,
        # null: unbounded (every layer keeps only a window / chunk)
        "max_context_tokens": {n: max_context_tokens(m) for n, m in built.items()},
        "max_concurrent_requests": {n: max_concurrent_requests(m, args.short_tokens) for n, m in built.items()},
        "page_bytes": {n: sorted({g.page_bytes for g in m.model.groups}) for n, m in built.items()},
    }
    return data, model


def check_plan_args(args) -> None:
    """Sizes, counts and manager names of ``jenga plan``, checked before the model is read."""
    from jenga.baselines import MANAGER_NAMES
    from jenga.core.validation import checked_int
    from jenga.errors import InvalidArgumentError
    from jenga.units import parse_bytes

    for field in ("tp", "tokens_per_page", "short_tokens"):
        checked_int(getattr(args, field), "--" + field.replace("_", "-"))
    if args.memory is not None:
        parse_bytes(args.memory)
    bad = [m for m in args.managers.split(",") if m.strip() and m.strip() not in MANAGER_NAMES]
    if bad:
        raise InvalidArgumentError(f"unknown manager(s) {', '.join(bad)}; choose from {', '.join(MANAGER_NAMES)}")


def _budget(args, model) -> tuple[int, str]:
    from jenga.units import parse_bytes

    if args.memory is not None:
        return parse_bytes(args.memory), "--memory"
    if args.gpu is None:
        return parse_bytes("64GiB"), "default 64GiB"
    from jenga.sim.gpu import get_gpu, memory_budget
    from jenga.sim.model_cost import ModelCost

    gpu = get_gpu(args.gpu)
    cost = ModelCost.from_hf_config(model.hf_config, name=model.name)
    per_gpu = memory_budget(gpu, cost.weight_bytes, tp=args.tp)
    return per_gpu * args.tp, f"{args.gpu} x{args.tp}: memory x 0.9 - weights/tp - activations"


def plan_notes(data: dict, model_max_len: int) -> list[str]:
    """Where a capacity figure exceeds the model's own maximum context (no request can be that long)."""
    return [f"{name}: the KV cache holds {'any number of' if ctx is None else ctx} tokens for one request, more "
            f"than the model's maximum context of {model_max_len}; a request is limited to {model_max_len}"
            for name, ctx in data["max_context_tokens"].items() if ctx is None or ctx > model_max_len]


def run_plan(args) -> int:
    if "," in args.model:  # several models: one shared pool next to a static split
        from jenga.multi_plan import run_multi_plan

        return run_multi_plan(args)
    data, model = plan_and_model(args)
    notes = plan_notes(data, model.max_model_len)
    if args.json:
        print(json.dumps({**data, "notes": notes}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from jenga.units import fmt_bytes, fmt_tokens

    con = Console()
    t = Table(title=f"{data['model']}: cache groups (jenga)")
    for col in ("group", "kind", "layers", "tokens/page", "small page", "per large page"):
        t.add_column(col, justify="right" if col not in ("group", "kind") else "left")
    for g in data["groups"]:
        t.add_row(g["name"], g["kind"], str(g["layers"]), str(g["tokens_per_page"]), fmt_bytes(g["page_bytes"]),
                  str(g["small_pages_per_large"]))
    con.print(t)
    con.print(f"KV memory {fmt_bytes(data['memory_bytes'])} ({data['memory_source']}); "
              f"LCM page {fmt_bytes(data['lcm_page_bytes'])} = {data['lcm_ratio']:.2f}x the largest small page "
              f"(raw LCM {fmt_bytes(data['raw_lcm_page_bytes'])}; padding: {100 * data['pad_frac']:.3f}% of a "
              f"large page cut for a padded group); {data['num_large_pages']} large pages")
    c = Table(title="capacity")
    c.add_column("manager")
    c.add_column("page sizes", justify="right")
    c.add_column("max context (1 request)", justify="right")
    c.add_column(f"max requests of {data['short_tokens']} tokens", justify="right")
    base = data["max_context_tokens"]["jenga"]
    for name, ctx in data["max_context_tokens"].items():
        ratio = "" if name == "jenga" or not ctx or base is None else f"  (jenga {base / ctx:.2f}x)"
        shown = "unbounded (windows only)" if ctx is None else fmt_tokens(ctx)
        c.add_row(name, ", ".join(fmt_bytes(b) for b in data["page_bytes"][name]), shown + ratio,
                  str(data["max_concurrent_requests"][name]))
    con.print(c)
    for note in notes:
        con.print(f"note: {note}")
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jenga")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``jenga`` parser with every subcommand whose module is installed."""
    parser = argparse.ArgumentParser(prog="jenga", description="KV-cache memory management for heterogeneous LLMs")
    parser.add_argument("--version", action="version", version=f"jenga {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_plan(sub)
    for mod, fn in (("jenga.bench", "add_bench_parser"), ("jenga.sim.cli", "add_sim_parsers"),
                    ("jenga.server.cli", "add_serve_parser")):
        try:
            module = __import__(mod, fromlist=[fn])
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise
            continue
        getattr(module, fn)(sub)
    from jenga.helptext import use_for

    use_for(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.formatwarning = lambda msg, cat, *_a, **_k: f"jenga: warning: {msg}\n"  # one line, no source echo
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (JengaError, ValueError, KeyError) as e:
        print(f"jenga {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
