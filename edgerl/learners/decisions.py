"""Measurements remembered between runs on one machine: whether ``torch.compile`` pays.

Deciding whether the CPU update should be compiled costs a compilation (20-50 s) and a timing;
the answer depends only on the machine, torch and the update's shapes, so every later run with
the same ones reuses it (:meth:`edgerl.learners.fast_update.FastUpdate.maybe_compile` makes the
key). The file is ``compile-decisions.json`` in ``$CACHE_DIRECTORY`` (the service's, set by
systemd), else ``$XDG_CACHE_HOME/edgerl``, else ``~/.cache/edgerl``.

The same small store keeps the board's calibration (:mod:`edgerl.run.calibrate`, in
``calibration.json`` beside it).

It is a cache: a file that cannot be read or parsed is reported once, renamed aside
(``.damaged``, kept for inspection) and the measurement is made again; a directory that cannot
be written costs only the next run's measurement.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from edgerl.files.atomic import write_atomic
from edgerl.files.regular import read_regular

log = logging.getLogger(__name__)

FILE_NAME = "compile-decisions.json"
VERSION = 1
MAX_BYTES = 1 << 20  # 64 entries are a few KiB
MAX_ENTRIES = 64  # the newest kept: shapes and torch versions come and go


def default_directory() -> Path:
    """Where the decisions live (see the module docstring)."""
    service = os.environ.get("CACHE_DIRECTORY")
    if service:
        return Path(service.split(":")[0])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgerl"


class CompileDecisions:
    """A small JSON map from a key to what was measured for it."""

    def __init__(
        self,
        directory: Path | None = None,
        file_name: str = FILE_NAME,
        what: str = "the torch.compile decision",
    ) -> None:
        self.path = (directory or default_directory()) / file_name
        self.what = what  # what the warnings call an entry
        self._warned = False

    def _read(self) -> dict[str, Any]:
        try:
            data_bytes = read_regular(self.path, MAX_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            return {}  # nothing remembered yet
        except OSError as e:
            self._warn(f"cannot read {self.path}: {e.strerror or e}")
            return {}
        try:
            data = json.loads(data_bytes)  # bytes that are not UTF-8: a ValueError
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError("not a decisions file of this edgerl")
            entries = data["entries"]
            if not isinstance(entries, dict):
                raise ValueError("its entries are not a map")
        except (ValueError, KeyError, RecursionError) as e:
            aside = self.path.with_name(self.path.name + ".damaged")
            try:
                self.path.replace(aside)
                where = f"moved to {aside.name}"
            except OSError:
                where = "left in place"
            self._warn(f"{self.path} is damaged ({e}); {where}, and measuring again")
            return {}
        return entries

    def _warn(self, message: str) -> None:
        if not self._warned:
            log.warning("%s", message)
            self._warned = True

    def get(self, key: str) -> dict[str, Any] | None:
        """What was measured for ``key``, or None."""
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        """Remember ``value`` for ``key`` (atomic; a failure is logged, never raised)."""
        entries = self._read()
        entries.pop(key, None)
        entries[key] = value
        kept = dict(list(entries.items())[-MAX_ENTRIES:])
        text = json.dumps({"version": VERSION, "entries": kept}, indent=1, sort_keys=False)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, (text + "\n").encode())
        except OSError as e:
            self._warn(
                f"cannot remember {self.what} in {self.path}: {e.strerror or e}; "
                "the next run measures again"
            )
