"""``benchmarks/vllm_replay.py``: a row's calls on jenga's adapter (or on vLLM's own manager), recorded
inside vLLM, replay on a fresh one with every answer as recorded; a recorded answer that differs is
caught and named.  Its table's stock settings are the ones that won the side-by-side rows."""

from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import vllm_replay  # noqa: E402


def test_the_tables_stock_settings_are_those_that_won_the_side_by_side_rows():
    """``TABLE_ROWS`` names, per row and budget, the stock setting the generated side-by-side block
    reports as stock's best (``hybrid`` and ``hybrid32`` run the same engines: one row)."""
    text = (ROOT / "docs" / "vllm.md").read_text()
    block = text.split("<!-- generated: vllm-side-by-side |", 1)[1].split("<!-- end -->", 1)[0]
    won = {}
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 4 and cells[3] == "stock" and re.fullmatch(r"\d+", cells[2]):
            won[(cells[0], int(cells[2]))] = cells[4]
    assert {(row, blocks): label for row, blocks, label in vllm_replay.TABLE_ROWS} == {
        k: v for k, v in won.items() if k[0] != "hybrid"}


def test_per_call_files_each_allocation_under_what_it_asked():
    """``--per-call`` splits ``allocate_slots`` by what it asked, alike for both engines: an admission
    (nothing placed since the request was added or freed), a decode token, a prefill chunk; refused
    where no blocks came back (the replay's error text too), and a free makes the next one an admission."""
    from types import SimpleNamespace
    a, b = SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")
    placed: set[str] = set()
    calls = [("allocate_slots", [a, 512], {}, None), ("allocate_slots", [a, 512], {}, "blocks"),
             ("allocate_slots", [b], {"num_new_tokens": 1}, "raised KeyError: 'b'"),
             ("allocate_slots", [a, 1], {}, "blocks"), ("allocate_slots", [a, 300], {}, "blocks"),
             ("allocate_slots", [a, 1], {}, None), ("free", [a], {}, None), ("allocate_slots", [a, 1], {}, "blocks")]
    kinds = [vllm_replay.allocation_kind(placed, name, args, kw, out) for name, args, kw, out in calls]
    assert kinds == ["allocate_slots first refused", "allocate_slots first", "allocate_slots first refused",
                     "allocate_slots decode", "allocate_slots chunk", "allocate_slots decode refused", "free",
                     "allocate_slots first"]
    assert placed == {"a"}


@pytest.mark.slow
def test_a_recorded_row_replays_with_every_answer_and_a_changed_answer_is_caught(tmp_path, capsys):
    trace = tmp_path / "control.trace"
    vllm_replay.main(["record", "control", str(trace)])
    vllm_replay.main(["play", str(trace), "--reps", "1", "--calls"])
    out = capsys.readouterr().out
    assert "every answer as recorded" in out and "calls per scheduler step" in out
    assert_a_changed_answer_is_caught(trace, "get_computed_blocks", capsys)


@pytest.mark.slow
def test_stock_vllms_own_manager_replays_beside_jengas_and_a_changed_answer_is_caught(tmp_path, capsys):
    """vLLM's own manager recorded on the same row (the scheduler's deferred frees into its block pool
    included) replays with every block id as recorded, in turns with jenga's trace: the ratio line."""
    stock, jenga = tmp_path / "stock.trace", tmp_path / "jenga.trace"
    vllm_replay.main(["record", "control", str(stock), "--stock"])
    vllm_replay.main(["record", "control", str(jenga)])
    capsys.readouterr()
    vllm_replay.main(["play", str(stock), str(jenga), "--reps", "1", "--per-call"])
    out = capsys.readouterr().out
    assert "stock CPU" in out and "jenga CPU" in out and out.count("every answer as recorded") == 2
    for kind in ("first", "chunk", "decode", "first refused"):  # both engines, split alike
        assert len(re.findall(rf"^  allocate_slots {kind} +\d+ calls", out, re.M)) == 2, (kind, out)
    assert f"{jenga} / {stock} CPU per step:" in out
    with open(stock, "rb") as fh:
        data = pickle.load(fh)
    assert data["stock"] is not None and data["adapter"] is None
    assert_a_changed_answer_is_caught(stock, "allocate_slots", capsys)


def assert_a_changed_answer_is_caught(trace: Path, call: str, capsys) -> None:
    """The first recorded answer of ``call`` in ``trace`` changed: its replay stops there, naming it."""
    with open(trace, "rb") as fh:
        data = pickle.load(fh)
    i = next(i for i, (_, name, _, _) in enumerate(data["log"]) if name == call)
    data["answers"][i] = ("tampered",)
    with open(trace, "wb") as fh:
        pickle.dump(data, fh)
    with pytest.raises(SystemExit):
        vllm_replay.main(["play", str(trace), "--reps", "1"])
    assert f"call {i} ({call})" in capsys.readouterr().out
