"""The tables edgerl ships (``edgerl/data/*.csv``), read and checked like any file edgerl reads:
an edit or a broken install that damaged one is one sentence naming the file and the line, where
it is first used (an Atari run's start), not an internal error and never a silent guess.

Lines starting with ``#`` are comments; the first other line is the header.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from edgerl.errors import PackagedDataError

DATA: Traversable = resources.files("edgerl") / "data"  # tests point it at damaged copies


def finite(text: str) -> float:
    """A cell that must be a finite number."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def read_table(name: str, columns: dict[str, Callable[[str], Any]]) -> list[dict[str, Any]]:
    """The rows of ``edgerl/data/NAME`` as ``{column: value}``, each cell of ``columns``
    converted by its function (other columns are left out). Raises PackagedDataError where the
    file cannot be read, lacks a column, or a row has another number of cells or a cell its
    column's function refuses."""
    where = f"edgerl's table edgerl/data/{name}"
    try:
        text = DATA.joinpath(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PackagedDataError(f"{where} cannot be read ({e}); reinstall edgerl") from None
    parsed = []
    for n, line in enumerate(text.splitlines(), 1):
        if line and line[0] != "#":
            try:  # each line on its own: a broken quote cannot swallow the lines after it
                parsed.append((n, next(csv.reader([line], strict=True))))
            except csv.Error as e:
                raise PackagedDataError(
                    f"{where} is damaged at line {n} ({e}); reinstall edgerl"
                ) from None
    if not parsed:
        raise PackagedDataError(f"{where} has no header line; reinstall edgerl")
    header = parsed[0][1]
    missing = [c for c in columns if c not in header]
    if missing:
        raise PackagedDataError(f"{where} has no column {missing[0]!r}; reinstall edgerl")
    rows = []
    for n, cells in parsed[1:]:
        if len(cells) != len(header):
            raise PackagedDataError(
                f"{where} is damaged at line {n} ({len(cells)} cells, not {len(header)}); "
                "reinstall edgerl"
            )
        row = dict(zip(header, cells, strict=True))
        values = {}
        for column, convert in columns.items():
            try:
                values[column] = convert(row[column])
            except ValueError:
                raise PackagedDataError(
                    f"{where} is damaged at line {n} ({column} is {row[column][:40]!r}); "
                    "reinstall edgerl"
                ) from None
        rows.append(values)
    return rows
