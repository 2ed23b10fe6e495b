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

Two versions replaying one file answer alike exactly when their decisions are the same on it.
Not recorded: the scheduler callbacks of the junction stop and its readers (rows whose model
has state groups: their replay may answer otherwise, and ``play`` says so), and a request's
block hasher (vLLM's block hashes are recorded as they were at each call).
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import pickle
import sys
import tempfile
import time
from pathlib import Path

#: what vLLM's scheduler calls on its KV-cache manager (those the adapter lacks are skipped)
CALLS = ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "take_events", "new_step_starts",
         "get_num_cached_tokens", "get_blocks", "get_block_ids", "take_kv_cache_block_copies",
         "remove_skipped_blocks", "record_prefix_cache_stats")
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
            return type(o)(plain(v) for v in o)
        return o if o is None or isinstance(o, (bool, int, float, str)) else type(o).__name__
    return repr(plain(out))


def record(row: str, path: str) -> None:
    import vllm_side_by_side as sbs
    from vllm_support import close, engine, model_dir

    from jenga.vllm import adapter as adapter_module

    made, log, answers = {}, [], []
    init = adapter_module.JengaKVCacheAdapter.__init__

    def recorded_init(self, plan, kv_cache_config, **kw):
        kept = {k: v for k, v in kw.items() if k not in ("junction_stop", "junction_readers")}
        made["adapter"] = copy.deepcopy((plan, kv_cache_config, kept))
        init(self, plan, kv_cache_config, **kw)
    adapter_module.JengaKVCacheAdapter.__init__ = recorded_init

    def wrap(obj, name: str, target: str) -> None:
        f = getattr(obj, name)

        def call(*a, **k):
            log.append((target, name, [snapshot(x) for x in a], {kk: snapshot(v) for kk, v in k.items()}))
            out = f(*a, **k)
            answers.append(answer(out, name, a))
            return out
        setattr(obj, name, call)

    counters = sbs.Counters

    def hooked(sched):
        kv = sched.kv_cache_manager
        adm, wait = sched.admission, sched.prefix_wait
        made["hooks"] = (None if adm is None else (adm.window, adm.deepest),
                         None if wait is None else (wait.step_tokens, wait.priced))
        for name in CALLS:
            if getattr(type(kv), name, None):
                wrap(kv, name, "adapter")
        if adm is not None:
            wrap(adm, "reorder", "admission")
        if wait is not None:
            wrap(wait, "holds", "prefix_wait")
        if sched.next_use is not None:
            for name in ("arrive", "leave", "admitted"):
                wrap(sched.next_use, name, "next_use")
        return counters(sched)
    sbs.Counters = hooked
    family, kw, rounds_fn, budgets = sbs.rows(False)[row]
    model = model_dir(family, Path(tempfile.mkdtemp(prefix="jenga-replay-")))
    llm = engine(model, jenga=True, num_blocks=budgets[0], max_model_len=sbs.longest(rounds_fn),
                 **{"dtype": "float32", "max_num_batched_tokens": 128, **kw})
    r = sbs.run(llm, rounds_fn())
    close(llm)
    with open(path, "wb") as fh:
        pickle.dump(dict(adapter=made["adapter"], hooks=made["hooks"], log=log, answers=answers), fh)
    print(f"{row}: {len(log)} calls recorded to {path}; prompt computed {r['computed']}/{r['prompt']}, "
          f"preempt {r['preempt']}, hits per round {r['rounds']}")


def replay(trace: dict, profile=None) -> tuple[float, list[str]]:
    """Make the recorded calls on a fresh adapter: (thread CPU seconds inside them, answers)."""
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue
    from vllm.v1.request import Request
    from vllm.v1.utils import ConstantList

    from jenga.vllm.adapter import JengaKVCacheAdapter
    from jenga.vllm.admission import HitsFirst
    from jenga.vllm.prefix_wait import PrefixWait

    plan, kv_cache_config, kw = copy.deepcopy(trace["adapter"])
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
        if type(x) is tuple and x and x[0] == "queue":
            q = FCFSRequestQueue()
            q.extend(live(s) for s in x[1])
            return q
        return x

    total, answers, clock = 0.0, [], time.thread_time
    gc.collect()
    gc.disable()
    try:
        for target, name, a, k in trace["log"]:
            args, kwargs = [live(x) for x in a], {kk: live(v) for kk, v in k.items()}
            f = getattr(targets[target], name)
            if profile is not None:
                profile.enable()
            t = clock()
            out = f(*args, **kwargs)
            total += clock() - t
            if profile is not None:
                profile.disable()
            answers.append(answer(out, name, args))
    finally:
        gc.enable()
    return total, answers


def play(path: str, reps: int, calls: bool) -> None:
    with open(path, "rb") as fh:
        trace = pickle.load(fh)
    steps = sum(name == "new_step_starts" for _, name, _, _ in trace["log"])
    times = []
    for _ in range(reps):
        t, answers = replay(trace)
        times.append(t)
        if answers != trace["answers"]:
            i = next(i for i, (a, b) in enumerate(zip(answers, trace["answers"], strict=True)) if a != b)
            print(f"call {i} ({trace['log'][i][1]}) answers {answers[i][:200]}, recorded {trace['answers'][i][:200]}")
            sys.exit(1)
    times.sort()
    digest = hashlib.sha256(repr(answers).encode()).hexdigest()[:12]
    print(f"{path}: {len(answers)} calls, {steps} steps, every answer as recorded ({digest}); jenga CPU "
          f"{1e6 * times[0] / steps:.1f} us/step best, {1e6 * times[len(times) // 2] / steps:.1f} median of {reps} "
          f"(a timer read of about 1 us per call included)")
    if calls:
        import cProfile
        import pstats
        prof = cProfile.Profile()
        replay(trace, prof)
        stats = pstats.Stats(prof).stats
        here = str(Path(__file__).resolve())
        python = sum(v[1] for (file, _, fn), v in stats.items() if file != "~" and file != here)
        builtin = sum(v[1] for (file, _, fn), v in stats.items() if file == "~" and "thread_time" not in fn)
        print(f"calls per scheduler step: {python / steps:.1f} Python, {builtin / steps:.1f} builtin")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run a row with jenga and record its calls")
    rec.add_argument("row", help="a row of vllm_side_by_side.py: articles, hybrid, hybrid32, chat, control")
    rec.add_argument("file")
    pl = sub.add_parser("play", help="replay recorded calls on the jenga on sys.path")
    pl.add_argument("file")
    pl.add_argument("--reps", type=int, default=15)
    pl.add_argument("--calls", action="store_true", help="also count the calls per step (one more replay)")
    args = ap.parse_args(argv)
    if args.cmd == "record":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        record(args.row, args.file)
    else:
        play(args.file, args.reps, args.calls)


if __name__ == "__main__":
    main()
