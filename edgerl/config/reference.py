"""The config reference, generated from the fields' own docs: docs/configuration.md's table
(``edgerl config --reference --markdown``) and ``edgerl config --reference``."""

from __future__ import annotations

from typing import Any

from edgerl.config import Config, field_info, keys


def reference_markdown() -> str:
    """The table of docs/configuration.md (regenerate: `edgerl config --reference --markdown`)."""
    import json

    rows = ["| key | default | what it is |", "| --- | --- | --- |"]
    for key, default, doc in describe():
        shown = json.dumps(list(default) if isinstance(default, tuple) else default)
        live = " (live: SIGHUP)" if field_info(key)[0].metadata.get("live") else ""
        rows.append(f"| `{key}` | `{shown}` | {doc}{live} |")
    return "\n".join(rows) + "\n"


def reference_text() -> str:
    """Every key as ``key = default  # doc`` (``edgerl config --reference``)."""
    import json

    return "".join(
        f"{key} = {json.dumps(list(default) if isinstance(default, tuple) else default)}  # {doc}\n"
        for key, default, doc in describe()
    )


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, doc) for every key: docs/configuration.md's table comes from this."""
    cfg = Config()
    rows = []
    for key in keys():
        fld, _ = field_info(key)
        rows.append((key, cfg.get(key), fld.metadata["doc"]))
    return rows
