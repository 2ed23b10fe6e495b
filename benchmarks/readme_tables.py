"""Regenerate the tables of the README and the docs pages whose figures come from a deterministic command.

Each such table sits between two markers that name it and the command a reader runs::

    <!-- generated: NAME | COMMAND -->
    ...the table, as this script renders it...
    <!-- end -->

Blocks live in README.md and docs/*.md (:func:`pages`); a block may stand in more than one page
(the README's headline figures are also on their docs page), and every copy is rendered and
checked.  Only the text between a block's markers is rewritten, so other edits merge around it.
A block's renderer calls the same code as its command and prints the same figures (same
formats).  :data:`FAST` blocks take seconds and are re-rendered whole by ``make test``
(``tests/test_readme_tables.py``); the rest by the same test under ``-m slow`` or by
``--check`` here.  A slow block has a :class:`Sample`: a few of its rows (one trace, one
section, one manager's column) that the same code renders in seconds with a narrower command;
``make test`` checks that each sampled line is in every copy of the block as it is rendered now, so
a stale slow block fails there too.  Machine-dependent figures (µs, tokens/s) are never generated:
the pages mark them as measured, with the date and command.

    python benchmarks/readme_tables.py              # rewrite every block (minutes: the slow ones too)
    python benchmarks/readme_tables.py --fast       # only the fast blocks
    python benchmarks/readme_tables.py --check      # exit 1 and show the difference if any block is stale
    python benchmarks/readme_tables.py --only NAME  # one block (repeatable)
    python benchmarks/readme_tables.py --samples    # exit 1 if a sampled row is not in its block (seconds)
"""

from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARK = re.compile(r"<!-- generated: (?P<name>[\w.-]+) \| (?P<cmd>[^\n]*?) -->\n(?P<body>.*?)<!-- end -->", re.S)


@dataclass(frozen=True)
class Sample:
    """Lines of a block that a narrower command renders through the same code in seconds.

    Contract: every non-empty line ``render`` returns is, in order, a line of the block's full
    render (with ``prefix``: the start of one, up to a column's ``|``: the leading columns only,
    as one manager's column of a table with a column per manager).  ``tests/test_readme_tables.py``
    proves it for a fast block, and for every block under ``-m slow``."""
    command: str  # what the reader runs to see these lines
    render: Callable[[], str]
    prefix: bool = False


@dataclass(frozen=True)
class Block:
    command: str  # what the reader runs; shown in the marker
    render: Callable[[], str]
    sample: Sample | None = None  # slow blocks: what make test checks of them


# ------------------------------------------------------------------------------------- renderers

def _cli_json(command: str) -> dict:
    """What ``command`` (a ``jenga ...`` line) prints with ``--json``, run in this process."""
    import contextlib
    import io
    import json
    import shlex

    from jenga.cli import main as cli_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(shlex.split(command)[1:] + ["--json"])
    if rc:
        raise RuntimeError(f"{command!r} exited {rc}")
    return json.loads(buf.getvalue())


def _rows_table(rows: list[dict]) -> str:
    """``jenga reproduce`` rows: the table, then each row's note under it (its own section only)."""
    out = ["| what | paper | ours |", "|---|---|---|"]
    out += [f"| {r['what']} | {r['paper']} | {r['ours']} |" for r in rows]
    listed = [(r["what"], r["note"]) for r in rows if r["note"]]
    if listed:
        out.append("")
        out += [f"- *{what}*: {note}" for what, note in listed]
    return "\n".join(out)


def _reproduce_cmd(sections) -> str:
    return "jenga reproduce " + " ".join(f'--section "{s}"' for s in sections)


def _reproduce(*sections: str, sample: str | None = None) -> Block:
    """``jenga reproduce``'s rows of ``sections``; sampled by one section of them."""
    cmd = _reproduce_cmd(sections)
    part = None
    if sample is not None:
        one = _reproduce_cmd([sample])
        part = Sample(one, lambda: _rows_table(_cli_json(one)["rows"]))
    return Block(cmd, lambda: _rows_table(_cli_json(cmd)["rows"]), part)


def _simulate(model: str, workload: str, requests: int, rate: float, managers: str, sample: str) -> Block:
    """``jenga simulate``'s table, a row per manager; sampled by the ``sample`` manager's row (each
    manager runs alone on the same workload)."""
    base = (f"jenga simulate --model {model} --workload {workload} --requests {requests} --rate {rate} "
            f"--gpu h100-80gb --manager ")
    return Block(base + managers, _simulate_table(base + managers),
                 Sample(base + sample, _simulate_table(base + sample)))


def _simulate_table(cmd: str) -> Callable[[], str]:
    def render() -> str:
        from jenga.sim.report import COLUMNS

        keys = ("throughput_req_s", "rejected", "decode_batch_mean", "waste_frac_mean", "prefix_hit_rate",
                "preemptions", "steps")
        fmt = {k: f for k, _, f in COLUMNS}
        heads = {k: h for k, h, _ in COLUMNS}
        d = _cli_json(cmd)
        out = ["| manager | " + " | ".join(heads[k] for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for name, s in d["managers"].items():
            out.append(f"| {name} | " + " | ".join(fmt[k].format(s[k]) for k in keys) + " |")
        return "\n".join(out)
    return render


def _plan(model: str, memory: str) -> Block:
    cmd = f"jenga plan --model {model} --memory {memory}"

    def render() -> str:
        d = _cli_json(cmd)
        out = ["| group | kind | layers | tokens/page | small page bytes | small pages per large page |",
               "|---|---|---|---|---|---|"]
        out += [f"| {g['name']} | {g['kind']} | {g['layers']} | {g['tokens_per_page']} | {g['page_bytes']} | "
                f"{g['small_pages_per_large']} |" for g in d["groups"]]
        out += ["", f"| manager | page bytes | max context (1 request) | max requests of {d['short_tokens']} tokens |",
                "|---|---|---|---|"]
        out += [f"| {n} | {', '.join(map(str, d['page_bytes'][n]))} | {d['max_context_tokens'][n]} | "
                f"{d['max_concurrent_requests'][n]} |" for n in d["max_context_tokens"]]
        return "\n".join(out)
    return Block(cmd, render)


def _plan_multi(models: str, memory: str) -> Block:
    cmd = f"jenga plan --model {models} --memory {memory}"

    def render() -> str:
        d = _cli_json(cmd)
        out = [f"One pool of {d['num_large_pages']} large pages of {d['lcm_page_bytes']} bytes.", "",
               "| model | groups (small page bytes x per large page) | floor bytes | most bytes (shared) | bytes "
               f"(static) | max context shared / static | requests of {d['short_tokens']} tokens shared / static |",
               "|---|---|---|---|---|---|---|"]
        for m in d["models"]:
            sh, st = m["shared"], m["static"]
            groups = ", ".join(f"{g['name']} {g['page_bytes']} x {g['small_pages_per_large']}" for g in m["groups"])
            out.append(f"| {m['model']} | {groups} | {sh['floor_bytes']} | {sh['max_bytes']} | {st['pool_bytes']} | "
                       f"{sh['max_context_tokens']} / {st['max_context_tokens']} | {sh['max_concurrent_requests']} / "
                       f"{st['max_concurrent_requests']} |")
        return "\n".join(out)
    return Block(cmd, render)


def _multi_bench(*args: str) -> Block:
    """``jenga bench --model A,B``'s outcome counts (the same in every run of the same code; its
    timings are machine-dependent and stay out of the block)."""
    cmd = "jenga bench " + " ".join(args)

    def render() -> str:
        d = _cli_json(cmd)
        out = ["| scenario | engine | output tokens | model forwards | mean decode batch | preemptions |",
               "|---|---|---|---|---|---|"]
        for sc, res in d["scenarios"].items():
            for kind, label in (("shared", "one shared pool"), ("static", "static even split")):
                r = res[kind]
                out.append(f"| {sc} | {label} | {r['output_tokens']} | {r['forwards']} | "
                           f"{r['decode_batch_mean']:.1f} | {r['preemptions']} |")
        return "\n".join(out)
    return Block(cmd, render)


def _simulate_multi(*args: str, sample: str = "balanced") -> Block:
    """``jenga simulate --model A,B``'s outcome (simulated: the same in every run), a row per
    scenario and pool; sampled by the ``sample`` scenario's rows (each scenario runs alone)."""
    cmd = "jenga simulate " + " ".join(args)
    return Block(cmd, _simulate_multi_table(cmd), Sample(f"{cmd} --scenarios {sample}", _simulate_multi_table(
        f"{cmd} --scenarios {sample}")))


def _simulate_multi_table(cmd: str) -> Callable[[], str]:
    def render() -> str:
        d = _cli_json(cmd)
        out = ["| scenario | pool | output tokens | tokens/s (simulated) | preemptions | rejected | TTFT p50 | "
               "TTFT p99 |", "|---|---|---|---|---|---|---|---|"]
        for sc, res in d["scenarios"].items():
            for kind, label in (("shared", "one shared pool"), ("static", "static even split")):
                r = res[kind]
                out.append(f"| {sc} | {label} | {r['output_tokens']} | {r['tokens_per_s']:.0f} | {r['preemptions']} | "
                           f"{r['rejected']} | {r['ttft_p50_s']:.2f} s | {r['ttft_p99_s']:.2f} s |")
            q = res["ratio"]
            out.append(f"| {sc} | shared / static | | {q['tokens_per_s']:.2f}x | | | {q['ttft_p50_s']:.2f}x | "
                       f"{q['ttft_p99_s']:.2f}x |")
        return "\n".join(out)
    return render


def _bench(*args: str, managers: str | None = None, hits: bool = False, sample: bool = True) -> Block:
    """``jenga bench ARGS``'s counts (every run of the same code alike: scheduling never reads a sampled
    token, EOS is ignored; ``hits``: with the prefix hit rate); its tokens/s stay in the README as
    measured, with date and commit.  Sampled by jenga's column (``--managers jenga``: each manager runs
    alone on the same workload) where ``sample``."""
    cmd = " ".join(["jenga bench", *args, *(["--managers", managers] if managers else [])])
    one = " ".join(["jenga bench", *args, "--managers", "jenga"])
    part = Sample(one, _bench_table(one, hits), prefix=True) if sample else None
    return Block(cmd, _bench_table(cmd, hits), part)


def _bench_table(cmd: str, hits: bool) -> Callable[[], str]:
    def render() -> str:
        from jenga.units import fmt_bytes

        res = _cli_json(cmd)["managers"]
        both = "jenga" in res and "paged" in res
        rows = [("mean decode batch", "decode_batch_mean", "{:.1f}"), ("max running", "max_running", "{}"),
                ("peak KV held", "peak_kv_used_bytes", "bytes"), ("peak KV needed", "peak_kv_needed_bytes", "bytes"),
                ("mean waste", "waste_frac_mean", "pct"), ("preemptions", "preemptions", "{}"),
                ("evicted pages", "evicted_pages", "{}"), ("steps", "steps", "{}")]
        if hits:
            rows[5:5] = [("prefix hits at first admission", "first_admission_hit_rate", "pct"),
                         ("tokens re-read after preemption", "readmission_hit_tokens", "{}")]
        head = ["metric", *res] + (["jenga / paged"] if both else [])
        out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for label, key, f in rows:
            cells = [fmt_bytes(m[key]) if f == "bytes" else f"{100 * m[key]:.1f} %" if f == "pct" else f.format(m[key])
                     for m in res.values()]
            if both:
                j, p = res["jenga"][key], res["paged"][key]
                cells.append(f"{j / p:.2f}x" if key == "decode_batch_mean" and p else "")
            out.append("| " + " | ".join([label, *cells]) + " |")
        return "\n".join(out)
    return render


def _script(name: str, *argv: str, sample: tuple[str, ...] | None = None) -> Block:
    """The Markdown table ``benchmarks/NAME.py ARGV`` prints; sampled by the same script on ``sample``'s
    arguments (a row filter: each row runs alone)."""
    part = None if sample is None else Sample(_script_cmd(name, sample), _script_table(name, sample))
    return Block(_script_cmd(name, argv), _script_table(name, argv), part)


def _script_cmd(name: str, argv) -> str:
    return f"python benchmarks/{name}.py " + " ".join(argv)


def _script_table(name: str, argv, keep: tuple[str, ...] = ("|",)) -> Callable[[], str]:
    """What ``benchmarks/NAME.py ARGV`` prints (run in this process; its stderr is progress), the lines
    starting with one of ``keep`` only (table lines by default)."""
    def render() -> str:
        import contextlib
        import importlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            importlib.import_module(name).main(list(argv))
        # the table's lines only: vLLM's engines log to stdout too
        return "\n".join(line for line in buf.getvalue().splitlines() if line.startswith(keep))
    return render


def _op_fuzz_long(ops: int, sample_ops: int) -> Block:
    """``op_fuzz_long.py``'s two tables (parts, then what happened); sampled by the manager fuzz alone
    on a few operations: its rows' part and configurations columns (what the fuzz covers), the
    figures only the full run gives (hours: the long run is not repeated by ``-m slow`` either)."""
    argv = ("--ops", str(ops), "--markdown")
    narrow = ("--ops", str(sample_ops), "--parts", "managers", "--markdown")

    def tables(args) -> list[str]:
        import contextlib
        import importlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            importlib.import_module("op_fuzz_long").main(list(args))
        lines = [ln for ln in buf.getvalue().splitlines() if ln.startswith("|") or not ln.strip()]
        return "\n".join(lines).strip("\n").splitlines()

    def leading() -> str:
        first = tables(narrow)
        first = first[:first.index("")] if "" in first else first
        return "\n".join("|".join(ln.split("|")[:3]) + "|" for ln in first)

    return Block(_script_cmd("op_fuzz_long", argv), lambda: "\n".join(tables(argv)),
                 Sample(_script_cmd("op_fuzz_long", narrow), leading, prefix=True))


def _cache_oracle(*argv: str, sample: tuple[str, ...] | None = None) -> Block:
    """``cache_oracle.py``'s table and the problems it lists under it; sampled by the same script on
    ``sample``'s arguments (one family and feature: its row's leading columns, the table lines only)."""
    part = None if sample is None else Sample(_script_cmd("cache_oracle", sample), _script_table("cache_oracle", sample),
                                              prefix=True)
    return Block(_script_cmd("cache_oracle", argv), _script_table("cache_oracle", argv, keep=("|", "- ")), part)


#: the vLLM 0.34 python the Makefile makes (``make vllm-envs``): vLLM's cache-aware admission is 0.34's
VLLM_034 = ".vllm-envs/0.34.0/bin/python"


def _vllm034_script(name: str, *argv: str) -> Block:
    """The Markdown table ``benchmarks/NAME.py ARGV`` prints when run by vLLM 0.34's python (a
    subprocess: this process's vLLM is another version); table lines only."""
    cmd = f"VLLM_TARGET_DEVICE=cpu PYTHONPATH=src {VLLM_034} benchmarks/{name}.py " + " ".join(argv)

    def render() -> str:
        import subprocess
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONPATH": str(ROOT / "src")}
        out = subprocess.run([str(ROOT / VLLM_034), str(ROOT / "benchmarks" / f"{name}.py"), *argv], cwd=ROOT,
                             env=env, capture_output=True, text=True, check=True).stdout
        return "\n".join(line for line in out.splitlines() if line.startswith("|"))
    return Block(cmd, render)


def _host_tier(traces: str, hosts: str, sample: tuple[str, str, str, str]) -> Block:
    """``host_tier.py``'s rows; sampled by one (model, trace, host, policy) row (each row runs alone)."""
    model, trace, host, policy = sample
    return Block(f"python benchmarks/host_tier.py --traces {traces} --hosts {hosts} --markdown",
                 _host_tier_table(traces=traces.split(","), hosts=[int(x) for x in hosts.split(",")]),
                 Sample(f"python benchmarks/host_tier.py --models {model} --traces {trace} --hosts {host} "
                        f"--policies {policy} --markdown",
                        _host_tier_table(models=[model], traces=[trace], hosts=[int(host)], policies=[policy])))


def _host_tier_table(**kw) -> Callable[[], str]:
    """``host_tier.rows(**kw)`` (its defaults for what ``kw`` leaves out) as the script's Markdown."""
    def render() -> str:
        import host_tier

        rows = host_tier.rows(**kw)
        return "\n".join([host_tier.markdown_header()] + [host_tier.markdown_row(r) for r in rows])
    return render


def _calibration() -> str:
    from jenga.sim.fit import fit, held_out, markdown, record

    cells = record()
    return markdown(fit(cells), held_out(cells))


def _vllm_spec_acceptance() -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import tempfile

    import vllm_spec_acceptance as bench

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in bench.ROWS:
            rows += bench.run_row(method, pathlib.Path(tmp))
    return bench.render(rows, markdown=True)


#: the engine oracle's block: one tiny family per page kind (sliding, chunked, Mamba-1, Mamba-2, vision, cross)
ORACLE_FAMILIES = "tiny-gemma3,tiny-llama4,tiny-jamba,tiny-bamba,tiny-gemma3-vision,tiny-mllama"


BLOCKS: dict[str, Block] = {
    "reproduce-closed-form": _reproduce("closed form", "Llama-4 context", sample="closed form"),
    "plan-ministral": _plan("ministral-8b", "64GiB"),
    "plan-multi": _plan_multi("llama-3.1-8b,gemma-3-12b", "40GiB"),
    # two engines x two scenarios of two tiny models: about a minute of CPU, -m slow only
    "bench-multi": _multi_bench("--model", "tiny-llama,tiny-gemma3", "--kv-memory", "3MiB", "--requests", "24",
                                "--prompt-min", "64", "--prompt-max", "192", "--output-len", "32"),
    # several models on one GPU at real sizes, simulated (a few minutes of CPU each): -m slow, sampled by a scenario
    "simulate-multi-h100": _simulate_multi("--model", "llama-3.1-8b,gemma-3-12b", "--gpu", "h100-80gb", "--requests",
                                           "240", "--output-len", "256"),
    "simulate-multi-h200": _simulate_multi("--model", "qwen3-next-80b,gemma-3-27b", "--gpu", "h200-141gb",
                                           "--weight-dtype", "fp8", "--requests", "240", "--output-len", "256"),
    "reproduce-figure14-h100": _reproduce("throughput"),
    "reproduce-figure14-l4": _reproduce("throughput L4"),
    "reproduce-others": _reproduce("Ministral waste", "decode batch", "prefix caching", "spec decoding",
                                   sample="decode batch"),
    "simulate-gemma": _simulate("gemma-3-12b", "arxiv-qa", 40, 0.2, "jenga,paged,uniform", sample="jenga"),
    "simulate-ministral": _simulate("ministral-8b", "arxiv-multiq", 36, 0.25, "jenga,paged,uniform", sample="jenga"),
    "calibration": Block("python -m jenga.sim.fit", _calibration),
    "vllmfeat": Block(".venv/bin/python benchmarks/vllm_spec_acceptance.py --markdown", _vllm_spec_acceptance),
    "bench": _bench(hits=True),
    # the tiny Jamba: ~10-20 s per manager (53 s for the three); make test samples jenga's column (~13 s of CPU)
    "bench-jamba": _bench("--model", "tiny-jamba-1to7", "--shared-prefix", "128", "--state-checkpoint-interval", "64",
                          managers="jenga,paged,uniform", hits=True),
    "vs-vllm-main": _script("vs_vllm_manager", "--rows", "main", "--markdown", "--outcome",
                            sample=("--rows", "gemma-3-12b:articles16", "--markdown", "--outcome")),
    "vs-vllm-extra": _script("vs_vllm_manager", "--rows", "extra", "--markdown", "--outcome",
                             sample=("--rows", "jamba-1.5-mini:hybrid-short", "--markdown", "--outcome")),
    "vs-vllm-no-prefix-caching": _script("vs_vllm_manager", "--rows", "main", "--no-prefix-caching", "--markdown",
                                         "--outcome", sample=("--rows", "jamba-1.5-mini:long", "--no-prefix-caching",
                                                              "--markdown", "--outcome")),
    "vllm-side-by-side": _script("vllm_side_by_side", "--markdown", "--outcome"),
    # the host tier's row: six vLLM engines (stock's sweep, jenga, 2x / 4x host); make test samples
    # jenga + 4x host alone (two engine starts, one run: about two minutes of CPU)
    "vllm-side-by-side-host": _script("vllm_side_by_side", "--rows", "many", "--markdown", "--outcome",
                                      sample=("--rows", "many", "--engines", "jenga4x", "--markdown", "--outcome")),


    # vLLM 0.34's scheduler at its best against JengaScheduler, priced in time: minutes, -m slow only;
    # tests/test_vs_vllm_sched.py pins a row (in the 0.34 tests of make test)
    "vs-vllm-sched": _vllm034_script("vs_vllm_sched", "--rows", "quick", "--markdown", "--outcome"),
    # the wide grid (9 models x 5 workloads x both budgets): a quarter of an hour of the 0.34 python, -m slow only
    "vs-vllm-sched-wide": _vllm034_script("vs_vllm_sched", "--rows", "wide", "--markdown", "--outcome"),
    # the grid's tight half at 4 % of the real budget (where the working sets no longer fit): as long, -m slow only
    "vs-vllm-sched-pressed": _vllm034_script("vs_vllm_sched", "--rows", "wide-tight", "--tight", "0.04", "--markdown",
                                             "--outcome"),
    # engine runs of tiny models, 6-13 s of CPU each: -m slow only, but for mllama's jenga row (~7 s of CPU);
    # the other two scripts run both of their configurations on every call (no row filter to sample by)
    "mllama-cross-pages": _script("mllama_cross_pages", "--markdown", "--outcome",
                                  sample=("--managers", "jenga", "--markdown", "--outcome")),
    "vlm-embedding-cache": _script("vlm_embedding_cache", "--markdown", "--outcome"),
    "spec-pool-copy": _script("spec_decode_pool", "--kv-memory", "6MiB", "--markdown", "--outcome"),
    "spec-pool-llama": _script("spec_decode_pool", "--kv-memory", "6MiB", "--draft", "tiny-llama", "--markdown",
                               "--outcome"),
    # the cache-correctness oracle: every tiny family x feature in the engine (minutes: -m slow), sampled by
    # tiny-jamba's plain column (~10 s of CPU)
    "cache-oracle": _cache_oracle("--no-vllm", "--families", ORACLE_FAMILIES, "--jobs", "2", "--markdown",
                                  sample=("--no-vllm", "--families", "tiny-jamba", "--features", "plain", "--markdown")),
    "host-tier": _host_tier("articles64,chats64", "0,2,4,8", sample=("jamba-1.5-mini", "chats64", "2", "per-kind")),
    # every manager, the host tier, lookahead and the vLLM adapter's call sequence (an hour on two busy cores)
    "op-fuzz-long": _op_fuzz_long(200_000, 2_000),
}
#: Blocks make test re-renders whole (seconds each); the rest under ``-m slow``, their samples in make test.
FAST = ("reproduce-closed-form", "plan-ministral", "plan-multi")


# ------------------------------------------------------------------------------------------ apply

def pages() -> list[pathlib.Path]:
    """The files generated blocks live in: the README, then the docs site's pages."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def read_pages() -> dict[pathlib.Path, str]:
    return {page: page.read_text() for page in pages()}


def blocks_in(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (command, body)}`` of the generated blocks in one page's ``text``."""
    return {m["name"]: (m["cmd"], m["body"]) for m in MARK.finditer(text)}


def pages_of(texts: dict[pathlib.Path, str]) -> dict[str, list[pathlib.Path]]:
    """``{name: [the pages holding that block]}`` over ``texts`` (``{page: text}``)."""
    out: dict[str, list[pathlib.Path]] = {}
    for page, text in texts.items():
        for name in blocks_in(text):
            out.setdefault(name, []).append(page)
    return out


def missing_line(body: str, sample: str, prefix: bool = False) -> str | None:
    """The first of ``sample``'s non-empty lines not found in ``body``, the lines taken in order (each
    equal to a line of the body; with ``prefix``, the start of one), or ``None`` when all are there."""
    lines = iter(line for line in body.splitlines() if line)
    for want in (line for line in sample.splitlines() if line):
        if not any(line == want or prefix and line.startswith(want) for line in lines):
            return want
    return None


def stale_samples(texts: dict[pathlib.Path, str], names, rendered: dict[str, str] | None = None) -> dict[str, str]:
    """``{name: message}`` of the blocks ``names`` whose sample, rendered now (or given in
    ``rendered``), is not in every copy of the block in ``texts`` (``{page: text}``)."""
    where = pages_of(texts)
    out = {}
    for name in names:
        if name not in where:
            out[name] = f"no page has block {name!r}"
            continue
        sample = BLOCKS[name].sample
        got = rendered[name] if rendered is not None else sample.render()
        for page in where[name]:
            line = missing_line(blocks_in(texts[page])[name][1], got, sample.prefix)
            if line is not None:
                out[name] = (f"{os.path.relpath(page, ROOT)} block {name!r}: `{sample.command}` prints {line!r}, "
                             f"which the block lacks; run `python benchmarks/readme_tables.py --only {name}`")
                break
    return out


def render(names) -> dict[str, str]:
    return {n: BLOCKS[n].render().rstrip("\n") + "\n" for n in names}


def regenerate(text: str, names, bodies: dict[str, str] | None = None) -> str:
    """``text`` with the blocks ``names`` re-rendered (or given as ``bodies``; the others
    untouched).  A marker naming an unknown block, or a command other than the block's, is an error."""
    found = blocks_in(text)
    for name, (cmd, _) in found.items():
        if name not in BLOCKS:
            raise ValueError(f"block {name!r} is not one of {sorted(BLOCKS)}")
        if cmd != BLOCKS[name].command:
            raise ValueError(f"block {name!r} names the command {cmd!r}, not {BLOCKS[name].command!r}")
    bodies = render([n for n in names if n in found]) if bodies is None else bodies

    def sub(m: re.Match) -> str:
        body = bodies.get(m["name"], m["body"])
        return f"<!-- generated: {m['name']} | {m['cmd']} -->\n{body}<!-- end -->"
    return MARK.sub(sub, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a block differs")
    ap.add_argument("--fast", action="store_true", help="only the fast blocks (the ones make test checks)")
    ap.add_argument("--only", action="append", help="only this block (repeatable)")
    ap.add_argument("--samples", action="store_true", help="do not write; render the slow blocks' samples "
                    "(seconds each) and exit 1 if a sampled line is not in a copy of its block")
    a = ap.parse_args(argv)
    if a.samples:
        names = [n for n in a.only or BLOCKS if BLOCKS[n].sample is not None]
        stale = stale_samples(read_pages(), names)
        print("\n".join(stale.values()) or f"{len(names)} samples in their blocks")
        return 1 if stale else 0
    names = a.only or [n for n in BLOCKS if n in FAST or not a.fast]
    texts = read_pages()
    for text in texts.values():
        regenerate(text, [], {})  # markers and commands checked before minutes of rendering
    where = pages_of(texts)
    bodies = render([n for n in names if n in where])
    rc = 0
    for page in pages():
        text = page.read_text()  # again: another run may have written its blocks meanwhile
        new = regenerate(text, names, bodies)
        if new == text:
            continue
        if a.check:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       os.path.relpath(page, ROOT), "generated"))
            rc = 1
        else:
            page.write_text(new)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
