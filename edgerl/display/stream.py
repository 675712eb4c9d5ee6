"""The frame stream: the trainer publishes every Nth frame into a small shared-memory ring.

What is shown: the agent's own view, the newest 84x84 grey frame of one environment's stack. ALE's
C++ vector env does not hand out its 210x160 colour screen, and rendering it separately would cost
an emulator step, so the viewer shows exactly what the network sees (scaled up).

Layout of the ring, a file in ``/dev/shm`` named in ``<run_dir>/display.json``::

    header   magic "EDGERLFR", version, slots, frame height/width, actions, session id,
             writes (count of frames written; the newest is in slot (writes - 1) % slots)
    slot[i]  seq_begin, meta (step, episode, return, epsilon, action, sps, cpu, gr3d, time,
             Q-values), crc32 of meta and frame, frame bytes, seq_end

Writing is a copy into the next slot, bracketed by the slot's sequence numbers: it never blocks,
never waits for a reader and works when no viewer exists. A reader copies a slot and accepts it
only if ``seq_begin == seq_end`` and the CRC matches; the CRC is what makes this safe on weakly
ordered CPUs (ARM), where another core may see the sequence numbers before the frame bytes. The
file is created ``0640`` with group ``display.group`` (so users in that group can watch a service
running as root) and removed when the trainer exits.
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import logging
import math
import mmap
import os
import secrets
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.atomic import write_atomic
from edgerl.config import DisplayConfig
from edgerl.envs import EnvSpec
from edgerl.processes import pid_alive

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


def shm_path(run_dir: Path) -> Path:
    """The stream file for a run directory (one name per directory, so a restart reuses it)."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    base = SHM_DIR if SHM_DIR.is_dir() else Path("/tmp")
    return base / f"edgerl-{digest}.frames"


class FrameRing:
    """The writer side, owned by the trainer. Use as a context manager; ``publish`` per frame."""

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
        self.num_actions = len(action_meanings)
        self.path = shm_path(run_dir)
        self.session = secrets.randbits(63)
        self.writes = 0
        self._slot = slot_size(height, width)
        size = HEADER.size + slots * self._slot
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.fchmod(fd, 0o640)
            self.group = _share_with_group(fd, group)
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        HEADER.pack_into(
            self._mm, 0, MAGIC, VERSION, slots, height, width, self.num_actions, 0, self.session, 0
        )
        pointer = {
            "path": str(self.path),
            "session": self.session,
            "pid": os.getpid(),
            "height": height,
            "width": width,
            "slots": slots,
            "action_meanings": list(action_meanings),
            "created": time.time(),
        }
        write_atomic(run_dir / POINTER_FILE, json.dumps(pointer).encode())

    def publish(self, frame: np.ndarray, meta: FrameMeta) -> None:
        """Copy one frame and its metadata into the next slot (never blocks)."""
        index = self.writes % self.slots
        base = HEADER.size + index * self._slot
        seq = self.writes + 1
        meta_bytes = meta.pack(self.num_actions)
        pixels = np.ascontiguousarray(frame, dtype=np.uint8).reshape(-1)
        mm = self._mm
        SEQ.pack_into(mm, base, seq)  # seq_begin first: a reader now sees begin != end
        off = base + SEQ.size
        mm[off : off + META.size] = meta_bytes
        off += META.size
        crc = zlib.crc32(pixels, zlib.crc32(meta_bytes))
        CRC.pack_into(mm, off, crc)
        off += CRC.size
        mm[off : off + pixels.size] = pixels.tobytes()
        SEQ.pack_into(mm, base + self._slot - SEQ.size, seq)  # seq_end last
        self.writes += 1
        struct.pack_into("<Q", mm, WRITES_OFFSET, self.writes)

    def close(self) -> None:
        """Remove the stream and its pointer file."""
        with contextlib.suppress(Exception):
            self._mm.close()
        for path in (self.path, self.run_dir / POINTER_FILE):
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


@dataclass
class Frame:
    pixels: np.ndarray  # (H, W) uint8
    meta: FrameMeta
    seq: int


class FrameReader:
    """The reader side: attach through ``<run_dir>/display.json``; ``latest()`` for new frames."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        pointer = json.loads((run_dir / POINTER_FILE).read_text())
        self.pointer: dict[str, Any] = pointer
        self.session = int(pointer["session"])
        self.action_meanings: list[str] = list(pointer["action_meanings"])
        with open(pointer["path"], "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        magic, version, slots, h, w, actions, _, session, _ = HEADER.unpack_from(self._mm, 0)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"{pointer['path']} is not an edgerl frame stream")
        self.slots, self.height, self.width, self.num_actions = slots, h, w, actions
        self.session = session
        self._slot = slot_size(h, w)
        self.last_seq = 0
        self.torn = 0  # frames rejected as torn (seq or CRC mismatch)

    @property
    def writes(self) -> int:
        return struct.unpack_from("<Q", self._mm, WRITES_OFFSET)[0]

    def read_slot(self, index: int) -> Frame | None:
        """A consistent copy of one slot, or None if it is being written (torn) or empty."""
        base = HEADER.size + index * self._slot
        end = SEQ.unpack_from(self._mm, base + self._slot - SEQ.size)[0]
        raw = self._mm[base : base + self._slot]  # one copy of the whole slot
        begin = SEQ.unpack_from(raw, 0)[0]
        if begin == 0 or begin != end or begin != SEQ.unpack_from(raw, self._slot - SEQ.size)[0]:
            self.torn += begin != 0
            return None
        off = SEQ.size
        meta_bytes = raw[off : off + META.size]
        off += META.size
        (crc,) = CRC.unpack_from(raw, off)
        off += CRC.size
        pixels = np.frombuffer(raw, dtype=np.uint8, count=self.height * self.width, offset=off)
        if zlib.crc32(pixels, zlib.crc32(meta_bytes)) != crc:
            self.torn += 1
            return None
        meta = FrameMeta.unpack(meta_bytes, self.num_actions)
        return Frame(pixels.reshape(self.height, self.width).copy(), meta, begin)

    def latest(self) -> Frame | None:
        """The newest consistent frame not returned before, or None."""
        writes = self.writes
        for back in range(min(self.slots, writes)):
            seq = writes - back
            if seq <= self.last_seq:
                return None
            frame = self.read_slot((seq - 1) % self.slots)
            if frame is not None and frame.seq > self.last_seq:
                self.last_seq = frame.seq
                return frame
        return None

    def still_current(self) -> bool:
        """False once the trainer has gone or a new one has replaced this stream."""
        try:
            pointer = json.loads((self.run_dir / POINTER_FILE).read_text())
        except (OSError, ValueError):
            return False
        if int(pointer.get("session", -1)) != self.session:
            return False
        return pid_alive(int(pointer.get("pid", 0)))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._mm.close()


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
        self.configure(cfg)

    @property
    def active(self) -> bool:
        return self.ring is not None

    def configure(self, cfg: DisplayConfig) -> None:
        """Apply ``[display]`` settings: open or close the ring, change the rate."""
        self.cfg = cfg
        size = self.spec.frame_size
        if cfg.enabled and self.ring is None and size is not None:
            self.ring = FrameRing(
                self.run_dir, *size, list(self.spec.action_meanings), group=cfg.group
            )
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

    def due(self) -> bool:
        """Count one vector step; True when this one is to be shown."""
        self._count += 1
        return self.ring is not None and self._count % self.cfg.every == 0

    def publish(self, frame: np.ndarray, meta: FrameMeta) -> None:
        if self.ring is not None:
            self.ring.publish(frame, meta)

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
