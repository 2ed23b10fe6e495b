"""A seeded operation fuzz of every manager: random add / lookup / cached_tokens / shrink_hit /
can_allocate / allocate (with a speculative lookahead) / append / free / reset_prefix_cache / copy
plans, ``check_integrity()`` after every operation.

Besides integrity (free + used + cached == total, refcounts match tables, every cached page indexed,
both tiers), each operation checks its contract: ``can_allocate`` answers what ``allocate`` then does;
``cached_tokens`` answers what ``lookup`` then finds (device tier; with a host tier the lookup may
find more, never less); an ``allocate`` returning ``None`` leaves the pool's counts unchanged; once
everything is freed no byte is used.  The call sequences are the engine scheduler's (a hit, prefill
chunks, decode steps) and its speculative decoder's (every decode step reserves ``k`` draft slots,
then appends 1..k+1 accepted tokens and may count kept drafts as computed with a second allocate),
which is also what vLLM's adapter asks of the manager (``get_computed_blocks`` -> ``cached_tokens`` /
``lookup`` / ``shrink_hit``, ``allocate_slots`` -> ``can_allocate`` / ``allocate`` with a lookahead,
``free``, ``reset_prefix_cache``).

``python tests/op_fuzz.py --ops N [--seed S] [--workers W]`` runs the long version and prints the
operation count and the violations; ``tests/test_op_fuzz.py`` runs a seeded slice
(``JENGA_FUZZ_OPS`` operations in all, default 100,000).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import chunked, cross, full, group, mamba, model, sliding, vision  # noqa: E402

from jenga.baselines import make_manager  # noqa: E402
from jenga.capacity import max_context_tokens  # noqa: E402
from jenga.core.manager.multi_model import MultiModelManager  # noqa: E402
from jenga.core.specs import ModelSpec  # noqa: E402

TPP = 2
MAX_LEN = 48
BASES = [list(range(1, 25)), list(range(1, 9)) + list(range(40, 56)), list(range(60, 84))]
MANAGERS = ("jenga", "paged", "static", "uniform", "multi")
#: the multi-model pool serves two models: the configuration's layer mix and this one
MULTI_OTHER = {"full+swa": "full+mamba"}


@functools.lru_cache(maxsize=1)
def specs() -> dict:
    m = lambda *g: model(*g, max_len=MAX_LEN)  # noqa: E731
    return {
        "full": m(group("full", full(), 2)),
        "full+swa": m(group("full", full(), 1), group("swa", sliding(3), 2, 1)),
        "full+chunked": m(group("full", full(), 2), group("chunk", chunked(4), 1, 2)),
        "full+mamba": m(group("full", full(), 1), group("mamba", mamba(4, 96), 2, 1)),
        "full+cross": m(group("self", full(), 3), group("cross", cross(), 2, 3)),
        "full+swa+vision": m(group("full", full(), 1), group("swa", sliding(4), 2, 1), group("vis", vision(64), 1, 3)),
    }


LARGE_PAGE: dict = {}


def named(spec, name: str):
    """``spec`` as model ``name`` (its cache specs naming the model too), for the multi-model pool."""
    groups = tuple(dataclasses.replace(g, spec=dataclasses.replace(g.spec, model=name)) for g in spec.groups)
    return ModelSpec(name, groups, spec.max_model_len, spec.num_layers)


def multi_models(spec_name: str) -> tuple:
    """The two models of the multi-model pool of configuration ``spec_name``."""
    other = MULTI_OTHER.get(spec_name, "full+swa")
    return named(specs()[spec_name], "a"), named(specs()[other], "b")


def make(name: str, spec_name: str, memory: int, **kw):
    """A manager of kind ``name`` (``MANAGERS``) for the layer mix ``spec_name``."""
    if name == "multi":
        kw.pop("eviction", None)
        return MultiModelManager(multi_models(spec_name), memory, **kw)
    return make_manager(name, specs()[spec_name], memory, **kw)


@functools.lru_cache(maxsize=None)
def min_large(name: str, spec_name: str, caching: bool) -> int:
    """The fewest large pages whose pool holds one ``MAX_LEN``-token request alone (for the
    multi-model pool: both models' floors)."""
    kw = dict(tokens_per_page=TPP, enable_prefix_caching=caching, fit_pages=False, window_slack=0)
    big = make(name, spec_name, 1 << 24, **kw)
    lp = LARGE_PAGE.setdefault((name, spec_name), big.large_page_bytes)
    if name == "multi":
        return sum(big.floor_pages)
    for n in range(1, 400):
        cap = max_context_tokens(make(name, spec_name, (n + 1) * lp, **kw))
        if cap is None or cap >= MAX_LEN:
            return n
    raise AssertionError(f"{name}: no pool holds a {MAX_LEN}-token request")


def build(name: str, spec_name: str, rng: random.Random, host: bool):
    """A manager of kind ``name`` whose pool holds one ``MAX_LEN`` request alone, plus 0-4 large pages."""
    caching = rng.random() < 0.85
    kw = dict(tokens_per_page=TPP, enable_prefix_caching=caching, fit_pages=False, window_slack=0,
              eviction=rng.choice(["lru", "reuse", "predict"]) if name == "jenga" else None)
    n = min_large(name, spec_name, caching)
    lp = LARGE_PAGE[(name, spec_name)]
    n += rng.randrange(0, 5)
    if host:  # 1-5 large pages: small enough that the host evicts too
        kw["host_memory_bytes"] = rng.randrange(1, 6) * lp
    return make(name, spec_name, (n + 1) * lp, **kw)


class Fuzz:
    """One manager under ``ops`` random operations (module doc); ``seen`` counts what happened."""

    def __init__(self, name: str, spec_name: str, seed: int, *, host: bool, k: int, keep_drafts: bool = True):
        self.keep_drafts = keep_drafts
        self.state = spec_name in STATE_SPECS or (name == "multi" and MULTI_OTHER.get(spec_name) in STATE_SPECS)
        self.rng = rng = random.Random(seed)
        self.mgr = build(name, spec_name, rng, host)
        self.host, self.k = host, k
        self.live: dict[int, dict] = {}  # rid -> {"tokens", "computed", "allocated"}
        self.next_id = 0
        self.seen: Counter = Counter()
        self.done = 0  # operations run
        self.models = self.mgr.model_names if name == "multi" else None
        self._host_seen: dict[str, int] = {}

    # ------------------------------------------------------------------ operations
    def add(self):
        rng, mgr = self.rng, self.mgr
        prompt = rng.choice(BASES)[:rng.randrange(1, 21)] + [rng.randrange(0, 5) for _ in range(rng.randrange(0, 5))]
        prompt = prompt or [1]
        rid = self.next_id
        self.next_id += 1
        salt = rng.choice([None, None, None, "tenant"])
        if self.models:
            mgr.add_request(rid, prompt, cache_salt=salt, model=rng.choice(self.models))
        else:
            mgr.add_request(rid, prompt, cache_salt=salt)
        self.live[rid] = {"tokens": len(prompt), "computed": 0, "allocated": False}
        if rng.random() < 0.8:
            self.lookup(rid)

    def lookup(self, rid):
        mgr, st = self.mgr, self.live[rid]
        cap = self.rng.choice([None, None, self.rng.randrange(0, MAX_LEN)])
        peek = mgr.cached_tokens(rid, max_tokens=cap)
        hit = mgr.lookup(rid, max_tokens=cap)
        if self.models:  # the floors may shorten a hit (MultiModelManager._hit_within_floors)
            assert hit <= peek, f"cached_tokens {peek} but lookup {hit} with several models"
            self.seen["hit shortened by floors"] += hit < peek
        elif mgr.host is None:
            assert hit == peek, f"cached_tokens {peek} but lookup {hit}"
        else:
            assert hit >= peek, f"cached_tokens {peek} but lookup {hit} with a host tier"
        st["computed"] = hit
        self.seen["hit"] += hit > 0
        if hit and self.rng.random() < 0.2:
            st["computed"] = mgr.shrink_hit(rid, self.rng.randrange(0, hit + 1))
            self.seen["shrunk"] += 1

    def step(self, rid):
        """One scheduler step of ``rid``: a prefill chunk, or a decode step with draft slots."""
        rng, mgr, st = self.rng, self.mgr, self.live[rid]
        left = st["tokens"] - st["computed"]
        if st["tokens"] >= MAX_LEN - 1:
            return self.free(rid)
        decoding = left == 1
        n = 1 if decoding else rng.randrange(1, left + 1)
        la = min(self.k, MAX_LEN - st["computed"] - n) if decoding and self.k else 0
        n = mgr.chunk_tokens(rid, n) or n
        if not st["allocated"]:
            n = min(n, left)
        before = self._counts()
        want = mgr.can_allocate(rid, n, num_lookahead=la)
        t = mgr.allocate(rid, n, num_lookahead=la)
        assert (t is not None) == want, f"can_allocate {want} but allocate {t is not None} ({n} tokens, lookahead {la})"
        if t is None:
            assert self._counts() == before, "an allocate returning None changed the pool"
            self.seen["none"] += 1
            if not st["allocated"]:
                return self.free(rid)
            return
        st["allocated"] = True
        st["computed"] += n
        if st["computed"] < st["tokens"]:
            mgr.append_tokens(rid, [])
            return
        room = MAX_LEN - st["tokens"]
        toks = [rng.randrange(0, 5) for _ in range(min(room, 1 + (rng.randrange(0, la + 1) if la else 0)))]
        mgr.append_tokens(rid, toks)
        st["tokens"] += len(toks)
        # the speculative decoder counts kept drafts as computed (their slots were reserved): at most
        # the accepted ones, and one draft fewer than it proposed (the last one's K/V was not written)
        most = min(len(toks) - 1, la - 1)
        keep = rng.randrange(0, most + 1) if self.keep_drafts and most > 0 and rng.random() < 0.5 else 0
        if keep:
            left_la = max(0, min(self.k, MAX_LEN - st["computed"]) - keep)
            before = self._counts()
            if mgr.allocate(rid, keep, num_lookahead=left_la) is not None:
                mgr.append_tokens(rid, [])
                st["computed"] += keep
                self.seen["kept drafts"] += 1
            else:  # a state group needs a page the pool has not left (the engine feeds them again)
                assert self.state, "kept drafts' slots were not held"
                assert self._counts() == before, "an allocate returning None changed the pool"
                self.seen["kept drafts refused (state)"] += 1
        if self.host:
            self.copies(mgr.take_copy_plan())

    def copies(self, plan):
        """Count the host tier's work: plans with copies, pages demoted / promoted, host pages evicted."""
        self.seen["copies"] += not plan.empty
        count_host(self.mgr.host, self._host_seen, self.seen)

    def free(self, rid):
        self.mgr.free(rid)
        del self.live[rid]

    def reset(self):
        if self.mgr.reset_prefix_cache():
            self.seen["reset"] += 1

    def _counts(self):
        s = self.mgr.alloc.supply()
        return s, self.mgr.used_bytes

    # ------------------------------------------------------------------ the loop
    def run(self, ops: int) -> int:
        rng, mgr = self.rng, self.mgr
        for _ in range(ops):
            self.done += 1  # counted once started: a run failing its first operation still moves the fuzz on
            r = rng.random()
            if (r < 0.15 or not self.live) and len(self.live) < 6:
                self.add()
            elif r < 0.2 and self.live:
                rid = rng.choice(list(self.live))
                if not self.live[rid]["allocated"]:
                    self.lookup(rid)
            elif r < 0.9 and self.live:
                self.step(rng.choice(list(self.live)))
            elif r < 0.98 and self.live:
                self.free(rng.choice(list(self.live)))
            elif r < 0.99:
                self.reset()
            else:
                for rid in list(self.live):
                    self.free(rid)
            if self.host and rng.random() < 0.3:
                self.copies(mgr.take_copy_plan())
            mgr.check_integrity()
        for rid in list(self.live):
            self.free(rid)
        if self.host:
            self.copies(mgr.take_copy_plan())
        mgr.check_integrity()
        assert mgr.used_bytes == 0, f"{mgr.used_bytes} bytes held after every request was freed"
        self.seen["ops"] += ops
        return ops


def count_host(host, last: dict, seen: Counter) -> None:
    """Add what ``host`` (a ``HostTier``) did since ``last`` (its counters then, updated) to ``seen``:
    ``host demoted`` / ``host promoted`` (pages copied down / up), ``host evicted`` (host pages
    evicted to make room)."""
    for key, now in (("host demoted", host.demotions), ("host promoted", host.promotions),
                     ("host evicted", host.evictor.num_evicted_pages)):
        seen[key] += now - last.get(key, 0)
        last[key] = now


def configurations():
    """(manager, spec name, host tier, lookahead k): every manager on every spec (the multi-model
    pool: that spec and a second model, ``MULTI_OTHER``), the host tier (jenga's; the multi-model
    pool refuses one), speculative lookahead (k = 3)."""
    out = []
    for spec in specs():
        for name in MANAGERS:
            out.append((name, spec, False, 0))
            out.append((name, spec, False, 3))
        out.append(("jenga", spec, True, 0))
        out.append(("jenga", spec, True, 3))
    return out


#: Layer mixes with a state group: there the allocate that counts kept drafts as computed may answer
#: ``None`` (a state page the pool has not left; the engine feeds the drafts again), changing nothing;
#: elsewhere the drafts' reserved slots always hold them.
STATE_SPECS = ("full+mamba",)


def run_one(f, n: int, label: str, part: str, prefix: str, host, k: int, violations: list, seen: Counter) -> int:
    """Run fuzz ``f`` for ``n`` operations; an exception out of it is a violation too (``label``
    names the run); counts its runs and operations under ``part`` (and ``prefix`` + host tier /
    lookahead); returns the operations it ran."""
    try:
        f.run(n)
    except Exception as e:  # noqa: BLE001
        violations.append(f"{label}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
    seen.update(f.seen)
    seen[f"runs:{part}"] += 1
    seen[f"ops:{part}"] += f.done
    seen[f"ops:{prefix}host tier"] += f.done if host else 0
    seen[f"ops:{prefix}lookahead"] += f.done if k else 0
    return f.done


def fuzz(total_ops: int, seed: int = 0, runs_of: int = 2000, deadline: float | None = None,
         report=None, state_drafts: bool = True, start: int = 0) -> tuple[int, list[str], Counter]:
    """``total_ops`` operations over every configuration in runs of ``runs_of`` (a fresh manager
    each); returns (operations run, violations, what happened).  Stops early at ``deadline``.
    ``state_drafts``: kept drafts on state layer mixes too (``STATE_SPECS``; on by default).
    ``start``: the first run's number (its configuration and seed): a slice of a longer fuzz."""
    confs = configurations()
    done, violations, seen = 0, [], Counter()
    i = start
    while done < total_ops and (deadline is None or time.time() < deadline):
        name, spec, host, k = confs[i % len(confs)]
        run_seed = seed * 1_000_003 + i
        n = min(runs_of, total_ops - done)
        f = Fuzz(name, spec, run_seed, host=host, k=k, keep_drafts=state_drafts or spec not in STATE_SPECS)
        done += run_one(f, n, f"{name} {spec} host={host} k={k} seed={run_seed}", name, "", host, k, violations, seen)
        i += 1
        if report is not None and (i - start) % 50 == 0:
            report(done, violations, seen)
    return done, violations, seen


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=float, default=1e7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="the first run's number (a slice of a longer fuzz)")
    ap.add_argument("--hours", type=float, default=None, help="stop after this long")
    ap.add_argument("--no-state-drafts", action="store_true", help="no kept drafts on state layer mixes")
    ap.add_argument("--json", action="store_true", help="print one JSON object: ops, violations, what happened")
    args = ap.parse_args(argv)
    t0 = time.time()
    deadline = None if args.hours is None else t0 + args.hours * 3600

    def report(done, violations, seen):
        print(f"{time.time() - t0:8.0f}s {done:>11,} ops, {len(violations)} violations; {dict(seen)}", flush=True)

    done, violations, seen = fuzz(int(args.ops), args.seed, deadline=deadline, report=None if args.json else report,
                                  state_drafts=not args.no_state_drafts, start=args.start)
    if args.json:
        print(json.dumps({"ops": done, "violations": violations, "seen": dict(seen), "cpu_s": time.process_time()}))
        return 1 if violations else 0
    report(done, violations, seen)
    for v in violations[:20]:
        print(v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
