"""Checkpoints: atomic writes, integrity checks, keep-last-K, newest-valid lookup.

File format (``ckpt-<seq>-step<step>.ckpt`` under ``<run_dir>/checkpoints/``)::

    8 bytes   magic b"EDGERLCK"
    4 bytes   format version (little-endian uint32)
    4 bytes   reserved (zero)
    8 bytes   payload length (little-endian uint64)
    32 bytes  SHA-256 of the payload
    payload   torch.save() of the state dict (load it with :func:`load`)

A truncated or bit-flipped file is detected by its length and hash, reported by name, and never
used or deleted: the previous valid checkpoint is used instead. Writing goes to a temporary file in
the same directory, which is fsync'ed and renamed over, so a crash or power cut leaves either the
old set of files or the new one. The sequence number orders checkpoints (a resumed run continues the
sequence even when it resumed from an older step).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgerl.errors import CheckpointError
from edgerl.files.atomic import write_atomic

log = logging.getLogger(__name__)

MAGIC = b"EDGERLCK"
VERSION = 1
HEADER = struct.Struct("<8sII Q 32s")
NAME = re.compile(r"^ckpt-(?P<seq>\d{6,})-step(?P<step>\d+)\.ckpt$")


@dataclass(frozen=True)
class CheckpointFile:
    path: Path
    seq: int
    step: int


def list_checkpoints(directory: Path) -> list[CheckpointFile]:
    """Checkpoint files in ``directory``, oldest first (by sequence number)."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = NAME.match(p.name)
        if m and p.is_file():
            found.append(CheckpointFile(p, int(m["seq"]), int(m["step"])))
    return sorted(found, key=lambda c: c.seq)


def encode(state: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file holding ``state``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    return HEADER.pack(MAGIC, VERSION, 0, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes, name: str) -> dict[str, Any]:
    """The state in a checkpoint file's bytes; raises CheckpointError saying what is wrong."""
    if len(data) < HEADER.size:
        raise CheckpointError(f"checkpoint {name} is truncated ({len(data)} bytes, no header)")
    magic, version, _, length, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"checkpoint {name} is not an edgerl checkpoint (bad magic)")
    if version != VERSION:
        raise CheckpointError(
            f"checkpoint {name} has format version {version}; this edgerl reads version {VERSION}"
        )
    payload = memoryview(data)[HEADER.size :]
    if len(payload) != length:
        raise CheckpointError(
            f"checkpoint {name} is truncated ({len(payload)} of {length} payload bytes)"
        )
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {name} is corrupt (SHA-256 mismatch)")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # a valid hash over an unreadable payload: written by something else
        raise CheckpointError(f"checkpoint {name} cannot be read: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {name} does not hold an edgerl state")
    return state


def load(path: str | Path) -> dict[str, Any]:
    """Read and verify one checkpoint file; raises CheckpointError if missing or corrupt."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path} is a directory, not a file") from None
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    return decode(data, str(path))


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a whole file (for export sidecars)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written; the previous ones are untouched."""

    def __init__(self, message: str, err: int | None) -> None:
        super().__init__(message)
        self.errno = err

    @property
    def disk_full(self) -> bool:
        return self.errno in (errno.ENOSPC, errno.EDQUOT)


class CheckpointLostError(CheckpointError):
    """The last checkpoint of a session could not be written: steps since the previous are lost."""


class CheckpointStore:
    """The checkpoints of one run: save (atomic, keep-last-K) and find the newest valid one."""

    def __init__(self, directory: Path, keep: int) -> None:
        self.directory = directory
        self.keep = keep
        self._reported: set[Path] = set()

    def files(self) -> list[CheckpointFile]:
        return list_checkpoints(self.directory)

    def save(self, state: dict[str, Any], step: int) -> Path:
        """Write a new checkpoint and prune old ones; raises CheckpointWriteError on failure."""
        return self.save_encoded(encode(state), step)

    def save_encoded(self, data: bytes, step: int) -> Path:
        """Like :meth:`save`, for bytes from :func:`encode` (made while the learner was paused)."""
        existing = self.files()
        seq = existing[-1].seq + 1 if existing else 1
        path = self.directory / f"ckpt-{seq:06d}-step{step:010d}.ckpt"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
        except OSError as e:
            previous = f"; {existing[-1].path.name} is still the newest" if existing else ""
            raise CheckpointWriteError(
                f"cannot write checkpoint {path}: {e.strerror or e}{previous}", e.errno
            ) from None
        self._prune()
        return path

    def _prune(self) -> None:
        """Delete all but the newest ``keep`` checkpoints, never one that fails verification."""
        files = self.files()
        for old in files[: max(0, len(files) - self.keep)]:
            try:
                load(old.path)
            except CheckpointError as e:
                if old.path not in self._reported:
                    log.warning("%s; keeping it for inspection instead of deleting it", e)
                    self._reported.add(old.path)
                continue
            with contextlib.suppress(FileNotFoundError):
                old.path.unlink()

    def newest_valid(self) -> tuple[CheckpointFile, dict[str, Any]] | None:
        """The newest checkpoint that verifies, with its state; None if there is none at all.

        Corrupt ones are logged by name and left in place. Raises CheckpointError if checkpoints
        exist but none is valid.
        """
        files = self.files()
        problems = []
        for ck in reversed(files):
            try:
                state = load(ck.path)
            except CheckpointError as e:
                log.warning("%s; leaving it in place and trying the previous one", e)
                self._reported.add(ck.path)
                problems.append(ck.path.name)
                continue
            return ck, state
        if problems:
            raise CheckpointError(
                f"no valid checkpoint in {self.directory} ({', '.join(problems)} failed their "
                "checks); move them away to start over, or use --fresh"
            )
        return None

    def __iter__(self) -> Iterator[CheckpointFile]:
        return iter(self.files())
