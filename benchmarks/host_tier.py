"""jenga's manager with a host-memory tier: prefix hits and bytes copied per tier style.

The loop of ``vs_vllm_manager.py`` (one scheduler driving the manager: a token budget per step,
FCFS admission with prefix lookup, preemption of the latest admitted) on the same device pool (the
simulator's KV budget of the model on an H100, Jamba on an H200), with a host tier of 0, 2x, 4x
and 8x that pool, stored two ways: ``per-kind`` (jenga's rule: a page is demoted when its kind
can still serve a hit from it: full-attention prefix pages, the window before a branch point of a
sliding layer, Mamba state checkpoints, whole images) and ``all-groups`` (every page the device
evicts, of every group, as block-based offloaders store them).  The copy plan is taken once per
step, after the step's allocations, as an engine does.

Columns: prefix hit = hit tokens / prompt tokens of first admissions; computed = prompt tokens
computed over the whole run (re-admissions after a preemption included), in millions; promoted /
demoted = GiB copied host -> device / device -> host over the run; host peak = the most host bytes
holding content at a step's end; from host = hit tokens whose pages were promoted.  Every figure
is a count of the deterministic run (no timing), but sim tok/s: output tokens per second of the
run's steps priced by the simulator's cost model (the fitted v1 table, on the GPU of the device
pool: H100, Jamba H200) with each step's copies on that GPU's host link, serial
(:mod:`jenga.sim.step_clock`).  ``rows()`` returns the rows as dicts.

    .venv/bin/python benchmarks/host_tier.py --markdown
    .venv/bin/python benchmarks/host_tier.py --models llama-3.1-8b --traces articles64 --hosts 0,4
"""

from __future__ import annotations

import argparse
import sys

from manager_sides import JengaSide
from manager_traces import TRACES, BlockTrie
from vs_vllm_manager import MODELS, budget_of, simulate, trace_state

from jenga.sim.calibration import FITTED
from jenga.sim.setup import build_setup

TIER_TRACES = ("articles64", "chats64")  # 64 articles x 4 questions; 64 growing chats of 8 turns
HOSTS = (0, 2, 4, 8)  # host tier, multiples of the device pool
POLICIES = ("per-kind", "all-groups")
GiB = 2**30


class HostSide(JengaSide):
    """jenga's side with a host tier; takes the copy plan at each step's start (the previous
    step's allocations done) and once more at the end, and keeps the host's peak."""

    name = "jenga"

    def __init__(self, model, memory: int, host_bytes: int | None, host_policy: str, setup=None):
        from jenga import KVCacheManager
        from jenga.sim.step_clock import StepClock
        self.mgr = KVCacheManager(model, memory, tokens_per_page=16, host_memory_bytes=host_bytes,
                                  host_policy=host_policy)
        self.crc = None
        self.allocs = 0
        self.host_peak = 0
        self.clock = StepClock(setup, self.mgr.model)
        self.pos = {}  # request -> tokens in context (its hit, then what the steps computed)

    def add(self, rid, tokens) -> int:
        self.pos[rid] = hit = super().add(rid, tokens)
        return hit

    def commit(self, rid, n, tok) -> None:
        self.pos[rid] += n
        self.clock.computed(self.pos[rid], n)
        super().commit(rid, n, tok)

    def step(self) -> None:
        self.clock.step_done(self.mgr.take_copy_plan())  # closes the previous step
        host = self.mgr.host
        if host is not None:
            self.host_peak = max(self.host_peak, host.used_bytes)


def run(model_name: str, trace: str, host_mult: int, policy: str, budget: int = 8192,
        max_running: int = 256) -> dict:
    """One run: the trace through jenga's manager with a host tier of ``host_mult`` x the device pool."""
    from jenga.core.specs import ModelSpec
    model = ModelSpec.from_hf_config(model_name, vision=False)
    memory, where = budget_of(model_name, None)
    reqs = TRACES[trace]()
    BlockTrie(reqs)  # block ids, for the loop's needed-bytes column
    gpu, tp = where.split(" x TP")
    setup = build_setup(model_name, gpu, int(tp), efficiency=FITTED.cost_kwargs("v1"))
    side = HostSide(model, memory, host_mult * memory or None, policy, setup)
    m = simulate(side, model, reqs, budget, max_running, trace_state(reqs))
    side.step()
    s = side.mgr.stats()
    return dict(model=model_name, trace=trace, host=host_mult, policy=policy if host_mult else "-",
                device_bytes=side.mgr.total_bytes, where=where, hit=m["hit"] / m["query"],
                computed=m["query"] + m["requery"] - m["hit"] - m["rehit"], preempt=m["preempt"], steps=m["steps"],
                promoted=s.bytes_promoted, demoted=s.bytes_demoted, host_total=s.host_total_bytes,
                host_peak=side.host_peak, from_host=s.host_hit_tokens,
                sim_tok_s=sum(r.output_len for r in reqs) / side.clock.seconds)


def rows(models=MODELS, traces=TIER_TRACES, hosts=HOSTS, policies=POLICIES, progress=None) -> list[dict]:
    """Every (model, trace, host size, policy) row; a host of 0 runs once (no tier)."""
    out = []
    for name in models:
        for trace in traces:
            for mult in hosts:
                for policy in policies if mult else policies[:1]:
                    r = run(name, trace, mult, policy)
                    out.append(r)
                    if progress is not None:
                        progress(r)
    return out


HEADER = ["model", "trace", "host", "stored", "prefix hit", "computed M", "from host M", "promoted GiB",
          "demoted GiB", "host peak GiB", "preempt", "sim tok/s"]


def fmt(r: dict) -> list[str]:
    host = "-" if not r["host"] else f"{r['host']}x ({r['host_total'] / GiB:.0f} GiB)"
    return [r["model"], r["trace"], host, r["policy"], f"{100 * r['hit']:.1f} %", f"{r['computed'] / 1e6:.2f}",
            f"{r['from_host'] / 1e6:.2f}", f"{r['promoted'] / GiB:.1f}", f"{r['demoted'] / GiB:.1f}",
            f"{r['host_peak'] / GiB:.1f}", str(r["preempt"]), f"{r['sim_tok_s']:.0f}"]


def markdown_header() -> str:
    return "| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER)


def markdown_row(r: dict) -> str:
    return "| " + " | ".join(fmt(r)) + " |"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--traces", default=",".join(TIER_TRACES), help="from: " + ", ".join(TRACES))
    p.add_argument("--hosts", default=",".join(map(str, HOSTS)), help="host tier sizes, multiples of the device pool")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown, row by row")
    a = p.parse_args(argv)
    table = []
    if a.markdown:
        print(markdown_header(), flush=True)

    def progress(r):
        table.append(fmt(r))
        print(f"{r['model']}:{r['trace']} device {r['device_bytes'] / GiB:.1f} GiB ({r['where']})", file=sys.stderr)
        if a.markdown:
            print(markdown_row(r), flush=True)
    rows(a.models.split(","), a.traces.split(","), [int(x) for x in a.hosts.split(",")], a.policies.split(","),
         progress)
    if not a.markdown:
        widths = [max(len(x[i]) for x in table + [HEADER]) for i in range(len(HEADER))]
        for r in [HEADER] + table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
