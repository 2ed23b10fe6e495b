"""``jenga plan --model A,B --memory X``: several models in one jenga pool next to a static even split.

**Shared**: one :class:`~jenga.core.manager.multi_model.MultiModelManager` over the whole budget
(one LCM large page over every model's groups), each model with its floor (by default what one
request of its maximum length needs).  A model alone may use everything but the other models'
floors.  **Static**: one ``KVCacheManager`` per model with ``memory / len(models)`` (a fixed share,
as one process per model).  Per model: its groups and page sizes, its floor, the longest request
and how many ``--short-tokens`` requests fit at once, in each.
"""

from __future__ import annotations

import json


def _fit_count(pages_one: list[int], k: list[int], large: int) -> int:
    """How many requests of ``pages_one`` small pages per group fit in ``large`` large pages."""
    from jenga.core.policy.registry import cdiv

    def fits(n: int) -> bool:
        return sum(cdiv(p * n, kg) for p, kg in zip(pages_one, k, strict=True)) <= large

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def multi_plan_data(args) -> dict:
    from jenga.capacity import max_concurrent_requests, max_context_tokens
    from jenga.cli import check_plan_args
    from jenga.core.manager.manager import KVCacheManager
    from jenga.core.manager.multi_model import MultiModelManager
    from jenga.core.specs import ModelSpec
    from jenga.errors import InvalidArgumentError
    from jenga.units import parse_bytes

    check_plan_args(args)
    names = [m.strip() for m in args.model.split(",") if m.strip()]
    if args.tp != 1 or args.gpu is not None and args.memory is None:
        raise InvalidArgumentError("--model A,B plans one device's pool: give --memory (no --gpu / --tp)")
    memory = parse_bytes(args.memory or "64GiB")
    specs = [ModelSpec.from_hf_config(n, dtype=args.dtype, tokens_per_page=args.tokens_per_page, name=n, vision=False)
             for n in names]  # several models in one pool serve text (the engine's rule)
    cap = getattr(args, "max_model_len", None)
    shared = MultiModelManager(specs, memory, tokens_per_page=args.tokens_per_page,
                               max_model_lens=None if cap is None else dict.fromkeys(names, cap))
    pool = shared.pool
    models = []
    for m, spec in enumerate(specs):
        gs = shared.scopes.groups[m]
        others = sum(f for i, f in enumerate(shared.floor_pages) if i != m)
        room = pool.num_large_pages - others
        short = [shared.policies[g].footprint.peak_pages(args.short_tokens) for g in gs]
        static = KVCacheManager(spec, memory // len(specs), tokens_per_page=args.tokens_per_page)
        ctx = max_context_tokens(static)
        models.append({
            "model": spec.name,
            "groups": [{"name": shared.model.groups[g].name.split("/", 1)[1], "kind": shared.model.groups[g].kind,
                        "page_bytes": pool.page_bytes[g], "small_pages_per_large": pool.small_per_large[g]}
                       for g in gs],
            "max_model_len": spec.max_model_len,
            "shared": {"floor_bytes": shared.model_floor_bytes(spec.name), "max_context_tokens":
                       shared.model_lens[spec.name], "max_bytes": room * pool.large_page_bytes,
                       "max_concurrent_requests": _fit_count(short, [pool.small_per_large[g] for g in gs], room)},
            "static": {"pool_bytes": static.total_bytes, "lcm_page_bytes": static.large_page_bytes,
                       "max_context_tokens": min(ctx or spec.max_model_len, spec.max_model_len, cap or spec.max_model_len),
                       "max_concurrent_requests": max_concurrent_requests(static, args.short_tokens)},
        })
    return {"models": models, "memory_bytes": memory, "lcm_page_bytes": pool.large_page_bytes,
            "num_large_pages": pool.num_large_pages, "total_bytes": pool.total_bytes,
            "short_tokens": args.short_tokens}


def run_multi_plan(args) -> int:
    data = multi_plan_data(args)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from jenga.units import fmt_bytes, fmt_tokens

    con = Console()
    if not con.is_terminal:
        con = Console(width=124)  # the comparison table's nine columns
    con.print(f"one shared pool: KV memory {fmt_bytes(data['memory_bytes'])} = {data['num_large_pages']} large pages "
              f"of {fmt_bytes(data['lcm_page_bytes'])} (one LCM page over every model's groups)")
    g = Table(title="cache groups in the shared pool")
    for col in ("model", "group", "kind", "small page", "per large page"):
        g.add_column(col, justify="right" if col in ("small page", "per large page") else "left")
    for m in data["models"]:
        for gr in m["groups"]:
            g.add_row(m["model"], gr["name"], gr["kind"], fmt_bytes(gr["page_bytes"]), str(gr["small_pages_per_large"]))
    con.print(g)
    t = Table(title=f"shared pool vs static even split (requests of {data['short_tokens']} tokens)")
    for col in ("model", "floor", "KV shared≤", "KV static", "ctx shared", "ctx static", "reqs shared",
                "reqs static", "ratio"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for m in data["models"]:
        sh, st = m["shared"], m["static"]
        ratio = sh["max_concurrent_requests"] / st["max_concurrent_requests"] if st["max_concurrent_requests"] else 0
        t.add_row(m["model"], fmt_bytes(sh["floor_bytes"]), fmt_bytes(sh["max_bytes"]), fmt_bytes(st["pool_bytes"]),
                  fmt_tokens(sh["max_context_tokens"]), fmt_tokens(st["max_context_tokens"]),
                  str(sh["max_concurrent_requests"]), str(st["max_concurrent_requests"]), f"{ratio:.2f}x")
    con.print(t)
    con.print("KV shared≤: what one model may use in the shared pool (all but the other models' floors); its floor "
              "keeps its longest request (ctx shared) servable under any load at the others.  reqs: requests of "
              f"{data['short_tokens']} tokens that fit at once; ratio: reqs shared / reqs static")
    return 0
