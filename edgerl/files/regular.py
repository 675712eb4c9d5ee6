"""Opening the files edgerl reads back only when they are plain files.

A run directory, a config or a clock marker may have anything put in a file's place: a FIFO
blocks its reader in ``open()`` (and ignores SIGTERM while it does), ``/dev/zero`` or
``/dev/urandom`` feed it for ever. Every reader of such a file opens it here: without blocking,
checked to be a regular file, and (where the file is read whole) no larger than its limit.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class NotRegularFileError(OSError):
    """A path names something other than a regular file (a FIFO, a device, a socket)."""


class FileTooLargeError(OSError):
    """A file read whole is larger than its reader's limit."""


def open_regular(path: Path, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading in binary, never blocking in ``open()``.

    Without ``follow``, a symbolic link in the file's place is refused (a file of a run
    directory, where a link could lead a reader to another account's file): OSError ELOOP.
    Raises FileNotFoundError, IsADirectoryError, NotRegularFileError (a FIFO, a device, a
    socket) or another OSError; each has ``strerror`` for a sentence.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise OSError(errno.ELOOP, "it is a symbolic link, not a file", str(path)) from None
        raise
    try:
        require_regular(fd, path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def require_regular(fd: int, path: Path) -> os.stat_result:
    """The stat of ``fd`` (opened with O_NONBLOCK), made blocking again, when it is a regular
    file; raises IsADirectoryError or NotRegularFileError otherwise."""
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a directory, not a file", str(path))
    if not stat.S_ISREG(st.st_mode):
        kind = KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise NotRegularFileError(errno.EINVAL, f"it is {kind}, not a file", str(path))
    os.set_blocking(fd, True)
    return st


def read_regular(
    path: Path, limit: int | None = None, streams: bool = False, follow: bool = True
) -> bytes:
    """The whole content of the regular file ``path``, at most ``limit`` bytes.

    With ``streams``, a FIFO or a device is read too, as it comes (a file the user names on the
    command line may be one on purpose: ``--config <(...)``); a directory is still refused.
    Without ``follow`` a link in the file's place is refused (see :func:`open_regular`).
    Raises what :func:`open_regular` raises, and FileTooLargeError when the file holds more than
    ``limit`` bytes (it is not read past the limit).
    """
    if streams:
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, "it is a directory, not a file", str(path))
        opened: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed by the with below
    else:
        opened = open_regular(path, follow)
    with opened as f:
        if limit is None:
            return f.read()
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(
            errno.EFBIG, f"it is larger than {limit:,} bytes, too large to be this file", str(path)
        )
    return data
