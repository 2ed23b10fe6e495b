"""``benchmarks/vllm_replay.py``: a row's calls on jenga's adapter, recorded inside vLLM, replay on a
fresh adapter with every answer as recorded; a recorded answer that differs is caught and named."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import vllm_replay  # noqa: E402


def test_a_recorded_row_replays_with_every_answer_and_a_changed_answer_is_caught(tmp_path, capsys):
    trace = tmp_path / "control.trace"
    vllm_replay.main(["record", "control", str(trace)])
    vllm_replay.main(["play", str(trace), "--reps", "1", "--calls"])
    out = capsys.readouterr().out
    assert "every answer as recorded" in out and "calls per scheduler step" in out
    with open(trace, "rb") as fh:
        data = pickle.load(fh)
    i = next(i for i, (_, name, _, _) in enumerate(data["log"]) if name == "get_computed_blocks")
    data["answers"][i] = ("tampered",)
    with open(trace, "wb") as fh:
        pickle.dump(data, fh)
    with pytest.raises(SystemExit):
        vllm_replay.main(["play", str(trace), "--reps", "1"])
    assert f"call {i} (get_computed_blocks)" in capsys.readouterr().out
