"""One replay save: what a snapshot holds, and the job that writes it, here or in the background.

:meth:`edgerl.memories.replay.store.ReplayStore.snapshot` takes the part of the replay the actor
changes in
place (the :class:`Part` of each changed ring range) between two actor steps; the :class:`SaveJob`
then copies the frames and writes the files (the store's delta and manifest) on a thread of lower
priority, and :class:`SaveResult` says what that cost. The file format is the store's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SAVE_NICE = 10  # the background save's niceness (Linux threads have their own)


class SaveAbandoned(Exception):
    """A replay save could not finish (disk full, actor came round); the message says why."""


@dataclass
class Part:
    """One contiguous ring range of one environment, as it was at the snapshot."""

    env: int
    start: int
    n: int
    w_first: int  # the write number of the range's first slot
    actions: np.ndarray
    rewards: np.ndarray
    flags: np.ndarray
    early: np.ndarray | None = None  # the first slots' frames, copied in the snapshot


@dataclass
class SaveResult:
    """What one replay save cost (``edgerl bench`` and the log report it)."""

    manifest: str
    pause_s: float  # the snapshot, while the actor waited
    save_s: float = 0.0  # the background copy, compression and writes
    cpu_s: float = 0.0  # CPU time of the background thread
    raw_bytes: int = 0
    bytes: int = 0  # written to disk by this save
    slots: int = 0


@dataclass
class SaveJob:
    """A replay save from :meth:`~edgerl.memories.replay.store.ReplayStore.snapshot`:
    :meth:`start` it in the background or :meth:`run` it here; the checkpoint that names it is
    written only after it ended (if it failed, that checkpoint's resume reports the missing
    replay file and starts empty)."""

    write: Callable[[SaveJob], None]  # the store's: the delta and the manifest
    step: int
    parts: list[Part]
    head: np.ndarray
    count: np.ndarray
    written: np.ndarray
    event: Any
    result: SaveResult
    delta_name: str | None
    error: str | None = None
    # The write ran to its end, done or failed: False after an exception that is not the
    # write's (a second Ctrl-C during a save in the foreground), the manifest maybe not written.
    ended: bool = False
    chain: list[dict[str, Any]] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_niced, name="edgerl-replay-save")
        self._thread.start()

    def _run_niced(self) -> None:
        # The actor, the learner and the emulator threads come first: on a Jetson the CPU is
        # what limits training, and a checkpoint's save has minutes to finish.
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SAVE_NICE)
        self._run_quietly()

    @property
    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def run(self) -> None:
        """Write the delta and the manifest; sets :attr:`error` (a sentence) on failure."""
        self._run_quietly()

    def _run_quietly(self) -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            self.write(self)
        except SaveAbandoned as e:
            self.error = str(e)
        except Exception as e:  # the actor must never die of a replay save
            log.exception("replay save failed")
            self.error = f"replay save failed ({type(e).__name__}: {e})"
        self.result.save_s = time.perf_counter() - started
        self.result.cpu_s = time.thread_time() - cpu
        self.ended = True
