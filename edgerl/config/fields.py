"""A config field: its default, its one-line doc and the values it accepts (every section's
fields are made with :func:`setting`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import field
from typing import Any


def setting(
    default: Any,
    doc: str,
    *,
    choices: Collection[Any] | None = None,
    min: float | None = None,
    max: float | None = None,
    live: bool = False,
) -> Any:
    """A config field with its one-line doc and the values it accepts.

    ``live`` marks a key the service can change without restarting (SIGHUP).
    """
    meta = {"doc": doc, "choices": choices, "min": min, "max": max, "live": live}
    if isinstance(default, dict):  # a table: each config gets its own copy
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)
