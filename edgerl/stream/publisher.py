"""The trainer's side of the frame stream: what is published, and when."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import numpy as np

from edgerl.config import DisplayConfig
from edgerl.envs import EnvSpec
from edgerl.files.atomic import write_atomic
from edgerl.stream.layout import (
    POINTER_FILE,
    FrameMeta,
    stream_dir,
)
from edgerl.stream.ring import FrameRing

log = logging.getLogger(__name__)


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
