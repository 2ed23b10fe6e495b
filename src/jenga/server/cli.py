"""``jenga serve MODEL``: the subcommand (fastapi / uvicorn imported only when it runs)."""

from __future__ import annotations

import argparse
import os

from jenga.errors import InvalidArgumentError


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server on jenga's engine",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", nargs="+", help="local HF model directory, or a built-in tiny model ({tiny}); "
                   "several models share one KV pool, routed by the request's 'model' field")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback unless you say otherwise)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="name clients put in 'model' (default: MODEL)")
    p.add_argument("--kv-memory", default="256MiB", help="KV cache budget, e.g. 2GiB")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="several models: the longest request per model, which sets each model's floor (default: "
                   "the model's own maximum)")
    p.add_argument("--host-kv-memory", default=None,
                   help="a host-memory KV tier behind the device pool, e.g. 8GiB (default: none)")
    p.add_argument("--manager", default="jenga", help="KV-cache manager: {managers}")
    p.add_argument("--tokens-per-page", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=64, help="most requests in the running batch")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    p.add_argument("--max-waiting", type=int, default=256,
                   help="most requests waiting for their first step; beyond it 429 with Retry-After")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger request bodies get 413")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health (or set JENGA_API_KEY); "
                   "a comma-separated list gives one key per tenant, each with its own prefix cache")
    p.add_argument("--random-weights", action="store_true", help="a directory's architecture with random weights")
    p.add_argument("--dtype", default="fp32", help="fp32, bf16, fp16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=run_serve)


def build_app(args):
    from jenga.engine.llm import LLM
    from jenga.server.app import create_app

    if args.max_waiting < 1:
        raise InvalidArgumentError(f"--max-waiting must be >= 1, got {args.max_waiting}")
    models = [args.model] if isinstance(args.model, str) else list(args.model)
    if len(models) > 1:
        return _build_multi_app(args, models)
    args.model = models[0]
    llm = LLM(args.model, manager=args.manager, kv_memory=args.kv_memory, tokens_per_page=args.tokens_per_page,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              random_weights=args.random_weights, dtype=args.dtype, device=args.device, seed=args.seed,
              host_kv_memory=args.host_kv_memory)
    keys = [k.strip() for k in (args.api_key or os.environ.get("JENGA_API_KEY") or "").split(",") if k.strip()]
    return create_app(llm, model_name=args.served_model_name or args.model, api_key=keys,
                      max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes)


def _build_multi_app(args, models: list[str]):
    """Several models in one pool (:mod:`jenga.server.multi_app`)."""
    from jenga.engine.multi_llm import MultiLLM
    from jenga.server.multi_app import create_multi_app

    if args.manager != "jenga" or args.host_kv_memory is not None or args.served_model_name is not None:
        raise InvalidArgumentError("several models share jenga's own pool: --manager, --host-kv-memory and "
                                   "--served-model-name are for one model")
    engine = MultiLLM(models, kv_memory=args.kv_memory, tokens_per_page=args.tokens_per_page,
                      max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      random_weights=args.random_weights, dtype=args.dtype, device=args.device, seed=args.seed,
                      max_model_len=getattr(args, "max_model_len", None))
    keys = [k.strip() for k in (args.api_key or os.environ.get("JENGA_API_KEY") or "").split(",") if k.strip()]
    return create_multi_app(engine, api_key=keys, max_waiting=args.max_waiting, max_body_bytes=args.max_body_bytes)


def startup_line(llm, name: str) -> str:
    """What the KV cache holds, logged once at start: budget, large page, small pages per large
    page of each group, the longest request and how many of the model's length fit at once (and
    the host tier's large pages, with ``--host-kv-memory``)."""
    from jenga.capacity import max_concurrent_requests
    from jenga.units import fmt_bytes

    mgr, limits = llm.manager, llm.limits
    groups = ", ".join(f"{g.name} {k}" for g, k in zip(mgr.model.groups, mgr.pool.small_per_large, strict=True))
    n = limits.model_max_len
    fit = max_concurrent_requests(mgr, n, limits.lookahead)
    return (f"jenga serve: {name} on {llm.device}, manager {mgr.name}: KV budget {fmt_bytes(llm.kv_memory)} = "
            f"{mgr.pool.num_large_pages} large pages of {fmt_bytes(mgr.large_page_bytes)}; small pages per large page: "
            f"{groups}; longest request {limits.max_len} tokens; requests of the model's length ({n} tokens) "
            f"that fit at once: {fit}"
            + (f"; host tier {mgr.host_num_large} large pages" if mgr.host_num_large else ""))


def run_serve(args) -> int:
    import sys

    from jenga.server.launch import bind, serve_forever

    sock = bind(args.host, args.port)  # a port in use is found before the model loads
    try:
        app = build_app(args)
        if hasattr(app.state.service, "models"):  # several models in one pool
            from jenga.server.multi_app import startup_lines

            print("\n".join(startup_lines(app.state.service.engine.llm)), file=sys.stderr, flush=True)
        else:
            print(startup_line(app.state.service.engine.llm, args.served_model_name or args.model),
                  file=sys.stderr, flush=True)
        serve_forever(app, sock, args.log_level)
    finally:
        sock.close()
    return 0
