"""Regenerate the README's tables whose figures come from a deterministic command.

Each such table sits between two markers that name it and the command a reader runs::

    <!-- generated: NAME | COMMAND -->
    ...the table, as this script renders it...
    <!-- end -->

Only the text between a block's markers is rewritten, so other README edits merge around it.
A block's renderer calls the same code as its command and prints the same figures (same
formats).  :data:`FAST` blocks take seconds and are checked by ``make test``
(``tests/test_readme_tables.py``); the rest by the same test under ``-m slow`` or by
``--check`` here.  Machine-dependent figures (µs, tokens/s) are never generated: the README
marks them as measured, with the date and command.

    python benchmarks/readme_tables.py              # rewrite every block (minutes: the slow ones too)
    python benchmarks/readme_tables.py --fast       # only the fast blocks
    python benchmarks/readme_tables.py --check      # exit 1 and show the difference if any block is stale
    python benchmarks/readme_tables.py --only NAME  # one block (repeatable)
"""

from __future__ import annotations

import argparse
import difflib
import pathlib
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
MARK = re.compile(r"<!-- generated: (?P<name>[\w.-]+) \| (?P<cmd>[^\n]*?) -->\n(?P<body>.*?)<!-- end -->", re.S)


@dataclass(frozen=True)
class Block:
    command: str  # what the reader runs; shown in the marker
    render: Callable[[], str]


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


def _reproduce(*sections: str) -> Block:
    cmd = "jenga reproduce " + " ".join(f'--section "{s}"' for s in sections)
    return Block(cmd, lambda: _rows_table(_cli_json(cmd)["rows"]))


def _simulate(model: str, workload: str, requests: int, rate: float, managers: str) -> Block:
    cmd = (f"jenga simulate --model {model} --workload {workload} --requests {requests} --rate {rate} "
           f"--gpu h100-80gb --manager {managers}")

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
    return Block(cmd, render)


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


def _bench() -> Block:
    """``jenga bench``'s counts (every run of the same code alike: scheduling never reads a sampled
    token, EOS is ignored); its tokens/s stay in the README as measured, with date and commit."""
    cmd = "jenga bench"

    def render() -> str:
        from jenga.units import fmt_bytes

        res = _cli_json(cmd)["managers"]
        j, p = res["jenga"], res["paged"]
        rows = [("mean decode batch", "decode_batch_mean", "{:.1f}"), ("max running", "max_running", "{}"),
                ("peak KV held", "peak_kv_used_bytes", "bytes"), ("peak KV needed", "peak_kv_needed_bytes", "bytes"),
                ("mean waste", "waste_frac_mean", "pct"), ("preemptions", "preemptions", "{}"),
                ("evicted pages", "evicted_pages", "{}"), ("steps", "steps", "{}")]
        out = ["| metric | jenga | paged | jenga / paged |", "|---|---|---|---|"]
        for label, key, f in rows:
            cells = [fmt_bytes(m[key]) if f == "bytes" else f"{100 * m[key]:.1f} %" if f == "pct" else f.format(m[key])
                     for m in (j, p)]
            ratio = f"{j[key] / p[key]:.2f}x" if key == "decode_batch_mean" and p[key] else ""
            out.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
        return "\n".join(out)
    return Block(cmd, render)


def _script(name: str, *argv: str) -> Block:
    """The Markdown table ``benchmarks/NAME.py ARGV`` prints (run in this process; its stderr is progress)."""
    cmd = f"python benchmarks/{name}.py " + " ".join(argv)

    def render() -> str:
        import contextlib
        import importlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            importlib.import_module(name).main(list(argv))
        # the table's lines only: vLLM's engines log to stdout too
        return "\n".join(line for line in buf.getvalue().splitlines() if line.startswith("|"))
    return Block(cmd, render)


def _host_tier(traces: str, hosts: str) -> Block:
    cmd = f"python benchmarks/host_tier.py --traces {traces} --hosts {hosts} --markdown"

    def render() -> str:
        import host_tier

        rows = host_tier.rows(traces=traces.split(","), hosts=[int(x) for x in hosts.split(",")])
        return "\n".join([host_tier.markdown_header()] + [host_tier.markdown_row(r) for r in rows])
    return Block(cmd, render)


def _calibration() -> str:
    from jenga.sim.fit import fit, held_out, markdown, record

    cells = record()
    return markdown(fit(cells), held_out(cells))


def _vllm_spec_acceptance() -> str:
    sys.path.insert(0, str(README.parent / "benchmarks"))
    import tempfile

    import vllm_spec_acceptance as bench

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in bench.ROWS:
            rows += bench.run_row(method, pathlib.Path(tmp))
    return bench.render(rows, markdown=True)


BLOCKS: dict[str, Block] = {
    "reproduce-closed-form": _reproduce("closed form", "Llama-4 context"),
    "plan-ministral": _plan("ministral-8b", "64GiB"),
    "reproduce-figure14-h100": _reproduce("throughput"),
    "reproduce-figure14-l4": _reproduce("throughput L4"),
    "reproduce-others": _reproduce("Ministral waste", "decode batch", "prefix caching", "spec decoding"),
    "simulate-gemma": _simulate("gemma-3-12b", "arxiv-qa", 40, 0.2, "jenga,paged,uniform"),
    "simulate-ministral": _simulate("ministral-8b", "arxiv-multiq", 36, 0.25, "jenga,paged,uniform"),
    "calibration": Block("python -m jenga.sim.fit", _calibration),
    "vllmfeat": Block(".venv/bin/python benchmarks/vllm_spec_acceptance.py --markdown", _vllm_spec_acceptance),
    "bench": _bench(),
    "vs-vllm-main": _script("vs_vllm_manager", "--rows", "main", "--markdown", "--outcome"),
    "vs-vllm-extra": _script("vs_vllm_manager", "--rows", "extra", "--markdown", "--outcome"),
    "vllm-side-by-side": _script("vllm_side_by_side", "--markdown", "--outcome"),
    "host-tier": _host_tier("articles64,chats64", "0,2,4,8"),
}
#: Blocks make test re-renders (seconds each); the rest run under ``-m slow``.
FAST = ("reproduce-closed-form", "plan-ministral")


# ------------------------------------------------------------------------------------------ apply

def blocks_in(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (command, body)}`` of the README's generated blocks."""
    return {m["name"]: (m["cmd"], m["body"]) for m in MARK.finditer(text)}


def render(names) -> dict[str, str]:
    return {n: BLOCKS[n].render().rstrip("\n") + "\n" for n in names}


def regenerate(text: str, names, bodies: dict[str, str] | None = None) -> str:
    """``text`` with the blocks ``names`` re-rendered (or given as ``bodies``; the others
    untouched).  A marker naming an unknown block, or a command other than the block's, is an error."""
    found = blocks_in(text)
    for name, (cmd, _) in found.items():
        if name not in BLOCKS:
            raise ValueError(f"README block {name!r} is not one of {sorted(BLOCKS)}")
        if cmd != BLOCKS[name].command:
            raise ValueError(f"README block {name!r} names the command {cmd!r}, not {BLOCKS[name].command!r}")
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
    a = ap.parse_args(argv)
    names = a.only or [n for n in BLOCKS if n in FAST or not a.fast]
    text = README.read_text()
    regenerate(text, [], {})  # markers and commands checked before minutes of rendering
    bodies = render(names)
    text = README.read_text()  # again: another run may have written its blocks meanwhile
    new = regenerate(text, names, bodies)
    if a.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "README.md",
                                                       "generated"))
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
