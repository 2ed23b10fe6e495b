"""The README's quick-start snippets run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_both_quick_starts():
    blocks = snippets()
    assert any("KVCacheManager" in b for b in blocks) and any("jenga.LLM" in b for b in blocks)
    for b in blocks:
        assert len(b.strip().splitlines()) <= 6, "quick starts stay six lines"


def test_readme_snippets_run(capsys):
    for block in snippets():
        exec(compile(block, str(README), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3  # the waste fraction and two generations
    assert 0.0 <= float(out[0]) < 1.0
