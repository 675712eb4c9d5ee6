"""The files that follow training (status.json, metrics.csv, load.csv, tegrastats.log, TensorBoard).

None of them is worth a training step: when one cannot be written (a full disk, a file in the
way), training goes on, the problem is logged once, ``status.json`` and the service's status line
name it, and the file catches up when it can be written again. Rows of the append-only files wait
in memory meanwhile (up to :data:`MAX_PENDING_BYTES` per file), so no row is lost or torn.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from edgerl.files.regular import require_regular

log = logging.getLogger(__name__)

# Rows waiting for a disk with room, per file: about 80,000 metrics.csv rows (4 days at 5 s).
MAX_PENDING_BYTES = 8 << 20


def reason(e: OSError) -> str:
    """A few words for why a write failed."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full"
    if e.errno == errno.EFBIG:
        return "the file size limit is reached"
    if e.errno == errno.ELOOP:
        return "a symbolic link is in its place, which edgerl does not follow"
    return e.strerror or str(e)


def csv_line(cells: list[str]) -> str:
    """One CSV row as text, line ending included: what an :class:`AppendFile` of a CSV appends."""
    buf = io.StringIO()
    csv.writer(buf).writerow(cells)
    return buf.getvalue()


class SideFiles:
    """Which side files cannot be written now, and why; shared by the threads that write them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, str] = {}

    def attempt(self, name: str, write: Callable[[], None]) -> bool:
        """Run ``write``; an OSError is recorded (logged once) instead of raised. True if it
        worked."""
        try:
            write()
        except OSError as e:
            self.failed(name, e)
            return False
        self.succeeded(name)
        return True

    def failed(self, name: str, error: OSError) -> None:
        why = reason(error)
        with self._lock:
            new = name not in self._failing
            self._failing[name] = why
        if new:
            log.warning(
                "cannot write %s (%s); training goes on and %s catches up when it can be written",
                name,
                why,
                name,
            )

    def succeeded(self, name: str) -> None:
        with self._lock:
            was = self._failing.pop(name, None)
        if was is not None:
            log.info("%s is written again", name)

    def problems(self) -> list[str]:
        """One phrase per file that cannot be written now, e.g. "cannot write metrics.csv (...)"."""
        with self._lock:
            return [f"cannot write {n} ({why})" for n, why in sorted(self._failing.items())]


class AppendFile:
    """A file that only grows by whole rows; what cannot be written now is written later.

    Writes go through ``os.write`` on an O_APPEND descriptor, so a short write (the disk filled
    mid-row) leaves exactly the unwritten bytes pending: the file never gets a torn or doubled row.
    """

    def __init__(
        self, path: Path, side: SideFiles, header: str = "", max_pending: int = MAX_PENDING_BYTES
    ) -> None:
        self.path = path
        self.side = side
        self.header = header.encode()
        self.max_pending = max_pending
        self._fd: int | None = None
        self._pending = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()

    def append(self, text: str) -> bool:
        """Queue ``text`` (whole rows) and write what is queued; False while it cannot be
        written."""
        data = text.encode()
        with self._lock:
            if len(self._pending) + len(data) > self.max_pending:
                if not self._dropped:
                    log.error(
                        "%s has had no room for %d bytes of rows; dropping new rows until it has",
                        self.path.name,
                        len(self._pending),
                    )
                self._dropped += 1
            else:
                self._pending += data
            return self._flush()

    def flush(self) -> bool:
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        if not self._pending and self._fd is not None:
            return True
        ok = self.side.attempt(self.path.name, self._write)
        if ok and self._dropped:
            log.error(
                "%s: %d rows were dropped while it could not be written",
                self.path.name,
                self._dropped,
            )
            self._dropped = 0
        return ok

    def _write(self) -> None:
        if self._fd is None:
            # Not blocking: a FIFO in the file's place would hold the trainer in open() or,
            # once its buffer is full, in write(). Never through a link: the rows would go
            # to whatever file it names (ELOOP instead, said as a file that cannot be written).
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
            fd = os.open(self.path, flags | os.O_CLOEXEC, 0o666)
            try:
                st = require_regular(fd, self.path)
                size = st.st_size
                if self.header and size == 0:
                    self._pending[:0] = self.header
                elif size and os.pread(fd, 1, size - 1) != b"\n":
                    # A row cut short by a kill, or damage: our first row starts a line of its own.
                    self._pending[:0] = b"\n"
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
        while self._pending:
            n = os.write(self._fd, self._pending)
            del self._pending[:n]

    def close(self) -> None:
        """Write what is pending (if it can), make it durable and close."""
        with self._lock:
            self._flush()
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
            if self._pending:
                log.error(
                    "%s: %d bytes of rows could not be written before the end",
                    self.path.name,
                    len(self._pending),
                )
