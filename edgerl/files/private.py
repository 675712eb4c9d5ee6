"""Folders only their owner can change: where a run is written, nothing another account planted.

A run directory is written by its user's trainer (root's, for the service). Another local account
that could add or rename a name in it, or in a folder above it, could put a link where the lock,
a checkpoint or a CSV goes and have the trainer write through it. So a folder edgerl writes a run
into is taken only when it is no link, belongs to the user who runs edgerl, and can be changed by
no other account; every folder above it belongs to that user or root and can be changed by no
other account either, unless it is sticky (as /tmp: there others may add names of their own, never
rename or remove another's). Then only the owner (and root) can put a name inside, and the names
edgerl opens there with O_NOFOLLOW are its own.

"Changed by another account": writable by every account, or by a group that has a member other
than the owner (a user's private group, as Debian and Ubuntu give each user, does not count).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

# What a run keeps from other users: files are 0640 and directories 0750 (see run_umask).
PRIVATE_BITS = 0o007
RUN_UMASK = 0o027


@contextlib.contextmanager
def run_umask() -> Iterator[None]:
    """While training, create files 0640 and directories 0750 at most (a stricter umask stays):
    checkpoints, status and metrics are readable by the owner and the run's group only."""
    old = os.umask(RUN_UMASK)
    os.umask(old | RUN_UMASK)
    try:
        yield
    finally:
        os.umask(old)


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(OSError):
    """A folder edgerl would write into, or one above it, is not the user's alone; ``strerror``
    is the phrase that says why (``str(path)`` is in ``filename``)."""


def owner_name(uid: int) -> str:
    """The account name of ``uid``, or ``uid <n>`` when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


@functools.lru_cache(maxsize=64)
def _group_has_others(gid: int, uid: int) -> bool:
    """Whether group ``gid`` has a member (listed, or by primary group) other than ``uid``."""
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return True  # a group nobody can name: assume the worst
    try:
        me = pwd.getpwuid(uid).pw_name
    except KeyError:
        me = None
    if any(name != me for name in group.gr_mem):
        return True
    return any(p.pw_gid == gid and p.pw_uid != uid for p in pwd.getpwall())


def writers(st: os.stat_result) -> str | None:
    """Which other accounts may add, rename or remove names in the folder ``st`` describes,
    as a phrase ("every account", "group staff"), or None when only its owner (and root) may."""
    if st.st_mode & stat.S_IWOTH:
        return "every account"
    if st.st_mode & stat.S_IWGRP and _group_has_others(st.st_gid, st.st_uid):
        try:
            return f"group {grp.getgrgid(st.st_gid).gr_name}"
        except KeyError:
            return f"group {st.st_gid}"
    return None


def check_above(path: Path) -> None:
    """Check every folder above ``path`` (where links lead): owned by this user or root, and
    changeable by no other account unless sticky. Raises UnsafePathError naming the first that
    is not."""
    me = os.geteuid()
    real = Path(os.path.realpath(path.parent if path.name else path))
    for folder in [real, *real.parents]:
        try:
            st = os.stat(folder)
        except OSError:
            continue  # not there yet: made by this user below a folder that is checked
        if st.st_uid not in (me, 0):
            raise UnsafePathError(
                errno.EPERM,
                f"it lies in {folder}, which belongs to {owner_name(st.st_uid)} (who could "
                "replace what edgerl writes there with links)",
                str(path),
            )
        who = writers(st)
        if who and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                errno.EPERM,
                f"it lies in {folder}, which {who} can change (mode "
                f"{stat.S_IMODE(st.st_mode):04o}, not sticky)",
                str(path),
            )


def check_own_dir(fd: int, path: Path) -> os.stat_result:
    """The stat of the folder open as ``fd`` when it belongs to this user and no other account
    can change it; raises UnsafePathError otherwise."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafePathError(
            errno.EPERM,
            f"it belongs to {owner_name(st.st_uid)}, not to {owner_name(os.geteuid())}",
            str(path),
        )
    who = writers(st)
    if who:
        raise UnsafePathError(
            errno.EPERM,
            f"{who} can write in it (mode {stat.S_IMODE(st.st_mode):04o})",
            str(path),
        )
    return st


def open_dir(path: Path | str, dir_fd: int | None = None) -> int:
    """A descriptor of the folder ``path`` (relative to ``dir_fd`` when given), never through a
    link in its place: a link raises UnsafePathError, anything but a folder NotADirectoryError."""
    try:
        return os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(path, dir_fd):
            raise UnsafePathError(
                errno.ELOOP, "it is a symbolic link, where edgerl keeps a folder", str(path)
            ) from None
        raise


def _is_link(path: Path | str, dir_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def own_subdir(parent_fd: int, name: str, parent: Path, mode: int = 0o750) -> int:
    """A descriptor of folder ``name`` in the folder open as ``parent_fd``, made (``mode``, less
    the umask) when it is not there; it must be no link and this user's alone (raises
    UnsafePathError, or another OSError as the system gives it)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent_fd)
    fd = open_dir(name, parent_fd)
    try:
        check_own_dir(fd, parent / name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_own_dir(path: Path, mode: int = 0o750) -> Path:
    """Make folder ``path`` (and the folders above it that are missing) where a run keeps its
    files, and check it is no link and this user's alone; returns ``path``. For a writer that
    names files by path below a run directory already checked (see the module's account):
    raises UnsafePathError or another OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    parent_fd = open_dir(path.parent)
    try:
        os.close(own_subdir(parent_fd, path.name, path.parent, mode))
    finally:
        os.close(parent_fd)
    return path


def links_in(fd: int) -> list[str]:
    """The names of the symbolic links in the folder open as ``fd``, sorted."""
    with os.scandir(fd) as entries:
        return sorted(e.name for e in entries if e.is_symlink())
