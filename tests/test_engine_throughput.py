"""``benchmarks/engine_throughput.py --ops``: the torch operators each engine dispatches per step (a
GPU's kernel launches and copies, counted on a CPU), the same on every run of the same code."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import engine_throughput  # noqa: E402


def test_the_op_count_counts_each_dispatched_operator():
    a = torch.ones(3)
    with engine_throughput.OpCount() as count:
        b = a + 1
        torch.mul(b, b)
        _ = b + a
    assert count.ops["aten.add"] == 2 and count.ops["aten.mul"] == 1, count.ops
    _ = a + a  # outside the block: not counted
    assert count.ops["aten.add"] == 2


def test_ops_per_step_are_printed_per_manager_and_the_same_on_every_run(capsys):
    argv = ["--model", "tiny-llama", "--requests", "4", "--prompt-min", "24", "--prompt-max", "40",
            "--shared-prefix", "8", "--output-len", "4", "--kv-memory", "2MiB", "--ops"]
    runs = []
    for _ in range(2):
        assert engine_throughput.main(argv) == 0
        out = capsys.readouterr().out
        row = re.search(r"torch ops per step\s*│\s*(\d+)\s*│\s*(\d+)", out)
        assert row, out
        assert "ops per step, jenga / paged, most apart:" in out
        runs.append(row.groups())
    assert runs[0] == runs[1] and all(int(n) > 0 for n in runs[0])
