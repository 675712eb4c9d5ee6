"""A run directory as ``edgerl serve`` reads it: the way its trainer writes it.

A run is its owner's: the account that owns its directory. The server may run as another account
(the service's own user in the ``edgerl`` group, or root watching every user's runs), so what it
shows must be what that owner wrote there, never what a link or a planted file leads it to:

- the directory is opened without following a link in its place: a run that is a link is left
  out, found or named (a trainer never trains in one either);
- it is left out when an account other than its owner may add names in it (the rule of
  :mod:`edgerl.files.private`): what is in it may not be its owner's;
- each of its files is opened relative to that open directory, never through a link
  (``O_NOFOLLOW``), must be a regular file, and must belong to the directory's owner, so a hard
  link to another account's file is refused too, where the system lets one be made.

Runs of other accounts are read, not refused: the service's user reads the ``edgerl`` user's
runs, and root watches its users'. Read so, a hostile run shows its viewers nothing its owner
could not read already.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from edgerl.errors import RunDirError
from edgerl.files.csvread import CsvReader
from edgerl.files.private import UnsafePathError, open_dir, owner_name, writers
from edgerl.files.regular import FileTooLargeError, require_regular
from edgerl.report.status import MAX_STATUS_BYTES, STATUS_FILE, check_status

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_CONFIG_BYTES = 1 << 20  # a run's config.toml is a few KiB
OPEN_FILES = Path("/proc/self/fd")  # an open file as a path no rename or link can redirect


def _as_path(fd: int, otherwise: Path) -> Path:
    """The file open as ``fd`` as a path (Linux); elsewhere ``otherwise``, its name, which a
    reader opens without following a link in its place."""
    return OPEN_FILES / str(fd) if OPEN_FILES.is_dir() else otherwise


class OpenRun:
    """The run directory ``path`` held open while its files are read (a context manager).

    Raises UnsafePathError when it is a link or others may write in it, NotADirectoryError,
    FileNotFoundError or another OSError when it cannot be opened."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_dir(path)
        try:
            st = os.fstat(self.fd)
            who = writers(st)
            if who is not None:
                raise UnsafePathError(
                    errno.EPERM,
                    f"{who} may write in it (mode {stat.S_IMODE(st.st_mode):04o}), so what it "
                    "holds may not be its owner's",
                    str(path),
                )
        except BaseException:
            os.close(self.fd)
            raise
        self.owner = st.st_uid

    def __enter__(self) -> OpenRun:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    @property
    def here(self) -> Path:
        """The open directory as a path (Linux), for readers that take one: they must open its
        files without following links (as CsvReader does)."""
        return _as_path(self.fd, self.path)

    def open(self, name: str) -> BinaryIO:
        """File ``name`` of the run, opened for reading: raises FileNotFoundError, OSError ELOOP
        for a link, NotRegularFileError, IsADirectoryError, or OSError EPERM when it belongs to
        another account than the run (each with ``strerror`` for a sentence)."""
        where = str(self.path / name)
        try:
            fd = os.open(name, FILE_FLAGS, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise OSError(errno.ELOOP, "it is a symbolic link, not a file", where) from None
            raise type(e)(e.errno, e.strerror, where) from None
        try:
            st = require_regular(fd, Path(where))
            if st.st_uid != self.owner:
                raise OSError(
                    errno.EPERM,
                    f"it belongs to {owner_name(st.st_uid)}, not to {owner_name(self.owner)} "
                    "whose run it is",
                    where,
                )
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def read(self, name: str, limit: int) -> bytes:
        """The whole of file ``name`` (see :meth:`open`); FileTooLargeError beyond ``limit``."""
        with self.open(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise FileTooLargeError(
                errno.EFBIG, f"it is larger than {limit:,} bytes", str(self.path / name)
            )
        return data

    def check(self, name: str) -> None:
        """Raise what :meth:`open` raises for file ``name``, but nothing when it is missing."""
        with contextlib.suppress(FileNotFoundError), self.open(name):
            pass

    @contextlib.contextmanager
    def csv(self, name: str) -> Iterator[CsvReader]:
        """A CsvReader of file ``name``, opened as :meth:`open` does (raises what it raises)."""
        with self.open(name) as f:
            path = _as_path(f.fileno(), self.path / name)
            yield CsvReader(path, follow=path != self.path / name)  # that very file

    def files_in(self, folder: str) -> list[str]:
        """The names of the regular files in the run's ``folder`` (no link followed, in its
        place or in it); empty when it is missing, not the run owner's, or unreadable."""
        try:
            fd = open_dir(folder, self.fd)
        except OSError:
            return []
        try:
            if os.fstat(fd).st_uid != self.owner:
                return []
            with os.scandir(fd) as entries:
                return [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:
            return []
        finally:
            os.close(fd)


def refusal(path: Path) -> str | None:
    """Why ``path`` is not read as a run (a phrase: a link, others may write in it), or None
    (it is read, or it cannot be opened now, which its readers say)."""
    try:
        with OpenRun(path):
            return None
    except UnsafePathError as e:
        return e.strerror
    except OSError:
        return None


def read_run_status(run: OpenRun) -> dict[str, Any]:
    """The checked status document of the run; raises RunDirError when it is missing,
    unreadable (a link, another account's file) or damaged."""
    path = run.path / STATUS_FILE
    try:
        data = run.read(STATUS_FILE, MAX_STATUS_BYTES)
    except FileNotFoundError:
        raise RunDirError(f"{path} does not exist: no trainer has written there yet") from None
    except OSError as e:
        raise RunDirError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested beyond reason
        raise RunDirError(
            f"{path} is damaged (it is not JSON); a running trainer rewrites it every few seconds"
        ) from None
    return check_status(doc, path)


def read_run_config(run: OpenRun) -> dict[str, Any]:
    """The run's config.toml as a table; empty when it is missing, unreadable or damaged."""
    try:
        saved = tomllib.loads(run.read("config.toml", MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return {}
    return saved


def foreign_stream(run_dir: Path, stream: Path) -> str | None:
    """Why the frame stream ``stream``, which the run's display.json names, is not shown (a
    display.json may name any run's stream: it must be the run owner's), or None."""
    try:
        with OpenRun(run_dir) as run:
            owner = run.owner
    except OSError as e:
        return f"cannot read {e.filename}: {e.strerror or e}"
    try:
        st = os.lstat(stream)
    except OSError:
        return None  # gone: the reader says so
    if st.st_uid != owner:
        return (
            f"the frame stream display.json names belongs to {owner_name(st.st_uid)}, not to "
            f"{owner_name(owner)} whose run {run_dir.name} is: not shown"
        )
    return None


def pointer_refusal(run_dir: Path) -> str | None:
    """Why the run's display.json is not read (the run is not, it is a link, or another
    account's file), or None."""
    try:
        with OpenRun(run_dir) as run:
            run.check("display.json")
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read {e.filename}: {e.strerror or e}"
    return None
