"""`jenga plan --json` of every catalog model at 16/32/64/128 tokens per page, pinned.

``tests/data/plan_snapshot.json`` was written by the code before structure.py asked transformers for
per-layer cache kinds (commit 905a7e3); the catalog must keep giving exactly these numbers.  Page sizes that
code refused (Jamba-1.5-Mini at 64 and 128, Qwen3-Next at 128) are absent here and tested in
``test_pagesize.py``.  Regenerate only for a deliberate change of plan numbers, saying why in the commit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from jenga.cli import plan_data

SNAPSHOT = json.loads((Path(__file__).parent / "data" / "plan_snapshot.json").read_text())


def plan_args(model: str, tokens_per_page: int) -> argparse.Namespace:
    return argparse.Namespace(model=model, memory=None, gpu=None, tp=1, tokens_per_page=tokens_per_page,
                              dtype="bf16", short_tokens=1024, managers="jenga,paged", json=True)


def test_snapshot_covers_the_catalog():
    from jenga.structure import CATALOG_NAMES

    assert {k.split("@")[0] for k in SNAPSHOT} == set(CATALOG_NAMES)
    assert len(SNAPSHOT) == 4 * len(CATALOG_NAMES) - 3


@pytest.mark.parametrize("name", sorted({k.split("@")[0] for k in SNAPSHOT}))
def test_catalog_plan_numbers_unchanged(name):
    for key in sorted(k for k in SNAPSHOT if k.split("@")[0] == name):
        tokens_per_page = int(key.split("@")[1])
        got = json.loads(json.dumps(plan_data(plan_args(name, tokens_per_page))))
        assert got == SNAPSHOT[key], key
