"""The run directory: what a run writes, one trainer at a time.

Layout::

    <run_dir>/config.toml        the resolved config of the newest session
    <run_dir>/metrics.csv        one row every train.log_every_s
    <run_dir>/checkpoints/       ckpt-<seq>-step<step>.ckpt (see checkpoint.py)
    <run_dir>/.lock              held (flock) by the trainer using the directory
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import itertools
import logging
import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgerl.errors import RunDirError
from edgerl.files.atomic import remove_stale_temps
from edgerl.files.private import (
    PRIVATE_BITS,
    UnsafePathError,
    check_above,
    check_own_dir,
    links_in,
    open_dir,
    own_subdir,
)
from edgerl.files.processes import pid_alive
from edgerl.files.regular import read_regular
from edgerl.words import plural, printable

if TYPE_CHECKING:
    from edgerl.config import Config

log = logging.getLogger(__name__)


def default_run_dir(short_env: str) -> Path:
    """``runs/<env name>`` under the current directory, e.g. ``runs/Pong-v5``."""
    return Path("runs") / short_env


def run_dir_of(cfg: Config) -> Path:
    """The run directory ``cfg`` names: ``train.run_dir``, else ``runs/<game>``."""
    from edgerl.envs.spec import short_env_name

    return Path(cfg.train.run_dir or default_run_dir(short_env_name(cfg.env.id)))


def service_state_dir() -> Path:
    """The service's state directory: ``$STATE_DIRECTORY`` (set by systemd) or /var/lib/edgerl."""
    env = os.environ.get("STATE_DIRECTORY")
    return Path(env.split(":")[0]) if env else Path("/var/lib/edgerl")


def service_run_dir(env_id: str) -> Path:
    """Where the service trains ``env_id`` unless train.run_dir says otherwise."""
    from edgerl.envs import short_env_name

    return service_state_dir() / "runs" / short_env_name(env_id)


def share_with_group(fds: list[int], group: str) -> bool:
    """chgrp the folders open as ``fds`` to ``group`` and add group read/traverse and setgid,
    through their descriptors (never a link in their place); False if there is no such group."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    for fd in fds:
        try:
            os.fchown(fd, -1, gid)
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            os.fchmod(fd, mode | stat.S_ISGID | stat.S_IRGRP | stat.S_IXGRP)
        except OSError:
            continue
    return True


def trainer_of(path: Path) -> int | None:
    """The pid of the live trainer using run directory ``path`` (the pid its lock file names,
    if that process is still an edgerl), or None. Takes no lock: a viewer's look must never
    make a starting trainer find the directory in use."""
    try:
        text = read_regular(path / ".lock", 64, follow=False).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.isdigit() or not 0 < int(text) < 1 << 22:
        return None
    return int(text) if pid_alive(int(text)) else None


# Why a run directory could not be written, by errno, and what the user can do about it
_UNWRITABLE: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk is full", "free some space, or give another directory with --run-dir"),
    errno.EACCES: (
        "permission denied",
        "give a directory of your own with --run-dir, or fix its owner and mode",
    ),
    errno.EPERM: ("operation not permitted", "give a directory of your own with --run-dir"),
    errno.EROFS: ("a read-only file system", "give a directory on a writable disk with --run-dir"),
    errno.ENOTDIR: ("a part of its path is a file", "give another directory with --run-dir"),
    errno.EEXIST: ("a file is in the way", "give another directory with --run-dir"),
    errno.EDQUOT: (
        "over your disk quota",
        "free some space, or give another directory with --run-dir",
    ),
}


def unwritable(path: Path, error: OSError) -> str:
    """The sentence for a run directory that could not be made or written, with the fix that
    fits the error (a folder under /proc "does not exist" however its mode is set)."""
    reason, fix = _UNWRITABLE.get(
        error.errno or 0,
        (error.strerror or str(error), "give a directory on a disk of yours with --run-dir"),
    )
    return f"run directory {path} is not writable ({reason}): {fix}"


# The folders a run keeps besides checkpoints/, checked as it is when they are there.
RUN_FOLDERS = ("replay", "export", "recordings", "tensorboard")


class RunDir:
    """A run directory held with an exclusive lock while a trainer uses it.

    It is taken only when it is no link, belongs to the user who trains and no other account can
    change it or a folder above it (see :mod:`edgerl.files.private`); it and its folders must
    hold no link. Its lock, its write test, its modes and its group are handled through its
    descriptor, which stays open while the run does; every other writer opens its files by name
    with O_NOFOLLOW, in a folder no other account can add a name to.
    """

    def __init__(self, path: Path) -> None:
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            raise RunDirError(
                f"run directory {printable(str(path))} has a name that is not UTF-8 text, which "
                "the run's files (config.toml, status.json) cannot hold: give it a name of UTF-8 "
                "text"
            ) from None
        if "\0" in str(path):
            raise RunDirError(
                f"run directory {printable(str(path))} has a NUL character in its name, which no "
                "file name can hold: give another name with --run-dir"
            )
        # `--run-dir .` (or `..`) has no name to open in its parent: taken as the absolute path.
        # Made the real path in open where a link is on the way, so none can change under the
        # writers, who name their files by this path.
        self.path = Path(os.path.abspath(path)) if path.name in ("", "..") else path
        self._lock_fd: int | None = None
        self._dir_fd: int | None = None

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def config_file(self) -> Path:
        return self.path / "config.toml"

    def move_aside(self) -> Path | None:
        """For ``--fresh``: rename the run to ``<name>.old-<time>``; returns the new path."""
        if not self.path.exists():
            return None
        self._check_trusted()
        if not holds_run(self.path):  # never /tmp or a home folder renamed
            self._check_empty()
            return None
        try:  # never another account's folder either
            fd = open_dir(self.path)
            try:
                check_own_dir(fd, self.path)
            finally:
                os.close(fd)
        except UnsafePathError as e:
            raise RunDirError(
                f"cannot move {self.path} aside for --fresh: {e.strerror}; give a folder of your "
                "own with --run-dir"
            ) from None
        except OSError as e:
            raise RunDirError(unwritable(self.path, e)) from None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.old-{stamp}")
        n = 1
        while aside.exists():
            aside = self.path.with_name(f"{self.path.name}.old-{stamp}-{n}")
            n += 1
        self._check_not_in_use()
        try:
            self.path.rename(aside)
        except OSError as e:
            raise RunDirError(f"cannot move {self.path} aside for --fresh: {e.strerror}") from None
        return aside

    def _check_not_in_use(self) -> None:
        try:
            fd = os.open(self.path / ".lock", os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (FileNotFoundError, IsADirectoryError):
            return
        except OSError as e:
            if e.errno == errno.ELOOP:
                return  # a link: no trainer holds it (open refuses it in the run moved aside)
            raise RunDirError(unwritable(self.path, e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            raise RunDirError(self._in_use_message(fd)) from None
        finally:
            os.close(fd)

    def _in_use_message(self, fd: int) -> str:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        return (
            f"run directory {self.path} is in use by another edgerl process (pid {pid}); "
            "stop it first or use another --run-dir"
        )

    def _check_trusted(self) -> None:
        """Refuse a run directory that is a link, or lies in a folder another account can change;
        raises RunDirError."""
        try:
            check_above(self.path)
        except UnsafePathError as e:
            raise RunDirError(
                f"run directory {self.path} cannot be used: {e.strerror}; give a folder under one "
                "that only you (or root) can change with --run-dir"
            ) from None
        if self.path.is_symlink():
            raise RunDirError(
                f"run directory {self.path} is a symbolic link (to {os.readlink(self.path)}), "
                "which edgerl does not follow: give the folder itself with --run-dir"
            )

    def open(self, group: str = "") -> None:
        """Create the directory (or check the one there), check that it is writable and take its
        lock; raises RunDirError.

        As root, directories created here are given to ``group`` (when it exists) with group
        read/traverse and setgid, so its members can watch a service's run (``edgerl view``).
        """
        self._check_trusted()
        created = _make_parents(self.path.parent)
        if created:  # checked again: another account may have made one of them meanwhile
            self._check_trusted()
        # Every writer names the run by this path: with a link on the way, the real one (the
        # one checked folder by folder), never the link another account might change later.
        real = Path(os.path.realpath(self.path.parent))
        if real != Path(os.path.abspath(self.path.parent)):
            self.path = real / self.path.name
        try:
            parent_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise RunDirError(unwritable(self.path, e)) from None
        fds: list[int] = []
        try:
            try:
                os.mkdir(self.path.name, 0o750, dir_fd=parent_fd)
                created.append(self.path)
            except FileExistsError:
                pass
            fd = self._dir_fd = open_dir(self.path.name, parent_fd)
            ours = self.path in created or any(_lexists(mark, fd) for mark in RUN_MARKS)
            if not ours:
                self._check_empty()
            check_own_dir(fd, self.path)
            self._refuse_links(fd, self.path)
            checkpoints = own_subdir(fd, "checkpoints", self.path)
            fds.append(checkpoints)
            self._refuse_links(checkpoints, self.checkpoints)
            for name in RUN_FOLDERS:
                if _lexists(name, fd):
                    sub = own_subdir(fd, name, self.path)
                    fds.append(sub)
                    self._refuse_links(sub, self.path / name)
            self._write_test(fd)
            self._lock(fd)
            # Only a directory made here or holding a run is tidied and kept private: an empty
            # one the user gave keeps its mode (nothing else of theirs is in it to clean).
            tidy = [(self.path, fd), (self.checkpoints, checkpoints)] if ours else []
            for directory, dir_fd in tidy or [(self.checkpoints, checkpoints)]:
                remove_stale_temps(directory)  # partial writes of killed trainers
                with contextlib.suppress(OSError):  # checkpoints and status are nobody else's
                    mode = stat.S_IMODE(os.fstat(dir_fd).st_mode)
                    if mode & PRIVATE_BITS:
                        os.fchmod(dir_fd, mode & ~PRIVATE_BITS)
            if group and os.geteuid() == 0:  # the parent only if made here (never /tmp or ~)
                parent = [parent_fd] if self.path.parent in created else []
                share_with_group([*parent, fd, checkpoints], group)
        except UnsafePathError as e:
            self.close()
            where = (
                f"run directory {self.path}"
                if e.filename == str(self.path)
                else f"folder {e.filename} of run directory {self.path}"
            )
            fix = (
                f"chmod go-w {e.filename} if all in it is yours"
                if "can write in it" in (e.strerror or "")
                else "remove it if the run is yours"
            )
            raise RunDirError(
                f"{where} cannot be used: {e.strerror}, so another account could have put links "
                f"in it for edgerl to write through; {fix}, or give another directory with "
                "--run-dir"
            ) from None
        except OSError as e:
            self.close()
            raise RunDirError(unwritable(self.path, e)) from None
        except BaseException:
            self.close()
            raise
        finally:
            for sub in fds:
                os.close(sub)
            os.close(parent_fd)

    def _refuse_links(self, fd: int, where: Path) -> None:
        links = links_in(fd)
        if links:
            named = ", ".join(links[:3]) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
            raise RunDirError(
                f"{where} holds {plural(len(links), 'symbolic link')} ({named}), which edgerl "
                f"does not follow in a run: remove {'it' if len(links) == 1 else 'them'} (a "
                "run's files and folders are its own), or give another directory with --run-dir"
            )

    def _write_test(self, fd: int) -> None:
        """Create and remove a file in the directory: a read-only disk or a full one is said now,
        not at the first checkpoint."""
        probe = f".write-test-{os.getpid()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe, dir_fd=fd)  # a leftover of an earlier process with this pid
        os.close(os.open(probe, flags, 0o600, dir_fd=fd))
        os.unlink(probe, dir_fd=fd)

    def _lock(self, fd: int) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            lock = os.open(".lock", flags, 0o640, dir_fd=fd)
        except IsADirectoryError:
            raise RunDirError(
                f"{self.path / '.lock'} is a folder: remove it (edgerl keeps its lock there), "
                "or give another directory with --run-dir"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                raise RunDirError(
                    f"{self.path / '.lock'} is not a file: remove it (edgerl keeps its lock "
                    "there), or give another directory with --run-dir"
                )
            os.set_blocking(lock, True)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = self._in_use_message(lock)
            os.close(lock)
            raise RunDirError(message) from None
        except BaseException:
            os.close(lock)
            raise
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = lock

    def _check_empty(self) -> None:
        """Refuse an existing directory that holds no run and is not empty (``/tmp``, a home
        folder, ``/etc`` through a link): a run there would change its mode and mix its files
        with others'. Raises RunDirError."""
        try:
            entries = sum(1 for _ in itertools.islice(self.path.iterdir(), 1000))
        except NotADirectoryError:
            return  # said by the mkdir below, with the fix
        except OSError as e:
            raise RunDirError(unwritable(self.path, e)) from None
        seeds = seed_runs_in(self.path)
        if seeds:
            shown = ", ".join(seeds[:3]) + (f" and {len(seeds) - 3} more" if len(seeds) > 3 else "")
            raise RunDirError(
                f"{self.path} holds runs of `edgerl train --seeds` ({shown}), not a run of its "
                "own: give the same --seeds to go on with them, or another directory with "
                "--run-dir"
            )
        if entries:
            raise RunDirError(
                f"{self.path} holds {entries:,}{'+' if entries == 1000 else ''} "
                f"{'entry' if entries == 1 else 'entries'} but no edgerl run: give a new or "
                "empty directory (or a run's) with --run-dir, e.g. "
                f"{self.path / 'edgerl-run'}"
            )

    def close(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                # No pid is left behind: a viewer reads the lock file without taking the lock
                # (trainer_of), and the process that trained may live on (a test, a service).
                os.ftruncate(self._lock_fd, 0)
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None


def _lexists(name: str, dir_fd: int) -> bool:
    """Whether ``name`` is in the folder open as ``dir_fd`` (a link counts, never followed)."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return False
    return True


def _make_parents(folder: Path) -> list[Path]:
    """Make ``folder`` and the folders above it that are missing, each 0755 at most (never more
    open whatever the umask: another account that could rename them could swap the run for a
    link); returns those made, outermost first."""
    missing = []
    for p in [folder, *folder.parents]:
        if os.path.lexists(p):
            break
        missing.append(p)
    made = []
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            continue
        except OSError:
            break  # said with the fix when the run directory cannot be opened below
        with contextlib.suppress(OSError):
            os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o022)
        made.append(p)
    return made


# What only a run directory holds: a trainer has been there.
RUN_MARKS = ("config.toml", "checkpoints", ".lock", "status.json", "metrics.csv")


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a directory a trainer has used (a link in a mark's place counts)."""
    try:  # a folder this user may not enter holds no run it can use
        return path.is_dir() and any(os.path.lexists(path / mark) for mark in RUN_MARKS)
    except OSError:
        return False


def seed_runs_in(folder: Path) -> list[str]:
    """The names of the runs in ``folder`` when it holds no run itself but runs in its folders
    (``edgerl train --seeds``' ``seed-K``), else an empty list."""
    try:  # a folder this user may not read (a service's run) is no folder of seeds here:
        if not folder.is_dir() or holds_run(folder):  # its reader says why in a sentence
            return []
        return sorted(p.name for p in folder.iterdir() if holds_run(p))
    except OSError:
        return []


def run_section(run_dir: Path, section: str) -> dict[str, Any] | None:
    """The ``[section]`` table of the run kept in ``run_dir`` (from its config.toml): None when
    there is no run's config there or it is damaged, empty when it has no such table."""
    from edgerl.config.parse import parse_toml_file
    from edgerl.errors import ConfigError

    try:
        saved = parse_toml_file(run_dir / "config.toml", follow=False)
    except ConfigError:  # missing or damaged: nothing is known of it
        return None
    table = saved.get(section, {})
    return table if isinstance(table, dict) else {}  # the file may be damaged


def run_env(run_dir: Path) -> dict[str, Any]:
    """The ``[env]`` table of the run kept in ``run_dir`` (from its config.toml); empty when
    there is none or it is damaged."""
    return run_section(run_dir, "env") or {}


def run_game(run_dir: Path) -> str | None:
    """The game of the run kept in ``run_dir`` (from its config.toml), or None."""
    game = run_env(run_dir).get("id")
    return game if isinstance(game, str) and game else None
