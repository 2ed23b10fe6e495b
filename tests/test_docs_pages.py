"""The README stays a front page that points into docs/, and the docs say what the code does.

(The site itself, links and anchors included, is built by ``make test``'s ``mkdocs build --strict``.)
"""

import pathlib
import re

from jenga.core.manager.miss_reasons import REASONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_is_a_front_page():
    assert len(README.splitlines()) <= 250
    for command in ("make demo", "make test"):
        assert command in README
    for topic in ("## Quick start", "## Install", "## Support", "## Headline figures", "## Where things are"):
        assert topic in README


def test_readme_links_into_docs_resolve():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", README)
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md"}
    assert set(links) == pages, "every docs page is linked from the README, and every link has its page"


def test_faq_explains_every_miss_reason():
    faq = (ROOT / "docs" / "faq.md").read_text()
    table = faq[faq.index("## What does each miss reason mean?"):]
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert rows == list(REASONS)
