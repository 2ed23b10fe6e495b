"""jenga's side of a vLLM row on its own: the KV-cache calls of one run, recorded, then replayed.

``record ROW FILE`` runs one row of ``vllm_side_by_side.py`` with jenga (the engine and budget of
``vllm_sched_calls.py``) and stores every call vLLM's scheduler makes on jenga's adapter and hooks
(``HitsFirst.reorder``, ``PrefixWait.holds``, the common-prefix predictor's ``arrive`` / ``leave`` /
``admitted``), each with a copy of the requests as the call saw them and its answer, and the
adapter's construction arguments.  ``play FILE`` builds a fresh adapter on the jenga on
``sys.path``, makes the same calls, checks every answer equals the recorded one, and prints
jenga's thread CPU time per scheduler step (best and median of ``--reps``; nothing of vLLM's
runs in between) and, with ``--calls``, the Python and builtin calls per step (cProfile's count,
the same on every run: what a change of the per-step work shows on a shared machine, where the
live figure of ``vllm_sched_calls.py`` moves by a third from run to run)::

    .venv/bin/python benchmarks/vllm_replay.py record control /tmp/control.trace
    PYTHONPATH=src .venv/bin/python benchmarks/vllm_replay.py play /tmp/control.trace --calls
    PYTHONPATH=/another/checkout/src .venv/bin/python benchmarks/vllm_replay.py play /tmp/control.trace --calls

``record ROW FILE --stock`` records vLLM's own ``KVCacheManager`` on the same row instead (its
construction arguments, every call the scheduler makes on it and the blocks the scheduler hands back
to its block pool itself; ``--args`` adds engine arguments, e.g. the retention setting that won the
row, ``--blocks`` sets the budget), and ``play`` replays it on a fresh manager of the vLLM on the
path, every block id checked.  ``play STOCK JENGA`` replays the two in turns and prints jenga's CPU
per step over stock's: the manager's side of the scheduler's cost, both in one run, without vLLM's
own scheduler code in between (what ``vllm_sched_calls.py`` measures live, with it)::

    .venv/bin/python benchmarks/vllm_replay.py record control /tmp/control-stock.trace --stock
    PYTHONPATH=src .venv/bin/python benchmarks/vllm_replay.py play /tmp/control-stock.trace /tmp/control.trace

Two versions replaying one file answer alike exactly when their decisions are the same on it.
The junction stop's answers (they read the scheduler) are recorded and replayed in order, so
rows with state groups replay too.  Not recorded: a request's block hasher (vLLM's block hashes
are recorded as they were at each call).
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import pickle
import sys
import tempfile
import time
from pathlib import Path

#: what vLLM's scheduler calls on its KV-cache manager (those the adapter lacks are skipped)
CALLS = ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "take_events", "new_step_starts",
         "get_num_cached_tokens", "get_blocks", "get_block_ids", "take_kv_cache_block_copies",
         "remove_skipped_blocks", "record_prefix_cache_stats", "pop_blocks_for_free", "take_new_block_ids",
         "estimate_cached_tokens", "get_block_ids_for_computed_tokens", "truncate_computed_blocks", "evict_blocks",
         "record_blocks_for_zeroing", "make_prefix_cache_stats", "take_boundary_state_offloads",
         "finalize_partial_tail_offloads", "reset_prefix_cache")
#: request fields rebuilt at replay (the token lists and their read-only views) or not stored
REBUILT = ("all_token_ids", "output_token_ids", "_all_token_ids", "_output_token_ids", "_block_hasher")
SHARED = ("sampling_params", "pooling_params")


def snapshot(x):
    """A call's argument as stored: a vLLM request or waiting queue by value, anything else as is."""
    kind = type(x).__name__
    if kind == "Request":
        fields = {k: v for k, v in x.__dict__.items() if k not in REBUILT}
        memo = {id(fields[k]): fields[k] for k in SHARED if k in fields}
        return ("request", x.request_id, copy.deepcopy(fields, memo), list(x._all_token_ids),
                list(x._output_token_ids))
    if kind == "FCFSRequestQueue":
        return ("queue", [snapshot(r) for r in x])
    if kind == "list":  # vLLM's blocks by id; any other list as it was at the call (block hashes grow later)
        return ("blocks", [b.block_id for b in x]) if x and type(x[0]).__name__ == "KVCacheBlock" else list(x)
    if kind == "KVCacheBlocks" and type(x).__module__.startswith("vllm."):  # per group, by id
        return ("kv_blocks", [[b.block_id for b in group] for group in x.blocks])
    return x


def answer(out, call: str, args) -> str:
    """A call's answer as compared: block ids, hits, booleans; a reorder's queue order (request ids
    without vLLM's random suffix)."""
    if call == "reorder":
        return repr([r.request_id.rsplit("-", 1)[0] for r in args[0]])

    def plain(o):
        if hasattr(o, "get_block_ids"):
            return "blocks", o.get_block_ids()
        if isinstance(o, (tuple, list)):
            if hasattr(o, "_fields"):  # a named tuple (vLLM's block copies)
                return type(o)(*(plain(v) for v in o))
            return type(o)(plain(v) for v in o)
        return o if o is None or isinstance(o, (bool, int, float, str)) else type(o).__name__
    return repr(plain(out))


class RecordedStop:
    """A junction stop (``jenga.vllm.junction_stop.JunctionStop``) whose answers are kept in order
    (each reads the scheduler: its readers, its request count)."""

    def __init__(self, stop, answers: list):
        self._stop, self.answers = stop, answers

    def stop(self, *a):
        out = self._stop.stop(*a)
        self.answers.append(out)
        return out


class PlayedStop:
    """The recorded junction stop's answers, in order (a replay that asks more left the recorded run)."""

    def __init__(self, answers: list):
        self._answers = iter(answers)

    def stop(self, *a):
        return next(self._answers)


def record(row: str, path: str, *, stock: bool = False, extra: dict | None = None, blocks: int | None = None) -> None:
    """Run ``row`` (at ``blocks`` vLLM blocks, default its first budget) with jenga, or with vLLM's own
    manager (``stock``), ``extra`` engine arguments on top of the row's, and store every call vLLM's
    scheduler makes on the KV-cache manager (and jenga's hooks)."""
    import vllm_side_by_side as sbs
    from vllm.v1.core import kv_cache_manager as vllm_manager
    from vllm_support import close, engine, model_dir

    from jenga.vllm import adapter as adapter_module

    made, log, answers = {}, [], []
    if not stock:
        init = adapter_module.JengaKVCacheAdapter.__init__

        def recorded_init(self, plan, kv_cache_config, **kw):
            kept = {k: v for k, v in kw.items() if k not in ("junction_stop", "junction_readers")}
            made["adapter"] = copy.deepcopy((plan, kv_cache_config, kept))
            stop = kw.get("junction_stop")
            if stop is not None:  # the junction stop's answers read the scheduler: kept, replayed in order
                made["junction"] = stops = []
                kw["junction_stop"] = RecordedStop(stop, stops)
            init(self, plan, kv_cache_config, **kw)
        adapter_module.JengaKVCacheAdapter.__init__ = recorded_init
    else:
        init = vllm_manager.KVCacheManager.__init__

        def recorded_init(self, *a, **kw):  # vLLM's manager: its arguments but the metrics collector
            made["stock"] = copy.deepcopy((a, {k: v for k, v in kw.items() if k != "metrics_collector"}))
            init(self, *a, **kw)
        vllm_manager.KVCacheManager.__init__ = recorded_init

    depth = [0]  # a recorded call made inside another (vLLM's manager calls its own methods) is not recorded

    def wrap(obj, name: str, target: str) -> None:
        f = getattr(obj, name)

        def call(*a, **k):
            if depth[0]:
                return f(*a, **k)
            log.append((target, name, [snapshot(x) for x in a], {kk: snapshot(v) for kk, v in k.items()}))
            depth[0] += 1
            try:
                out = f(*a, **k)
            finally:
                depth[0] -= 1
            answers.append(answer(out, name, a))
            return out
        setattr(obj, name, call)

    counters = sbs.Counters

    def hooked(sched):
        kv = sched.kv_cache_manager
        adm, wait = getattr(sched, "admission", None), getattr(sched, "prefix_wait", None)
        made["hooks"] = (None if adm is None else (adm.window, adm.deepest),
                         None if wait is None else (wait.step_tokens, wait.priced))
        for name in CALLS:
            if getattr(type(kv), name, None):
                wrap(kv, name, "adapter")
        if stock:  # the scheduler returns deferred blocks to vLLM's pool itself
            free_blocks = kv.block_pool.free_blocks
            kv.block_pool.free_blocks = lambda blocks: free_blocks(list(blocks))
            wrap(kv.block_pool, "free_blocks", "block_pool")
        if adm is not None:
            wrap(adm, "reorder", "admission")
        if wait is not None:
            wrap(wait, "holds", "prefix_wait")
        if getattr(sched, "next_use", None) is not None:
            for name in ("arrive", "leave", "admitted"):
                wrap(sched.next_use, name, "next_use")
        return counters(sched)
    sbs.Counters = hooked
    family, kw, rounds_fn, budgets = sbs.rows(False)[row]
    model = model_dir(family, Path(tempfile.mkdtemp(prefix="jenga-replay-")))
    try:
        llm = engine(model, jenga=not stock, num_blocks=blocks or budgets[0], max_model_len=sbs.longest(rounds_fn),
                     **{"dtype": "float32", "max_num_batched_tokens": 128, **kw, **(extra or {})})
        r = sbs.run(llm, rounds_fn())
        close(llm)
    finally:
        (vllm_manager.KVCacheManager if stock else adapter_module.JengaKVCacheAdapter).__init__ = init
    with open(path, "wb") as fh:
        pickle.dump(dict(adapter=made.get("adapter"), stock=made.get("stock"), hooks=made["hooks"], log=log,
                         answers=answers, junction=made.get("junction")), fh)
    print(f"{row} {'stock' if stock else 'jenga'}: {len(log)} calls recorded to {path}; prompt "
          f"computed {r['computed']}/{r['prompt']}, preempt {r['preempt']}, hits per round {r['rounds']}")


def replay(trace: dict, profile=None, per_call: dict | None = None) -> tuple[float, list[str]]:
    """Make the recorded calls on a fresh manager (jenga's adapter, or vLLM's own ``KVCacheManager``
    for a trace recorded with ``--stock``): (thread CPU seconds inside them, answers).  ``per_call``
    (a dict, filled): per call name, ``allocate_slots`` by kind (``allocation_kind``), the seconds
    spent and the number of calls."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.request import Request
    from vllm.v1.utils import ConstantList

    if trace.get("stock") is not None:
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        a, kw = copy.deepcopy(trace["stock"])
        manager = KVCacheManager(*a, **kw)
        targets = {"adapter": manager, "block_pool": manager.block_pool}
    else:
        from jenga.vllm.adapter import JengaKVCacheAdapter
        from jenga.vllm.admission import HitsFirst
        from jenga.vllm.prefix_wait import PrefixWait

        plan, kv_cache_config, kw = copy.deepcopy(trace["adapter"])
        if trace.get("junction") is not None:
            kw["junction_stop"] = PlayedStop(trace["junction"])
        kv = JengaKVCacheAdapter(plan, kv_cache_config, **kw)
        adm, wait = trace["hooks"]
        options = kw.get("eviction_options")
        targets = {"adapter": kv, "next_use": None if options is None else options.next_use,
                   "admission": None if adm is None else HitsFirst(kv.get_num_cached_tokens, window=adm[0],
                                                                    deepest=adm[1], version=kv.cache_version),
                   "prefix_wait": None if wait is None else PrefixWait(kv.get_num_cached_tokens, kv.writes_in_flight,
                                                                       step_tokens=wait[0], priced=wait[1])}
    requests: dict[str, Request] = {}  # one object per request id, as in vLLM (identity matters to HitsFirst)

    def live(x):
        if type(x) is tuple and x and x[0] == "request":
            _, rid, fields, tokens, outputs = x
            r = requests.get(rid)
            if r is None:
                r = requests[rid] = object.__new__(Request)
            hashes = r.__dict__.get("block_hashes")
            r.__dict__.update(fields)
            if hashes is not None:  # jenga reads the request's live list of block hashes
                hashes[:] = fields["block_hashes"]
                r.block_hashes = hashes
            r._all_token_ids, r._output_token_ids = list(tokens), list(outputs)
            r.all_token_ids, r.output_token_ids = ConstantList(r._all_token_ids), ConstantList(r._output_token_ids)
            return r
        if type(x) is tuple and x and x[0] == "blocks":
            return [targets["block_pool"].blocks[i] for i in x[1]]
        if type(x) is tuple and x and x[0] == "kv_blocks":
            from vllm.v1.core.kv_cache_manager import KVCacheBlocks
            pool = targets["block_pool"].blocks
            return KVCacheBlocks(tuple([pool[i] for i in group] for group in x[1]))
        if type(x) is tuple and x and x[0] == "queue":
            q = FCFSRequestQueue()
            q.extend(live(s) for s in x[1])
            return q
        return x

    total, answers, clock = 0.0, [], time.thread_time
    placed: set[str] = set()  # requests with an allocation that succeeded since their last free
    gc.collect()
    gc.disable()
    try:
        for target, name, a, k in trace["log"]:
            args, kwargs = [live(x) for x in a], {kk: live(v) for kk, v in k.items()}
            f = getattr(targets[target], name)
            if profile is not None:
                profile.enable()
            t = clock()
            try:
                out = f(*args, **kwargs)
            except Exception as e:  # the replay left the recorded run: that call's answer is the error
                out = f"raised {type(e).__name__}: {e}"
            spent = clock() - t
            total += spent
            if per_call is not None:
                key = allocation_kind(placed, name, args, kwargs, out) if name in ("allocate_slots", "free") else name
                t_n = per_call.get(key, (0.0, 0))
                per_call[key] = (t_n[0] + spent, t_n[1] + 1)
            if profile is not None:
                profile.disable()
            answers.append(answer(out, name, args))
    finally:
        gc.enable()
    return total, answers


def allocation_kind(placed: set[str], name: str, args: list, kwargs: dict, out) -> str:
    """The name ``--per-call`` files an ``allocate_slots`` call under, by what it asked, the same for
    both engines: ``first`` (no allocation of the request since it was added or freed: an admission),
    ``decode`` (one token), else ``chunk`` (a prefill chunk, or decode with speculative tokens);
    ``refused`` where it answered no blocks.  ``placed`` (request ids with an allocation since their
    last free) is updated here, also by ``free``."""
    rid = args[0].request_id
    if name == "free":
        placed.discard(rid)
        return name
    n = args[1] if len(args) > 1 else kwargs.get("num_new_tokens")
    kind = "first" if rid not in placed else "decode" if n == 1 else "chunk"
    if out is None or (isinstance(out, str) and out.startswith("raised ")):  # the replay's text of an error
        return f"{name} {kind} refused"
    placed.add(rid)
    return f"{name} {kind}"


def play(paths: list[str], reps: int, calls: bool, per_call: bool = False) -> list[tuple[int, float, float]]:
    """Replay each trace ``reps`` times, the traces taking turns (a load change of the machine
    falls on all of them alike); with two traces, the second's CPU per step over the first's.
    Per trace: (steps, best, median µs per step)."""
    traces = []
    for path in paths:
        with open(path, "rb") as fh:
            traces.append(pickle.load(fh))
    times = [[] for _ in traces]
    answers = [None] * len(traces)
    spent: list[dict[str, float]] = [{} for _ in traces]  # per call name: the least of any rep
    kinds: list[dict[str, int]] = [{} for _ in traces]  # per call name: calls (the same in every rep)
    for _ in range(reps):
        for n, trace in enumerate(traces):
            this: dict[str, tuple[float, int]] = {}
            t, answers[n] = replay(trace, per_call=this)
            for name, (v, k) in this.items():
                spent[n][name] = min(v, spent[n].get(name, v))
                kinds[n][name] = k
            times[n].append(t)
            if answers[n] != trace["answers"]:
                i = next(i for i, (a, b) in enumerate(zip(answers[n], trace["answers"], strict=True)) if a != b)
                print(f"{paths[n]}: call {i} ({trace['log'][i][1]}) answers {answers[n][i][:200]}, recorded "
                      f"{trace['answers'][i][:200]}")
                sys.exit(1)
    per_step = []
    for n, (path, trace, ts, ans) in enumerate(zip(paths, traces, times, answers, strict=True)):
        steps = sum(name == "new_step_starts" for _, name, _, _ in trace["log"])
        ts.sort()
        best, median = 1e6 * ts[0] / steps, 1e6 * ts[len(ts) // 2] / steps
        per_step.append((steps, best, median))
        who = "stock" if trace.get("stock") is not None else "jenga"
        digest = hashlib.sha256(repr(ans).encode()).hexdigest()[:12]
        print(f"{path}: {len(ans)} calls, {steps} steps, every answer as recorded ({digest}); {who} CPU "
              f"{best:.1f} us/step best, {median:.1f} median of {reps} (a timer read of about 1 us per call included)")
        if per_call:
            counts = kinds[n]
            for name, v in sorted(spent[n].items(), key=lambda x: -x[1]):
                print(f"  {name:34s} {counts[name]:6d} calls {1e6 * v / steps:7.1f} us/step {1e6 * v / counts[name]:7.1f} "
                      "us/call (least of the reps)")
        if calls:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            replay(trace, prof)
            stats = pstats.Stats(prof).stats
            here = str(Path(__file__).resolve())
            python = sum(v[1] for (file, _, fn), v in stats.items() if file != "~" and file != here)
            builtin = sum(v[1] for (file, _, fn), v in stats.items() if file == "~" and "thread_time" not in fn)
            print(f"  calls per scheduler step: {python / steps:.1f} Python, {builtin / steps:.1f} builtin")
    if len(paths) == 2:
        (_, b0, m0), (_, b1, m1) = per_step
        print(f"{paths[1]} / {paths[0]} CPU per step: {b1 / b0:.2f}x best, {m1 / m0:.2f}x median")
    return per_step


#: the rows of ``vllm_side_by_side.py`` (row, budget in blocks) with the stock setting that won each
#: (``vllm_side_by_side.stock_settings`` names it; the generated block in docs/vllm.md shows the win, and
#: ``tests/test_vllm_replay.py`` checks the two agree).  ``hybrid`` runs the engines of ``hybrid32``
#: (a 32-token match unit on both), so that row stands for both.
TABLE_ROWS = [("articles", 168, "retention 0"), ("articles", 252, "retention 0"),
              ("articles", 336, "retention 4 blocks"), ("articles", 504, "retention 4 blocks"),
              ("hybrid32", 36, "retention 0"), ("chat", 252, "dense"), ("control", 28, "default")]


def table(reps: int) -> None:
    """Every row of ``TABLE_ROWS`` recorded with both engines and replayed in turns: a markdown table of
    the KV-cache manager's CPU per scheduler step (jenga's with its scheduler hooks), stock against jenga."""
    import vllm_side_by_side as sbs
    out = ["| workload | blocks | stock setting | steps stock / jenga | µs/step stock / jenga, best "
           f"of {reps} | jenga / stock, best | jenga / stock, median |", "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="jenga-replay-") as d:
        for row, blocks, label in TABLE_ROWS:
            family, kw, _, _ = sbs.rows(False)[row]
            s, j = f"{d}/{row}-{blocks}-stock.trace", f"{d}/{row}-{blocks}-jenga.trace"
            record(row, s, stock=True, extra=sbs.stock_settings(row, family, kw)[label], blocks=blocks)
            record(row, j, blocks=blocks)
            (ss, sb, sm), (js, jb, jm) = play([s, j], reps, False)
            out.append(f"| {row} | {blocks} | {label} | {ss} / {js} | {sb:.1f} / {jb:.1f} | {jb / sb:.2f}x | "
                       f"{jm / sm:.2f}x |")
    print("\n".join(out))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run a row with jenga (or stock vLLM) and record its calls")
    rec.add_argument("row", help="a row of vllm_side_by_side.py: articles, hybrid, hybrid32, chat, control")
    rec.add_argument("file")
    rec.add_argument("--stock", action="store_true", help="record vLLM's own manager instead of jenga")
    rec.add_argument("--args", default="{}", help="extra engine arguments (JSON, e.g. "
                     "'{\"prefix_cache_retention_interval\": null}')")
    rec.add_argument("--blocks", type=int, default=None, help="the budget in vLLM blocks (default the row's first)")
    pl = sub.add_parser("play", help="replay recorded calls on the jenga on sys.path (or vLLM's manager)")
    pl.add_argument("file", nargs="+", help="one trace, or several replayed in turns (two: a ratio)")
    pl.add_argument("--reps", type=int, default=15)
    pl.add_argument("--calls", action="store_true", help="also count the calls per step (one more replay)")
    pl.add_argument("--per-call", action="store_true", help="also the CPU per step of each call name "
                    "(allocate_slots by kind: first allocation, prefill chunk, decode; refused or not)")
    tb = sub.add_parser("table", help="every row, both engines recorded and replayed in turns: a markdown table")
    tb.add_argument("--reps", type=int, default=25)
    args = ap.parse_args(argv)
    if args.cmd in ("record", "table"):
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    if args.cmd == "record":
        record(args.row, args.file, stock=args.stock, extra=json.loads(args.args), blocks=args.blocks)
    elif args.cmd == "table":
        table(args.reps)
    else:
        play(args.file, args.reps, args.calls, args.per_call)


if __name__ == "__main__":
    main()
