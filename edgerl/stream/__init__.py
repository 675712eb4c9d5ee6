"""The frame stream: the trainer publishes every Nth frame into a small shared-memory ring.

What is shown: the agent's own view, the newest 84x84 grey frame of one environment's stack. ALE's
C++ vector env does not hand out its 210x160 colour screen, and rendering it separately would cost
an emulator step, so the viewer shows exactly what the network sees (scaled up).

Layout of the ring, a file in a directory of the trainer's user in ``/dev/shm``
(``/dev/shm/edgerl-<uid>/edgerl-<hash of the run directory>.frames``), named in
``<run_dir>/display.json``::

    header   magic "EDGERLFR", version, slots, frame height/width, actions, session id,
             writes (count of frames written; the newest is in slot (writes - 1) % slots)
    slot[i]  seq_begin, meta (step, episode, return, epsilon, action, sps, cpu, gr3d, time,
             Q-values), crc32 of meta and frame, frame bytes, seq_end

A run on vector observations (CartPole) writes only ``{"frames": false, ...}`` as its pointer, so a
viewer can say there is nothing to show.

Writing is a copy (``pwrite``) into the next slot, bracketed by the slot's sequence numbers: it
never blocks, never waits for a reader and works when no viewer exists. A reader copies a slot
and accepts it only if ``seq_begin == seq_end`` and the CRC matches; the CRC is what makes this
safe on weakly ordered CPUs (ARM), where another core may see the sequence numbers before the
frame bytes. The file is created ``0640`` with group ``display.group`` (so users in that group
can watch a service running as root) and removed when the trainer exits. The reader side, what
``edgerl view`` uses, is :mod:`edgerl.stream.reader`.

``/dev/shm`` is writable by every local account, so nothing is created there under a name
another account could take first: the ring lives in a directory the trainer's user made (0750,
the display group may enter it), and a directory at that name that is not this user's own, or
that others may write in, or a link, is refused. The file is opened without following links. A
stream that cannot be made is a warning: training goes on without it.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import hashlib
import json
import logging
import math
import os
import re
import secrets
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.config import DisplayConfig
from edgerl.envs import EnvSpec
from edgerl.files.atomic import write_atomic

log = logging.getLogger(__name__)

MAGIC = b"EDGERLFR"
VERSION = 1
MAX_ACTIONS = 18  # the full Atari action set
POINTER_FILE = "display.json"
SHM_DIR = Path("/dev/shm")

# magic, version, slots, h, w, actions, reserved (aligns the counters), session, writes
HEADER = struct.Struct("<8sIIIIIIQQ")
WRITES_OFFSET = HEADER.size - 8
SEQ = struct.Struct("<Q")
META = struct.Struct(f"<QQddifffd{MAX_ACTIONS}f")
CRC = struct.Struct("<I")
DAMAGE_CHECK_EVERY_S = 0.25


@dataclass
class FrameMeta:
    """What the overlay shows next to a frame."""

    step: int = 0
    episode: int = 0
    episode_return: float = 0.0
    epsilon: float = 1.0
    action: int = -1
    sps: float = 0.0
    cpu_max_core: float = float("nan")
    gr3d: float = float("nan")
    time: float = 0.0
    q_values: tuple[float, ...] = ()

    @classmethod
    def of(
        cls,
        step: int,
        episode: int,
        episode_return: float,
        epsilon: float,
        action: int,
        sps: float,
        load: dict[str, float | None],
        q_values: Any = None,
    ) -> FrameMeta:
        """The overlay of a frame published now (``load`` as the monitor fills it; ``q_values``:
        the action values the actor computed, when it computed them)."""
        cpu, gr3d = load.get("cpu_max_core"), load.get("gr3d")
        return cls(
            step=step,
            episode=episode,
            episode_return=episode_return,
            epsilon=epsilon,
            action=action,
            sps=sps,
            cpu_max_core=math.nan if cpu is None else float(cpu),
            gr3d=math.nan if gr3d is None else float(gr3d),
            time=time.time(),
            q_values=() if q_values is None else tuple(float(q) for q in q_values),
        )

    def pack(self, num_actions: int) -> bytes:
        q = list(self.q_values[:MAX_ACTIONS]) + [float("nan")] * (MAX_ACTIONS - len(self.q_values))
        return META.pack(
            self.step,
            self.episode,
            self.episode_return,
            self.epsilon,
            self.action,
            self.sps,
            self.cpu_max_core,
            self.gr3d,
            self.time,
            *q,
        )

    @classmethod
    def unpack(cls, data: bytes, num_actions: int) -> FrameMeta:
        v = META.unpack(data)
        q = tuple(v[9 : 9 + num_actions])
        if all(math.isnan(x) for x in q):
            q = ()  # the action was random and no forward pass ran: no Q-values to show
        return cls(int(v[0]), int(v[1]), v[2], v[3], int(v[4]), v[5], v[6], v[7], v[8], q)


def slot_size(height: int, width: int) -> int:
    return SEQ.size + META.size + CRC.size + height * width + SEQ.size


def stream_dir() -> Path:
    """The directory of this user's frame streams: ``/dev/shm/edgerl-<uid>`` (``/tmp`` where
    there is no ``/dev/shm``)."""
    base = SHM_DIR if SHM_DIR.is_dir() else Path("/tmp")
    return base / f"edgerl-{os.getuid()}"


def shm_path(run_dir: Path) -> Path:
    """The stream file for a run directory (one name per directory, so a restart reuses it)."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return stream_dir() / f"edgerl-{digest}.frames"


# What a stream's path looks like: <SHM_DIR or /tmp>/edgerl-<uid>/edgerl-<16 hex>.frames (or,
# from an edgerl before the per-user directory, <SHM_DIR or /tmp>/edgerl-<16 hex>.frames).
STREAM_NAME = re.compile(r"edgerl-[0-9a-f]{16}\.frames")
USER_DIR_NAME = re.compile(r"edgerl-[0-9]{1,10}")


def is_stream_path(path: Path) -> bool:
    """Whether ``path`` is where edgerl puts a frame stream (readers open nothing else: a
    damaged or hostile display.json must not make them open, or report on, any other file)."""
    bases = {str(SHM_DIR), "/tmp"}
    if not path.is_absolute() or not STREAM_NAME.fullmatch(path.name):
        return False
    parent = path.parent
    if str(parent) in bases:
        return True
    return USER_DIR_NAME.fullmatch(parent.name) is not None and str(parent.parent) in bases


def _own_directory(path: Path, group: str) -> None:
    """Make ``path`` this user's directory for streams (0750, given to ``group`` where we may),
    or check the one there is; raises PermissionError (with why) when what is there is not a
    directory of this user's that only it may write in."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o750)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # ELOOP for a link
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, "it belongs to another user", str(path))
        if st.st_mode & 0o022:
            raise PermissionError(errno.EPERM, "others may write in it", str(path))
        os.fchmod(fd, 0o750)  # whatever the umask: the display group may enter, not write
        _share_with_group(fd, group)
    finally:
        os.close(fd)


class FrameRing:
    """The writer side, owned by the trainer. Use as a context manager; ``publish`` per frame.

    Frames are written with ``pwrite``, not through a mapping: writing a mapping past the end of
    a file that someone truncated (or into a full ``/dev/shm``) kills the process with SIGBUS,
    while ``pwrite`` only ever raises OSError. Before each frame the ring checks that its file is
    still the one at its path with its full size, and recreates it (new session) when not.
    """

    def __init__(
        self,
        run_dir: Path,
        height: int,
        width: int,
        action_meanings: list[str],
        slots: int = 4,
        group: str = "edgerl",
    ) -> None:
        self.run_dir = run_dir
        self.height, self.width, self.slots = height, width, slots
        self.action_meanings = list(action_meanings)
        self.num_actions = len(action_meanings)
        self.path = shm_path(run_dir)
        self.group_name = group
        self._slot = slot_size(height, width)
        self.size = HEADER.size + slots * self._slot
        self.recreated = 0  # times the file was found damaged or replaced and made again
        self._fd = -1
        self._ino = 0
        self._checked = -math.inf  # when damage() last ran
        self._create()

    def _create(self) -> None:
        """(Re)make the file, its header and the pointer file, under a new session id."""
        self.session = secrets.randbits(63)
        self.writes = 0
        _own_directory(self.path.parent, self.group_name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        try:
            os.fchmod(fd, 0o640)
            self.group = _share_with_group(fd, self.group_name)
            os.ftruncate(fd, self.size)
            header = HEADER.pack(
                MAGIC, VERSION, self.slots, self.height, self.width, self.num_actions, 0,
                self.session, 0,
            )  # fmt: skip
            os.pwrite(fd, header, 0)
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._ino = os.fstat(fd).st_ino
        pointer = {
            "path": str(self.path),
            "session": self.session,
            "pid": os.getpid(),
            "height": self.height,
            "width": self.width,
            "slots": self.slots,
            "action_meanings": self.action_meanings,
            "created": time.time(),
        }
        write_atomic(self.run_dir / POINTER_FILE, json.dumps(pointer).encode())

    def damage(self) -> str | None:
        """What is wrong with the file at our path (removed, replaced, resized), or None."""
        st = os.fstat(self._fd)
        if st.st_nlink == 0:
            return "removed"
        try:
            at_path = os.stat(self.path)
        except FileNotFoundError:
            return "removed"
        if at_path.st_ino != self._ino or at_path.st_dev != st.st_dev:
            return "replaced"
        if st.st_size != self.size:
            return f"resized to {st.st_size:,} bytes"
        return None

    def publish(self, frame: np.ndarray, meta: FrameMeta) -> None:
        """Copy one frame and its metadata into the next slot (never blocks); raises OSError when
        the file cannot be written (for example ``/dev/shm`` is full)."""
        now = time.monotonic()
        # Checking costs two stat calls, more than the rest of a publish: a few times a second
        # is soon enough to notice a stream someone removed (writes never fault meanwhile).
        if now - self._checked >= DAMAGE_CHECK_EVERY_S:
            self._checked = now
            damage = self.damage()
            if damage is not None:
                log.warning(
                    "display stream %s was %s by someone else; made a new one", self.path, damage
                )
                self.recreated += 1
                self._create()
        index = self.writes % self.slots
        base = HEADER.size + index * self._slot
        seq = SEQ.pack(self.writes + 1)
        meta_bytes = meta.pack(self.num_actions)
        pixels = np.ascontiguousarray(frame, dtype=np.uint8).reshape(-1)
        crc = CRC.pack(zlib.crc32(pixels, zlib.crc32(meta_bytes)))
        fd = self._fd
        os.pwrite(fd, seq, base)  # seq_begin first: a reader now sees begin != end
        os.pwrite(fd, meta_bytes + crc + pixels.tobytes(), base + SEQ.size)
        os.pwrite(fd, seq, base + self._slot - SEQ.size)  # seq_end last
        self.writes += 1
        os.pwrite(fd, SEQ.pack(self.writes), WRITES_OFFSET)

    def close(self) -> None:
        """Remove the stream and its pointer file (only if they are still ours)."""
        if self._fd >= 0:
            damage = None
            with contextlib.suppress(OSError):
                damage = self.damage()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        # A file that replaced ours at our path belongs to someone else: leave it.
        paths = [self.run_dir / POINTER_FILE] + ([] if damage == "replaced" else [self.path])
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def __enter__(self) -> FrameRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _share_with_group(fd: int, group: str) -> str | None:
    """Give the stream to ``group`` when we may (root, or a member); None if it does not exist."""
    if not group:
        return None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return None
    try:
        os.fchown(fd, -1, gid)
    except PermissionError:
        log.debug("cannot give the display stream to group %s", group)
        return None
    return group


class DisplayPublisher:
    """The trainer's side: publishes every ``display.every``-th step of ``display.env_index``.

    The ring exists only while ``display.enabled`` (it can change live); environments without frames
    (vector observations) publish nothing.
    """

    def __init__(self, cfg: DisplayConfig, run_dir: Path, spec: EnvSpec) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.ring: FrameRing | None = None
        self.cfg = cfg
        self._count = 0
        self._failing = False
        self._no_frames_said = False
        self.configure(cfg)

    @property
    def active(self) -> bool:
        return self.ring is not None

    def configure(self, cfg: DisplayConfig) -> None:
        """Apply ``[display]`` settings: open or close the ring, change the rate."""
        self.cfg = cfg
        size = self.spec.frame_size
        if cfg.enabled and self.ring is None and size is not None:
            try:
                self.ring = FrameRing(
                    self.run_dir, *size, list(self.spec.action_meanings), group=cfg.group
                )
            except OSError as e:  # someone else's directory there, a full /dev/shm: no viewer
                where = e.filename or stream_dir()
                log.warning(
                    "display: cannot make the frame stream in %s (%s); training goes on without "
                    "it (edgerl view will find nothing to show)",
                    where,
                    e.strerror or e,
                )
                return
            log.info(
                "display: every %d steps of env %d -> %s (edgerl view)",
                cfg.every,
                cfg.env_index,
                self.ring.path,
            )
        elif not cfg.enabled and self.ring is not None:
            self.ring.close()
            self.ring = None
            log.info("display: off")
        if cfg.enabled and size is None and not self._no_frames_said:
            # Tell a viewer why there will be nothing to show, instead of leaving it waiting.
            pointer = {"frames": False, "pid": os.getpid(), "env": self.spec.id}
            with contextlib.suppress(OSError):
                write_atomic(self.run_dir / POINTER_FILE, json.dumps(pointer).encode())
                self._no_frames_said = True

    def due(self) -> bool:
        """Count one vector step; True when this one is to be shown."""
        self._count += 1
        return self.ring is not None and self._count % self.cfg.every == 0

    def publish(self, frame: np.ndarray, meta: FrameMeta) -> None:
        """Publish a frame; a stream that cannot be written is reported once, never fatal."""
        if self.ring is None:
            return
        try:
            self.ring.publish(frame, meta)
        except OSError as e:
            if not self._failing:
                log.warning("display: cannot write %s (%s); training goes on", self.ring.path, e)
            self._failing = True
        else:
            if self._failing:
                log.info("display: %s is written again", self.ring.path)
            self._failing = False

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._no_frames_said:
            with contextlib.suppress(OSError):
                (self.run_dir / POINTER_FILE).unlink()
            self._no_frames_said = False
