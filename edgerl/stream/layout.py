"""The frame stream's layout (header, slots, what one frame's meta holds) and where a run's
stream lives; :mod:`edgerl.stream` describes the whole."""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
