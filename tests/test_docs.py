"""The README's reference sections are generated from the code and must stay in step."""

from __future__ import annotations

from pathlib import Path

from edgerl.config_docs import describe, reference_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_config_key_with_its_default():
    table = reference_markdown()
    assert len(table.splitlines()) == len(describe()) + 2
    assert table in README.read_text(), (
        "README's config reference is out of date: regenerate it with "
        "`edgerl config --reference --markdown`"
    )


def test_readme_has_a_section_for_every_command():
    from edgerl.cli import cli

    text = README.read_text()
    for name in cli.commands:
        assert f"edgerl {name}" in text, f"README does not mention `edgerl {name}`"
