"""The README's generated tables are what the code prints now (``benchmarks/readme_tables.py``).

The fast blocks are re-rendered here on every ``make test``; the slow ones (simulations of
minutes) under ``-m slow``.  Every block the generator knows is in the README, with its command.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import readme_tables as rt  # noqa: E402

TEXT = rt.README.read_text()


def test_every_block_is_in_the_readme_with_its_command():
    found = rt.blocks_in(TEXT)
    assert set(found) == set(rt.BLOCKS)
    for name, (cmd, _) in found.items():
        assert cmd == rt.BLOCKS[name].command, name


def _check(name: str) -> None:
    new = rt.regenerate(TEXT, [name])
    assert rt.blocks_in(new)[name] == rt.blocks_in(TEXT)[name], (
        f"README block {name!r} differs from what `{rt.BLOCKS[name].command}` prints now; "
        f"run `python benchmarks/readme_tables.py --only {name}`")


@pytest.mark.parametrize("name", rt.FAST)
def test_fast_block_matches_the_code(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in rt.BLOCKS if n not in rt.FAST])
def test_slow_block_matches_the_code(name):
    _check(name)


def test_a_stale_block_is_found_and_only_its_text_changes():
    name = rt.FAST[0]
    cmd, body = rt.blocks_in(TEXT)[name]
    stale = TEXT.replace(body, body.replace("|", "| 9", 1), 1)
    new = rt.regenerate(stale, [name])
    assert new == TEXT  # the block is rendered back; nothing outside it moved


def test_a_marker_with_another_command_is_refused():
    name = rt.FAST[0]
    cmd = rt.BLOCKS[name].command
    with pytest.raises(ValueError, match="names the command"):
        rt.regenerate(TEXT.replace(f"{name} | {cmd} -->", f"{name} | {cmd} --quick -->"), [])
