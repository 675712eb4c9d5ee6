"""The user's side of the machine: the ``edgerl`` group and membership in it, ``/dev/shm`` for
the frame stream, a display for ``edgerl view``, disk for the run directory."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from edgerl.doctor.core import Check, Context
from edgerl.errors import EdgerlError, MissingDependencyError
from edgerl.words import fmt_bytes

SERVICE_UNIT = Path("/etc/systemd/system/edgerl.service")  # where scripts/install.sh puts it
HIDDEN_SDL_DRIVERS = ("dummy", "offscreen")  # SDL opens these, but nobody sees the window
LOG_ROOM = 64 << 20  # metrics, load logs and the odd export beside the checkpoints


def check_group(ctx: Context) -> Check:
    """The group that may read a root service's runs and frame stream, and this user in it."""
    group = ctx.cfg.display.group
    if not group:
        return Check(
            "edgerl group", "skip", "display.group is empty: a root service's runs stay private"
        )
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        if SERVICE_UNIT.exists():
            return Check(
                "edgerl group",
                "fail",
                f"the group {group!r} does not exist: only root can watch the service's training",
                f"sudo groupadd --system {group} (scripts/install.sh does), then restart the "
                "service",
            )
        return Check(
            "edgerl group",
            "skip",
            f"no group {group!r}: it is only needed to watch a training service (scripts/"
            "install.sh creates it)",
        )
    data = {"group": group, "gid": entry.gr_gid}
    if ctx.is_root:
        return Check(
            "edgerl group", "pass", f"group {group} exists; root reads every run", data=data
        )
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        user = str(os.getuid())
    if entry.gr_gid in os.getgroups() or entry.gr_gid == os.getgid():
        return Check(
            "edgerl group",
            "pass",
            f"you ({user}) are in group {group}: you can watch the service's training",
            data=data,
        )
    if user in entry.gr_mem:
        return Check(
            "edgerl group",
            "warn",
            f"{user} was added to group {group} after this login began: not in effect yet",
            f"log out and in again (or: newgrp {group})",
            data,
        )
    return Check(
        "edgerl group",
        "warn",
        f"you ({user}) are not in group {group}: edgerl view cannot watch the service's training",
        f"sudo usermod -aG {group} {user}, then log in again",
        data,
    )


def check_shm(ctx: Context) -> Check:
    """``/dev/shm`` takes the frame stream: there, writable, with room for a ring."""
    from edgerl.stream import HEADER, SHM_DIR, slot_size

    need = HEADER.size + 4 * slot_size(84, 84)  # FrameRing's default of 4 slots
    if not SHM_DIR.is_dir():
        return Check(
            "/dev/shm",
            "warn",
            f"{SHM_DIR} is missing: the frame stream for edgerl view goes to /tmp",
            "mount a tmpfs on /dev/shm (in Docker: --ipc=host or --shm-size=64m)",
        )
    try:
        with tempfile.NamedTemporaryFile(dir=SHM_DIR, prefix=".edgerl-doctor-") as f:
            f.write(bytes(need))
            f.flush()
    except OSError as e:
        return Check(
            "/dev/shm",
            "fail",
            f"cannot write {fmt_bytes(need)} to {SHM_DIR} ({e.strerror}): training cannot "
            "publish frames for edgerl view",
            f"sudo chmod 1777 {SHM_DIR}, or free space in it; or set display.enabled=false",
        )
    free = shutil.disk_usage(SHM_DIR).free
    return Check(
        "/dev/shm",
        "pass",
        f"writable, {fmt_bytes(free)} free; a frame stream takes {fmt_bytes(need)}",
        data={"free_bytes": free, "stream_bytes": need},
    )


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence what C libraries print on fd 2 (SDL complains about every driver it tries)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_display(ctx: Context) -> Check:
    """Whether ``edgerl view`` would get a window someone can see, and through which SDL driver."""
    from edgerl.display.render import import_pygame, open_display

    try:
        pg = import_pygame("edgerl view")
    except MissingDependencyError:
        return Check(
            "display",
            "warn",
            "pygame is not installed: edgerl view needs it for a window (--console does not)",
            "pip install 'edgerl[viewer]'",
        )
    asked = os.environ.get("SDL_VIDEODRIVER", "")
    try:
        with _quiet_stderr():
            open_display(pg)
        driver = pg.display.get_driver()
    except EdgerlError as e:
        return Check(
            "display", "warn", str(e), "edgerl view --console works in a terminal over ssh"
        )
    finally:
        pg.display.quit()
    data = {"sdl_driver": driver, "SDL_VIDEODRIVER": asked or None}
    if driver in HIDDEN_SDL_DRIVERS:
        how = f"SDL_VIDEODRIVER={asked}" if asked else "no display server found"
        return Check(
            "display",
            "warn",
            f"SDL would use its {driver!r} driver ({how}): a window would not be seen",
            "on a desktop set DISPLAY or WAYLAND_DISPLAY (and unset SDL_VIDEODRIVER); on a "
            "bare console SDL_VIDEODRIVER=kmsdrm; over ssh edgerl view --console",
            data,
        )
    where = os.environ.get("WAYLAND_DISPLAY") or os.environ.get("DISPLAY") or ""
    return Check(
        "display",
        "pass",
        f"edgerl view opens a window through SDL's {driver!r} driver"
        + (f" on {where}" if where and driver in ("x11", "wayland") else ""),
        data=data,
    )


def checkpoint_bytes(ctx: Context) -> int:
    """About what one checkpoint of this game's network takes: the online and target networks
    and Adam's two moments, four copies of the weights."""
    from edgerl.learners.factory import policy_network

    if ctx.spec is None:
        return 32 << 20  # the Nature CNN for Atari is ~27 MiB
    net = policy_network(ctx.cfg, ctx.spec)
    return 4 * sum(p.numel() * p.element_size() for p in net.parameters()) + (64 << 10)


def check_disk(ctx: Context) -> Check:
    """The run directory ``edgerl train`` would use here can be written and has room."""
    from edgerl.report.rundir import run_dir_of

    cfg = ctx.cfg
    run_dir = run_dir_of(cfg)
    existing = run_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = "set train.run_dir (or --run-dir) to a directory you can write"
    if not existing.is_dir():
        return Check(
            "run dir", "fail", f"{run_dir} cannot be made: {existing} is not a directory", fix
        )
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".edgerl-doctor-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return Check("run dir", "fail", f"{run_dir} is not writable ({e.strerror})", fix)
    free = shutil.disk_usage(existing).free
    checkpoint = checkpoint_bytes(ctx)
    need = (cfg.train.keep_checkpoints + 1) * checkpoint + LOG_ROOM
    found = (
        f"{run_dir}: writable, {fmt_bytes(free)} free; a run takes about {fmt_bytes(need)} "
        f"({cfg.train.keep_checkpoints} checkpoints of {fmt_bytes(checkpoint)}, one being written)"
    )
    data = {"run_dir": str(run_dir), "free_bytes": free, "need_bytes": need}
    if free < need:
        return Check(
            "run dir",
            "fail",
            found,
            "free disk space, or set train.run_dir on a disk with room",
            data,
        )
    return Check("run dir", "pass", found, data=data)
