"""Reading the CSV files a run writes (metrics.csv, episodes.csv, eval.csv, load.csv), whatever
damage they carry.

These files only ever grow by whole rows, but a disk error, a copy cut short or a careless edit
can leave anything in them: bytes that are not UTF-8, NUL bytes, a line of megabytes, a cell of
``inf``. None of that may stop a resume, the service or ``edgerl plot``: a :class:`CsvReader`
reads the file in pieces (memory stays flat however large it is), skips each line it cannot read
and counts it, so that its caller can name the damage once (:meth:`CsvReader.damage`) and go on.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from edgerl.files.regular import open_regular

MAX_LINE = 64 * 1024  # edgerl's rows are under 300 bytes; a longer line is damage
CHUNK = 1 << 20


class CsvReader:
    """The rows of one CSV file written by a run, read line by line.

    ``header`` is the first readable line's cells (None until :meth:`rows` has read it). A row
    is yielded only when it has as many cells as the header; a repeated header is skipped. Lines
    that are not text, hold NUL bytes, are longer than :data:`MAX_LINE` or are badly quoted are
    counted in ``damaged`` (the first at line ``first_damaged``); rows with another number of
    cells (a row cut short by a kill) in ``incomplete``.
    """

    def __init__(self, path: Path, follow: bool = False) -> None:
        self.path = path
        self.follow = follow  # a run's files: a link in one's place is refused (ELOOP)
        self.header: list[str] | None = None
        self.damaged = 0
        self.first_damaged: int | None = None
        self.incomplete = 0
        self._lines_from_end = False  # read by tail(): line numbers are not the file's

    def rows(self) -> Iterator[list[str]]:
        """The cells of each data row, in file order. Raises OSError when the file cannot be
        opened or read (FileNotFoundError when it does not exist, NotRegularFileError for a
        FIFO or a device in its place)."""
        with open_regular(self.path, self.follow) as f:
            yield from self._parse(f, 0)

    def tail(self, max_bytes: int) -> Iterator[list[str]]:
        """The cells of the data rows in the last ``max_bytes`` of the file (a line cut by that
        boundary left out), in file order, with the header read from the file's first line: what
        a reader that follows a growing file needs, in time that does not grow with it. Raises
        what :meth:`rows` raises."""
        with open_regular(self.path, self.follow) as f:
            first = f.readline(MAX_LINE + 1)
            cells = _cells(_line(first.rstrip(b"\n")))
            if cells is None:  # damage: no row can be told apart from it, and it is said
                self.damaged, self.first_damaged = 1, 1
                return
            if not first.endswith(b"\n"):
                return  # the header is still being written: no rows yet
            self.header = cells
            start = max(len(first), os.fstat(f.fileno()).st_size - max_bytes)
            if start > len(first):
                f.seek(start - 1)
                while (rest := f.readline(CHUNK)) and not rest.endswith(b"\n"):
                    pass  # the line the boundary cut (its newline ends it)
            self._lines_from_end = True
            yield from self._parse(f, 0)

    def _parse(self, f: BinaryIO, number: int) -> Iterator[list[str]]:
        """The data rows from ``f``'s position on (line numbers counted from ``number``)."""
        for piece in _pieces(f):
            for line in _decode(piece):
                number += 1
                if line == "":
                    continue  # a blank line says nothing
                cells = _cells(line)
                if cells is None:
                    self.damaged += 1
                    if self.first_damaged is None:
                        self.first_damaged = number
                elif self.header is None:
                    self.header = cells
                elif len(cells) != len(self.header):
                    self.incomplete += 1
                elif cells != self.header:
                    yield cells

    def damage(self) -> str | None:
        """A phrase naming the damage found so far, e.g. "3 damaged lines from line 12 on (not
        text, or over 64 KiB)", or None when every line could be read."""
        if not self.damaged:
            return None
        lines = "1 damaged line" if self.damaged == 1 else f"{self.damaged:,} damaged lines"
        if self._lines_from_end:
            return f"{lines} near its end (not text, or over {MAX_LINE // 1024} KiB)"
        where = "at" if self.damaged == 1 else "from"
        return (
            f"{lines} {where} line {self.first_damaged:,}"
            f"{'' if self.damaged == 1 else ' on'} (not text, or over {MAX_LINE // 1024} KiB)"
        )


def _pieces(f: BinaryIO) -> Iterator[bytes | None]:
    """The file in runs of whole lines (the last newline of each left off), read a CHUNK at a
    time; None stands for a line over MAX_LINE, read past, never held whole. A last line without
    a newline comes too."""
    carry = b""
    skipping = False  # inside a line that is already too long
    while chunk := f.read(CHUNK):
        if skipping:
            end = chunk.find(b"\n")
            if end < 0:
                continue
            yield None
            skipping, chunk = False, chunk[end + 1 :]
        data = carry + chunk
        end = data.rfind(b"\n")
        if end >= 0:
            yield data[:end]
            data = data[end + 1 :]
        carry = data
        if len(carry) > MAX_LINE:
            skipping, carry = True, b""
    if skipping:
        yield None
    elif carry:
        yield carry


def _decode(piece: bytes | None) -> Sequence[str | None]:
    """The lines of a piece as text; None for each line that is not text, holds a NUL byte or is
    over MAX_LINE. The whole piece is decoded at once where it can be (the common case)."""
    if piece is None:
        return [None]
    try:
        text: str | None = piece.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\0" not in text:
        lines = text.replace("\r\n", "\n").split("\n") if "\r" in text else text.split("\n")
        if max(map(len, lines)) <= MAX_LINE:
            return lines
    return [_line(raw) for raw in piece.split(b"\n")]


def _line(raw: bytes) -> str | None:
    if len(raw) > MAX_LINE or b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        return None


def _cells(line: str | None) -> list[str] | None:
    if line is None:
        return None
    if '"' not in line:
        return line.split(",")  # every row edgerl writes: no quoting, so no csv module
    try:
        return next(csv.reader([line], strict=True), [])
    except csv.Error:
        return None


def number(cell: str) -> float | None:
    """A cell as a finite number, or None (empty, not a number, inf or nan)."""
    if not cell:
        return None
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
