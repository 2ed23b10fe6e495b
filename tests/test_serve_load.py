"""The make-test size of ``benchmarks/serve_load.py``: cancellations at random points,
vanished clients and a burst past ``--max-waiting``; every completed output equals the
offline one, no page is used once idle and ``check_integrity`` holds (the script checks and
exits 1 otherwise)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_load.py"


def test_serve_load_small(capsys):
    spec = importlib.util.spec_from_file_location("serve_load", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_load"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    rc = mod.main(["--requests", "24", "--burst", "10", "--vanish", "2", "--max-waiting", "3",
                   "--max-num-seqs", "4", "--concurrency", "6", "--max-tokens", "8", "--time-limit", "120"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FAIL" not in out and out.rstrip().endswith("OK")
