"""The README's reference sections are generated from the code and must stay in step."""

from __future__ import annotations

import json
from pathlib import Path

from edgerl.config import describe, field_info

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_lists_every_config_key_with_its_default():
    text = README.read_text()
    for key, default, doc in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        live = " (live: SIGHUP)" if field_info(key)[0].metadata.get("live") else ""
        row = f"| `{key}` | `{shown}` | {doc}{live} |"
        assert row in text, f"README config reference is out of date for {key}: {row}"


def test_readme_has_a_section_for_every_command():
    from edgerl.cli import cli

    text = README.read_text()
    for name in cli.commands:
        assert f"edgerl {name}" in text, f"README does not mention `edgerl {name}`"
