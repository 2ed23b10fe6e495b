"""The generated tables of the README and the docs pages are what the code prints now
(``benchmarks/readme_tables.py``).

The fast blocks are re-rendered here on every ``make test``; the slow ones (simulations of
minutes) under ``-m slow``, and in ``make test`` through their samples: a few rows each that the
same code renders in seconds, which must be in every copy of the block as printed now.  Every block
the generator knows is in a page (README.md or docs/*.md), with its command.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import readme_tables as rt  # noqa: E402

TEXTS = rt.read_pages()
WHERE = rt.pages_of(TEXTS)
TEXT = TEXTS[rt.README]


def test_every_block_is_in_a_page_with_its_command():
    assert set(WHERE) == set(rt.BLOCKS)
    for page, text in TEXTS.items():
        for name, (cmd, _) in rt.blocks_in(text).items():
            assert cmd == rt.BLOCKS[name].command, (page, name)


def test_pages_are_the_readme_and_the_docs_site():
    assert rt.pages()[0] == rt.README
    assert {p.name for p in rt.pages()[1:]} >= {"benchmarks.md", "vllm.md", "reproduction.md"}
    assert all(p.parent.name == "docs" for p in rt.pages()[1:])
    # the README keeps headline figures; the rest moved to their pages
    assert 1 <= len(rt.blocks_in(TEXT)) <= 2
    assert all(len(WHERE[n]) == 1 or rt.README in WHERE[n] for n in WHERE), "a block copied between docs pages"


def _check(name: str) -> None:
    new_bodies = rt.render([name])
    for page in WHERE[name]:
        new = rt.regenerate(TEXTS[page], [name], new_bodies)
        assert rt.blocks_in(new)[name] == rt.blocks_in(TEXTS[page])[name], (
            f"{page.name} block {name!r} differs from what `{rt.BLOCKS[name].command}` prints now; "
            f"run `python benchmarks/readme_tables.py --only {name}`")


@pytest.mark.parametrize("name", rt.FAST)
def test_fast_block_matches_the_code(name):
    _check(name)


SLOW = [n for n in rt.BLOCKS if n not in rt.FAST]
#: blocks whose full render takes an hour or more (the long operation fuzz): only their samples are checked
LONG = ("op-fuzz-long",)
#: samples that run vLLM's manager: one worker imports vLLM once for them
VLLM_SAMPLES = ("vs-vllm-main", "vs-vllm-extra", "vs-vllm-no-prefix-caching")
#: samples that start vLLM engines (in-process engine cores): in ``make test-vllm-slow`` (marked slow; half a
#: minute of vLLM engines beside the other tests there that start them)
ENGINE_SAMPLES = ("vllm-side-by-side-host",)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SLOW if n not in LONG])
def test_slow_block_matches_the_code(name):
    _check(name)


def _stale_figure(text: str, name: str, sample: str) -> str:
    """``text`` (one page) with the last digit of the block's first sampled row (a figure) changed."""
    body = rt.blocks_in(text)[name][1]
    row = next(ln for ln in sample.splitlines() if ln.startswith("| ") and any(c.isdigit() for c in ln)
               and not set(ln) <= set("|-"))
    line = next(ln for ln in body.splitlines() if ln.startswith(row))
    at = max(i for i, c in enumerate(row) if c.isdigit())
    stale_line = line[:at] + str((int(line[at]) + 1) % 10) + line[at + 1:]
    return text.replace(body, body.replace(line, stale_line, 1), 1)


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xdist_group("readme-vs-vllm") if n in VLLM_SAMPLES else
                 (pytest.mark.xdist_group("readme-vllm-engines"), pytest.mark.slow) if n in ENGINE_SAMPLES else ())
    for n in SLOW if rt.BLOCKS[n].sample is not None])
def test_slow_block_sample_is_in_its_pages(name):
    """The slow block's sampled rows, rendered now, are in every copy of its block; and a page whose
    sampled row has one figure changed is found stale."""
    got = rt.BLOCKS[name].sample.render()
    assert got.strip()
    stale = rt.stale_samples(TEXTS, [name], {name: got})
    assert stale == {}, stale[name]
    for page in WHERE[name]:
        changed = _stale_figure(TEXTS[page], name, got)
        assert changed != TEXTS[page]
        assert page.name in rt.stale_samples({**TEXTS, page: changed}, [name], {name: got})[name]


def test_slow_blocks_without_a_sample_are_the_known_ones():
    # checked under -m slow only, each for its reason:
    reasons = {
        # the fit simulates every figure-14 case (minutes); tests/test_sim_calibration.py checks FITTED
        # against the fit (v0's step overhead in make test, a whole refit under -m slow)
        "calibration": "minutes",
        # one section simulates every figure-14 case at full size (minutes); no narrower command
        "reproduce-figure14-h100": "minutes", "reproduce-figure14-l4": "minutes",
        # each row starts vLLM engines for a minute
        "vllmfeat": "vLLM engines", "vllm-side-by-side": "vLLM engines",
        # vLLM 0.34's python, a minute per row; tests/test_vs_vllm_sched.py pins one row under 0.34
        "vs-vllm-sched": "vLLM 0.34 python",
        "vs-vllm-sched-wide": "vLLM 0.34 python",
        "vs-vllm-sched-pressed": "vLLM 0.34 python",
        # the scripts run both of their configurations on every call (no row filter); 6-13 s of CPU each
        "vlm-embedding-cache": "no row filter", "spec-pool-copy": "no row filter", "spec-pool-llama": "no row filter",
        # two engines x two scenarios of two tiny models in one call: about a minute of CPU
        "bench-multi": "a minute",
    }
    assert {n for n in SLOW if rt.BLOCKS[n].sample is None} == set(reasons)


def test_a_sample_is_lines_of_its_blocks_full_render():
    """A fast block with a sample: the narrower command prints the full command's lines."""
    name = "reproduce-closed-form"
    block = rt.BLOCKS[name]
    full, got = block.render(), block.sample.render()
    assert len(got.splitlines()) < len(full.splitlines())
    assert rt.missing_line(full, got, block.sample.prefix) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in SLOW if rt.BLOCKS[n].sample is not None and n not in LONG])
def test_a_slow_blocks_sample_is_lines_of_its_full_render(name):
    block = rt.BLOCKS[name]
    assert rt.missing_line(block.render(), block.sample.render(), block.sample.prefix) is None


def test_sample_lines_are_matched_in_order_whole_or_as_leading_columns():
    body = "| a | 1 | 2 |\n| b | 3 | 4 |\n\n- note\n"
    assert rt.missing_line(body, "| b | 3 | 4 |\n\n- note") is None
    assert rt.missing_line(body, "| b | 3 | 4 |\n| a | 1 | 2 |") == "| a | 1 | 2 |"  # order kept
    assert rt.missing_line(body, "| b | 3 |") == "| b | 3 |"  # a whole line unless prefix
    assert rt.missing_line(body, "| a | 1 |\n| b | 3 |", prefix=True) is None
    assert rt.missing_line(body, "| b | 5 |", prefix=True) == "| b | 5 |"


def test_a_stale_block_is_found_and_only_its_text_changes():
    name = rt.FAST[0]
    (page,) = WHERE[name]
    text = TEXTS[page]
    cmd, body = rt.blocks_in(text)[name]
    stale = text.replace(body, body.replace("|", "| 9", 1), 1)
    new = rt.regenerate(stale, [name])
    assert new == text  # the block is rendered back; nothing outside it moved


def test_check_and_write_cover_every_page(tmp_path, monkeypatch, capsys):
    """``--check`` finds a stale block in a docs page, and a rewrite mends it there, the README
    untouched."""
    name = rt.FAST[0]
    (page,) = WHERE[name]
    assert page != rt.README
    docs = tmp_path / "docs"
    docs.mkdir()
    copies = {tmp_path / "README.md": TEXT, docs / page.name: TEXTS[page]}
    for path, text in copies.items():
        path.write_text(text)
    monkeypatch.setattr(rt, "ROOT", tmp_path)
    monkeypatch.setattr(rt, "README", tmp_path / "README.md")
    assert rt.main(["--check", "--only", name]) == 0
    body = rt.blocks_in(TEXTS[page])[name][1]
    (docs / page.name).write_text(TEXTS[page].replace(body, body.replace("|", "| 9", 1), 1))
    assert rt.main(["--check", "--only", name]) == 1
    assert f"docs/{page.name}" in capsys.readouterr().out
    assert rt.main(["--only", name]) == 0
    assert (docs / page.name).read_text() == TEXTS[page]
    assert (tmp_path / "README.md").read_text() == TEXT


def test_a_marker_with_another_command_is_refused():
    name = rt.FAST[0]
    cmd = rt.BLOCKS[name].command
    (page,) = WHERE[name]
    with pytest.raises(ValueError, match="names the command"):
        rt.regenerate(TEXTS[page].replace(f"{name} | {cmd} -->", f"{name} | {cmd} --quick -->"), [])
