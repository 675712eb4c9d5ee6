"""README and docs/ against the code: the generated config reference, every command, links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgerl.config.reference import describe, reference_markdown

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def test_config_reference_page_lists_every_key_with_its_default():
    table = reference_markdown()
    assert len(table.splitlines()) == len(describe()) + 2
    assert table in (DOCS / "configuration.md").read_text(), (
        "docs/configuration.md is out of date: regenerate its table with "
        "`edgerl config --reference --markdown`"
    )


def test_every_command_is_in_the_readme_and_has_a_docs_page():
    from edgerl.cli import cli

    readme = README.read_text()
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    for name in cli.commands:
        assert f"`edgerl {name}`" in readme, f"README has no section naming `edgerl {name}`"
        assert f"edgerl {name}" in docs, f"no page in docs/ documents `edgerl {name}`"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (lower case, punctuation dropped,
    spaces as hyphens, ``-1``, ``-2`` for repeats)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_resolves(page: Path):
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address: not checked offline
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name} links to {target}: no such heading"


def test_readme_fits_on_a_few_screens():
    assert len(README.read_text().splitlines()) <= 150, "reference material belongs in docs/"


def test_the_readme_says_how_long_make_test_takes_as_development_md_does():
    """A newcomer reads README alone before `make test`; its duration was only in development.md."""
    import re

    development = (DOCS / "development.md").read_text()
    found = re.search(r"the test suite \((\d+-\d+) minutes on 2 cores\)", development)
    assert found is not None, "docs/development.md no longer says how long make test takes"
    make_test = next(ln for ln in README.read_text().splitlines() if ln.startswith("make test"))
    assert f"{found[1]} min on 2 cores" in make_test
