"""CLI a newcomer can use (issue 7, item 7): --help shows defaults and accepted names, one
``--manager`` spelling everywhere, plain progress lines when stderr is not a terminal."""

from __future__ import annotations

import io
import re
import time

import pytest

from jenga.baselines import MANAGER_NAMES
from jenga.cli import build_parser, main
from jenga.progress import ProgressLine
from jenga.sim.gpu import GPUS
from jenga.sim.workloads import WORKLOAD_NAMES
from jenga.structure import CATALOG_NAMES


def _help(capsys, monkeypatch, command: str) -> str:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside names such as gpt-oss-120b
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    return re.sub(r"\s+", " ", capsys.readouterr().out)


@pytest.mark.parametrize("command,names,defaults", [
    ("plan", [*CATALOG_NAMES, *MANAGER_NAMES, *GPUS], ["gemma-3-27b", "jenga,paged", "16", "bf16"]),
    ("bench", ["tiny-gemma3", "tiny-llama4", *MANAGER_NAMES], ["tiny-gemma3", "12MiB", "48", "jenga,paged"]),
    ("simulate", [*CATALOG_NAMES, *WORKLOAD_NAMES, *GPUS, *MANAGER_NAMES],
     ["ministral-8b", "decode-batch-20", "h100-80gb", "jenga,paged,uniform"]),
    ("reproduce", ["closed form", "spec decoding"], []),
    ("serve", ["tiny-gemma3", "tiny-llama4", *MANAGER_NAMES], ["256MiB", "jenga", "8000"]),
])
def test_help_lists_names_and_defaults(capsys, monkeypatch, command, names, defaults):
    text = _help(capsys, monkeypatch, command)
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), (command, name)
    for d in defaults:
        assert f"(default: {d})" in text, (command, d)
    assert "{" not in text  # every list placeholder was filled


@pytest.mark.parametrize("command", ["plan", "bench", "simulate"])
@pytest.mark.parametrize("spelling", ["--manager", "--managers"])
def test_one_manager_option_with_the_old_spelling_kept(command, spelling):
    args = build_parser().parse_args([command, spelling, "jenga,static"])
    assert args.managers == "jenga,static"


def test_progress_line_every_interval_when_not_a_terminal():
    out = io.StringIO()
    with ProgressLine("  jenga", 10, every=0.02, stream=out, prefix="jenga simulate") as bar:
        for _ in range(10):
            bar.update()
            time.sleep(0.01)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3
    assert re.fullmatch(r"jenga simulate: jenga \d+/10 requests, \d+ s", lines[0])
    assert lines[-1].startswith("jenga simulate: jenga 10/10 requests")
    quiet = io.StringIO()
    with ProgressLine("x", 1, every=0.01, stream=quiet, enabled=False) as bar:
        time.sleep(0.05)
    with ProgressLine("y", 1, every=60, stream=quiet) as bar:  # a short run prints nothing
        bar.update()
    assert quiet.getvalue() == ""


def test_simulate_prints_progress_lines_off_a_terminal(capsys, monkeypatch):
    monkeypatch.setenv("JENGA_PROGRESS_EVERY", "0.01")
    assert main(["simulate", "--model", "gemma-3-12b", "--workload", "mmlu-pro", "--requests", "4",
                 "--manager", "jenga", "--json"]) == 0
    captured = capsys.readouterr()
    assert re.search(r"^jenga simulate: jenga 4/4 requests, \d+ s$", captured.err, re.M)
    assert captured.out.lstrip().startswith("{")  # stdout stays JSON


@pytest.mark.parametrize("command", ["serve", "bench", "simulate"])
def test_host_tier_option(capsys, monkeypatch, command):
    text = _help(capsys, monkeypatch, command)
    assert re.search(r"--host-kv-memory \w+ a host-memory KV tier", text), command
    args = build_parser().parse_args([command, *(["tiny-llama"] if command == "serve" else []),
                                      "--host-kv-memory", "4x" if command == "simulate" else "64MiB"])
    assert args.host_kv_memory == ("4x" if command == "simulate" else "64MiB")
    assert build_parser().parse_args([command, *(["tiny-llama"] if command == "serve" else [])]).host_kv_memory is None


def test_simulate_rejects_a_bad_host_tier_size(capsys):
    assert main(["simulate", "--model", "llama-3.1-8b", "--requests", "2", "--host-kv-memory=-2x"]) == 2
    assert "--host-kv-memory" in capsys.readouterr().err
