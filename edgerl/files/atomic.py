"""Writing a file so that a crash or power cut leaves either the old file or the new one."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from edgerl.files.processes import pid_alive

log = logging.getLogger(__name__)

# The temporary name write_atomic uses: ".<name>.tmp-<writer pid>".
TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """Where :func:`write_atomic` writes ``path`` before renaming it (names this process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def open_temp(path: Path) -> BinaryIO:
    """Create ``path``'s temporary file (:func:`temp_path`) anew and open it for writing. A name
    already there, a leftover of an earlier process with this pid or a link planted in a shared
    directory such as /tmp, is removed, never followed or written through: the file is created
    with O_EXCL and O_NOFOLLOW (a planted name another user owns in a sticky directory cannot be
    removed: OSError, nothing written)."""
    tmp = temp_path(path)
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # removes a link itself, never what it points to
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(tmp, flags, 0o666), "wb")


def claim_temp(path: Path) -> Path:
    """:func:`open_temp`'s file, empty and closed, for a library that writes by name
    (matplotlib, the ONNX exporter): once this process owns the name, another user cannot put a
    link there in a sticky directory."""
    open_temp(path).close()
    return temp_path(path)


def remove_stale_temps(directory: Path, alive: Callable[[int], bool] = pid_alive) -> list[Path]:
    """Delete the temporary files of :func:`write_atomic` calls whose process is gone (killed
    mid-write); returns them. A live writer's file, and every other file, is left alone.

    Call it only while holding the directory (its lock): then a file naming this very process
    is a leftover of an earlier process that had the same pid.
    """
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = TEMP_NAME.match(p.name)
        if m is None or not p.is_file() or p.is_symlink():
            continue
        pid = int(m["pid"])
        if pid != os.getpid() and alive(pid):
            continue
        try:
            size = p.stat().st_size
            p.unlink()
        except OSError as e:
            log.warning("cannot remove the stale temporary file %s: %s", p, e.strerror or e)
            continue
        log.info(
            "removed %s (%s bytes): a partial write by pid %d, which is gone", p, f"{size:,}", pid
        )
        removed.append(p)
    return removed


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a fsync'ed temporary file and a rename.

    Raises OSError (e.g. ENOSPC) with the temporary file removed and ``path`` untouched.
    """
    tmp = temp_path(path)
    try:
        with open_temp(path) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
