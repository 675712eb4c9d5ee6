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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgerl.errors import RunDirError
from edgerl.files.atomic import remove_stale_temps
from edgerl.files.processes import pid_alive
from edgerl.files.regular import read_regular
from edgerl.words import printable

if TYPE_CHECKING:
    from edgerl.config import Config

log = logging.getLogger(__name__)

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


def share_with_group(paths: list[Path], group: str) -> bool:
    """chgrp ``paths`` to ``group`` and add group read/traverse and setgid; False if no group."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    for path in dict.fromkeys(paths):
        try:
            os.chown(path, -1, gid)
            mode = path.stat().st_mode
            os.chmod(path, mode | stat.S_ISGID | stat.S_IRGRP | stat.S_IXGRP)
        except OSError:
            continue
    return True


def trainer_of(path: Path) -> int | None:
    """The pid of the live trainer using run directory ``path`` (the pid its lock file names,
    if that process is still an edgerl), or None. Takes no lock: a viewer's look must never
    make a starting trainer find the directory in use."""
    try:
        text = read_regular(path / ".lock", 64).decode("ascii").strip()
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


class RunDir:
    """A run directory held with an exclusive lock while a trainer uses it."""

    def __init__(self, path: Path) -> None:
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            raise RunDirError(
                f"run directory {printable(str(path))} has a name that is not UTF-8 text, which "
                "the run's files (config.toml, status.json) cannot hold: give it a name of UTF-8 "
                "text"
            ) from None
        self.path = path
        self._lock_fd: int | None = None

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
        if not holds_run(self.path):  # never /tmp or a home folder renamed
            self._check_empty()
            return None
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
        lock = self.path / ".lock"
        if not lock.exists():
            return
        fd = os.open(lock, os.O_RDWR)
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

    def open(self, group: str = "") -> None:
        """Create the directory, check that it is writable and take its lock; raises RunDirError.

        As root, directories created here are given to ``group`` (when it exists) with group
        read/traverse and setgid, so its members can watch a service's run (``edgerl view``).
        """
        created = [p for p in (self.path.parent, self.path, self.checkpoints) if not p.exists()]
        if self.path.is_symlink():
            log.info("run directory %s is a link to %s", self.path, self.path.resolve())
        ours = self.path in created or holds_run(self.path)
        if not ours:
            self._check_empty()
        try:
            self.checkpoints.mkdir(parents=True, exist_ok=True)
            probe = self.path / f".write-test-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise RunDirError(unwritable(self.path, e)) from None
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            message = self._in_use_message(fd)
            os.close(fd)
            raise RunDirError(message) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        # Only a directory made here or holding a run is tidied and kept private: an empty one
        # the user gave keeps its mode (nothing else of theirs is in it to clean).
        for directory in (self.path, self.checkpoints) if ours else (self.checkpoints,):
            remove_stale_temps(directory)  # partial writes of killed trainers
            with contextlib.suppress(OSError):  # checkpoints and status are nobody else's
                mode = stat.S_IMODE(directory.stat().st_mode)
                if mode & PRIVATE_BITS:
                    os.chmod(directory, mode & ~PRIVATE_BITS)
        if group and os.geteuid() == 0:  # the parent only if we created it (never /tmp or ~)
            parent = [self.path.parent] if self.path.parent in created else []
            share_with_group([*parent, self.path, self.checkpoints], group)

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


# What only a run directory holds: a trainer has been there.
RUN_MARKS = ("config.toml", "checkpoints", ".lock", "status.json", "metrics.csv")


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a directory a trainer has used."""
    return path.is_dir() and any((path / mark).exists() for mark in RUN_MARKS)


def run_section(run_dir: Path, section: str) -> dict[str, Any] | None:
    """The ``[section]`` table of the run kept in ``run_dir`` (from its config.toml): None when
    there is no run's config there or it is damaged, empty when it has no such table."""
    from edgerl.config.parse import parse_toml_file
    from edgerl.errors import ConfigError

    try:
        saved = parse_toml_file(run_dir / "config.toml")
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
