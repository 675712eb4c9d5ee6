"""Following a trainer's frame stream: the reader of the moment, replaced when the trainer
restarts, and the sentence saying why there is none. ``edgerl view`` and ``edgerl serve`` both
watch through it (it imports nothing of pygame or PyTorch)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from edgerl.errors import EdgerlError
from edgerl.files.processes import pid_alive
from edgerl.report.rundir import trainer_of
from edgerl.report.status import liveness, read_status
from edgerl.stream import POINTER_FILE
from edgerl.stream.reader import (
    Frame,
    FrameReader,
    StreamError,
    dead_trainer,
    no_frames,
    read_pointer,
)

log = logging.getLogger(__name__)

CHECK_TRAINER_EVERY_S = 1.0


class NoFramesToShow(EdgerlError):
    """The run learns from vector observations: there will never be a frame."""


class Attachment:
    """The current reader, replaced when the trainer restarts; None while nothing publishes.

    ``problem`` says in one sentence why there is no reader (a dead trainer, a damaged stream),
    or is None when simply nothing runs yet. A stream the user may not read raises
    StreamPermissionError; a run without frames raises NoFramesToShow.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.reader: FrameReader | None = None
        self._problem: str | None = None
        self._problem_since = 0.0
        self._checked = 0.0

    @property
    def problem(self) -> str | None:
        return self._problem

    @problem.setter
    def problem(self, problem: str | None) -> None:
        if problem != self._problem:
            self._problem_since = time.monotonic()
        self._problem = problem

    def lasting_problem(self, seconds: float) -> str | None:
        """The problem, once it has been the same for ``seconds`` (a stream being made can look
        damaged for a moment; one that stays so is)."""
        if self._problem is not None and time.monotonic() - self._problem_since >= seconds:
            return self._problem
        return None

    def idle(self) -> str | None:
        """Why no frame will come (a lasting problem, or no trainer using the run directory),
        or None while a trainer runs there (it may be starting, or have the display off)."""
        holder = trainer_of(self.run_dir)
        if self.problem is not None:
            if holder is not None and self._pointer_pid() not in (None, holder):
                return None  # a new trainer is setting up; the pointer is its predecessor's
            return self.problem
        if holder is not None:
            return None
        try:
            doc = read_status(self.run_dir)
        except EdgerlError:
            return f"no trainer is running in {self.run_dir}"
        return f"no trainer is running in {self.run_dir}: the run {liveness(doc).reason}"

    def ended(self) -> bool:
        """Whether the run there has ended: no trainer uses the directory and its status.json
        says the run is not running (a one-shot view need not wait for a trainer)."""
        if trainer_of(self.run_dir) is not None:
            return False
        try:
            doc = read_status(self.run_dir)
        except EdgerlError:  # no status yet: a trainer may be starting
            return False
        return not liveness(doc).running

    def _pointer_pid(self) -> int | None:
        try:
            return int(read_pointer(self.run_dir)["pid"])
        except (OSError, EdgerlError, StreamError):
            return None

    def poll(self) -> FrameReader | None:
        now = time.monotonic()
        if now - self._checked < CHECK_TRAINER_EVERY_S and self.reader is not None:
            return self.reader
        self._checked = now
        if self.reader is not None:
            gone = self.reader.trainer_gone()
            if gone is not None:
                log.info("%s; waiting for a trainer to come back", gone)
                self._drop(gone)
        if self.reader is None:
            self.reader = self._attach()
        return self.reader

    def latest(self) -> Frame | None:
        """The newest new frame of the current reader, if any (polls first)."""
        reader = self.poll()
        if reader is None:
            return None
        try:
            return reader.latest()
        except StreamError as e:
            self._drop(str(e))
            return None

    def _drop(self, problem: str) -> None:
        if self.reader is not None:
            self.reader.close()
        self.reader, self.problem = None, problem

    def _attach(self) -> FrameReader | None:
        try:
            pointer = read_pointer(self.run_dir)
        except FileNotFoundError:
            self.problem = None
            return None
        except StreamError as e:
            self.problem = str(e)
            return None
        if not pid_alive(int(pointer["pid"])):
            self.problem = dead_trainer(self.run_dir, int(pointer["pid"]))
            return None
        if pointer.get("frames", True) is False:
            raise NoFramesToShow(no_frames(self.run_dir, str(pointer.get("env", "this game"))))
        try:
            reader = FrameReader(self.run_dir)
        except FileNotFoundError as e:  # the stream is being made or removed right now
            self.problem = f"{e.filename} named in {self.run_dir / POINTER_FILE} does not exist"
            return None
        except StreamError as e:
            self.problem = str(e)
            return None
        if reader.trainer_gone() is not None:
            reader.close()
            return None
        self.problem = None
        log.info("attached to %s", self.run_dir)
        return reader

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
