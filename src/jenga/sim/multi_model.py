"""Several models on one GPU at real sizes: one jenga pool against a static even split.

The simulator's counterpart of ``jenga bench --model A,B`` (:mod:`jenga.multi_bench`): the same
two waves per scenario (``skewed``: 80% of the first wave at the first model, 20% at the second,
then swapped; ``balanced``: even), each wave arriving at once when the previous one is done, served
**shared** by one :class:`~jenga.core.manager.multi_model.MultiModelManager` over the whole KV
budget or **static** by one ``KVCacheManager`` per model with ``budget / len(models)``.  Each model
has its own scheduler (the simulator's, :mod:`jenga.sim.batching`); a step runs one step of every
model with work and costs the sum of their step times (:meth:`Simulator._step_time`, each model's
own cost model: both share the GPU by turns).  The budget is ``memory_budget(gpu, every model's
weights)``; each model's floor covers the workload's longest request.  Requests are ``mmlu-pro``
(short questions) unless ``workload`` names another generator.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jenga.sim.batching import ManagerView, SimScheduler
from jenga.sim.simulator import SimConfig, Simulator

SCENARIOS = {"skewed": (0.8, 0.2), "balanced": (0.5, 0.5)}


class _LaneView(ManagerView):
    """The shared manager as one model's scheduler sees it (``add_request`` names the model)."""

    def __init__(self, mgr, model: str):
        super().__init__(mgr)
        self.model_name = model

    def add_request(self, rid, tokens) -> None:
        self.mgr.add_request(rid, tokens, model=self.model_name)


def _setups(models: list[str], gpu: str, weight_dtype: str = "bf16"):
    from jenga.core.specs import ModelSpec
    from jenga.sim.gpu import get_gpu, memory_budget
    from jenga.sim.setup import build_setup

    setups = []
    for m in models:
        st = build_setup(m, gpu, memory_bytes=1, weight_dtype=weight_dtype)
        spec = ModelSpec.from_hf_config(m, dtype="bf16", tokens_per_page=16, vision=False, name=m)
        setups.append(dataclasses.replace(st, model=spec, target=spec))
    budget = memory_budget(get_gpu(gpu), sum(st.cost.model_info.weight_bytes for st in setups))
    return setups, budget


def _waves(models: list[str], shares, n: int, workload: str, seed: int, **kw):
    from jenga.sim.workloads import get_workload

    out = []
    for w, share in enumerate(shares):
        k = round(share * n)
        counts = [k] + [(n - k) // (len(models) - 1) + (i < (n - k) % (len(models) - 1))
                        for i in range(len(models) - 1)]
        wave = []
        for i, (m, c) in enumerate(zip(models, counts, strict=True)):
            if c:
                reqs = get_workload(workload, num_requests=c, seed=seed + 7 * w + i, **kw)
                wave += [(m, dataclasses.replace(r, request_id=f"{m}/w{w}/{r.request_id}", arrival_s=0.0))
                         for r in reqs]
        out.append(wave)
    return out


def run_multi(kind: str, models: list[str], setups, budget: int, waves, cfg: SimConfig) -> dict:
    """Serve ``waves`` on ``kind`` (``shared`` | ``static``); tokens/s, preemptions, TTFT p50 / p99."""
    from jenga.core.manager.manager import KVCacheManager
    from jenga.core.manager.multi_model import MultiModelManager

    longest = {m: max(r.prompt_len + r.output_len for wave in waves for mm, r in wave if mm == m) for m in models}
    sims = {m: Simulator(st, cfg) for m, st in zip(models, setups, strict=True)}
    if kind == "shared":
        mgr = MultiModelManager([st.model for st in setups], budget, tokens_per_page=cfg.tokens_per_page,
                                max_model_lens=longest)
        views = {m: _LaneView(mgr, m) for m in models}
    else:
        views = {m: ManagerView(KVCacheManager(st.model, budget // len(models), tokens_per_page=cfg.tokens_per_page))
                 for m, st in zip(models, setups, strict=True)}
    scheds = {m: SimScheduler(views[m], max_num_seqs=cfg.max_num_seqs,
                              max_num_batched_tokens=cfg.max_num_batched_tokens) for m in models}
    now, out_tokens, ttft, turn = 0.0, 0, [], 0
    for wave in waves:
        t_wave = now
        tracks: dict[str, dict] = {m: {} for m in models}
        for m, r in wave:
            t = sims[m]._track(r, 0, 0.0)
            tracks[m][r.request_id] = t
            scheds[m].add_sim(t.seq)
        while any(s.has_unfinished for s in scheds.values()):
            turn = (turn + 1) % len(models)
            for m in models[turn:] + models[:turn]:
                sched = scheds[m]
                if not sched.has_unfinished:
                    continue
                if kind == "shared":  # each admission knows who else waits (the pool's fair share)
                    for other, s in scheds.items():
                        mgr.note_waiting(other, len(s.waiting))
                plan = sched.schedule()
                if plan.empty:
                    continue
                now += sims[m]._step_time(plan, tracks[m], 0)
                sampled = []
                for item in plan.scheduled:
                    if not item.sample:
                        sampled.append(None)
                        continue
                    t = tracks[m][item.seq.request_id]
                    if not item.seq.output_token_ids and math.isnan(t.first_token_s):
                        t.first_token_s = now
                        ttft.append(now - t_wave)
                    sampled.append(sims[m]._out_ids(t, 1))
                for seq in sched.update(plan, sampled):
                    out_tokens += len(seq.output_token_ids)
    return {"sim_s": now, "tokens_per_s": out_tokens / now if now else 0.0, "output_tokens": out_tokens,
            "preemptions": sum(s.stats.preemptions for s in scheds.values()),
            "preemptions_by_model": {m: s.stats.preemptions for m, s in scheds.items()},
            "rejected": sum(len(s.rejected) for s in scheds.values()),
            "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else 0.0,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else 0.0}


def simulate_multi(models: list[str], *, gpu: str = "h100-80gb", requests: int = 200, workload: str = "mmlu-pro",
                   scenarios=("skewed", "balanced"), seed: int = 0, config: SimConfig | None = None,
                   weight_dtype: str = "bf16", **workload_kw) -> dict:
    """Every scenario on both pools; the ``--json`` object of ``jenga simulate --model A,B``
    (``weight_dtype``: every model's weights, ``bf16`` or ``fp8``; ``workload_kw``: the workload
    generator's own arguments, e.g. ``output_len``)."""
    cfg = config or SimConfig(seed=seed)
    setups, budget = _setups(models, gpu, weight_dtype)
    out = {"models": models, "gpu": gpu, "weight_dtype": weight_dtype, "memory_bytes": budget,
           "requests_per_wave": requests,
           "workload": workload, "workload_args": workload_kw, "scenarios": {}}
    for sc in scenarios:
        waves = _waves(models, SCENARIOS[sc], requests, workload, seed, **workload_kw)
        res = {kind: run_multi(kind, models, setups, budget, waves, cfg) for kind in ("shared", "static")}
        res["ratio"] = {k: res["shared"][k] / res["static"][k] if res["static"][k] else None
                        for k in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s")}
        out["scenarios"][sc] = res
    return out


def run_multi_simulate(args) -> int:
    """``jenga simulate --model A,B``: the table (or ``--json``) of :func:`simulate_multi`."""
    import json

    from jenga.errors import InvalidArgumentError

    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if len(models) < 2 or len(set(models)) != len(models):
        raise InvalidArgumentError(f"--model needs two or more distinct models, got {args.model!r}")
    scenarios = [s.strip() for s in getattr(args, "scenarios", "skewed,balanced").split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS] or ([] if scenarios else ["(none)"])
    if bad:
        raise InvalidArgumentError(f"unknown scenario(s) {', '.join(bad)}; choose from {', '.join(SCENARIOS)}")
    workload = "mmlu-pro" if args.workload == "decode-batch-20" else args.workload  # the default: short questions
    kw = {} if args.output_len is None else {"output_len": args.output_len}
    cfg = SimConfig(max_num_batched_tokens=args.budget, max_num_seqs=args.max_num_seqs, seed=args.seed,
                    enable_prefix_caching=not args.no_prefix_caching)
    data = simulate_multi(models, gpu=args.gpu, requests=args.requests or 200, workload=workload, seed=args.seed,
                          config=cfg, weight_dtype=args.weight_dtype, scenarios=scenarios, **kw)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    from jenga.units import fmt_bytes

    t = Table(title=f"jenga simulate: {' + '.join(models)} ({data['weight_dtype']} weights) on {data['gpu']}, "
                    f"KV {fmt_bytes(data['memory_bytes'])}, "
                    f"2 waves x {data['requests_per_wave']} {workload} requests")
    for col in ("scenario", "pool", "tokens/s", "preemptions", "TTFT p50", "TTFT p99"):
        t.add_column(col, justify="left" if col in ("scenario", "pool") else "right")
    for sc, res in data["scenarios"].items():
        for kind, label in (("shared", "one shared pool"), ("static", "static even split")):
            r = res[kind]
            t.add_row(sc, label, f"{r['tokens_per_s']:.0f}", str(r["preemptions"]), f"{r['ttft_p50_s']:.2f} s",
                      f"{r['ttft_p99_s']:.2f} s")
        q = res["ratio"]
        t.add_row(sc, "shared / static", f"{q['tokens_per_s']:.2f}x", "", f"{q['ttft_p50_s']:.2f}x",
                  f"{q['ttft_p99_s']:.2f}x")
    con = Console()
    if not con.is_terminal:
        con = Console(width=124)
    con.print(t)
    return 0
