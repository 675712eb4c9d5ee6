"""How ``edgerl bench`` goes through its stages: each one said in the log with what it measures,
then with what it took in all, its set-up included; and a Ctrl-C that ends the measuring even
where the process started with SIGINT ignored."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

from edgerl.words import duration

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stage(what: str, measured_s: float | None = None) -> Iterator[None]:
    """Say in the log what the bench measures next (and for how long, ``measured_s``: its timed
    part, which starts once its environments are built and warm), and once it ends, how long it
    took in all, its set-up included: what the user waited (a loop announced as 20 s took 59 s
    on a loaded 2-core machine, said nowhere)."""
    timed = f": {duration(measured_s)} measured, after an untimed set-up" if measured_s else ""
    log.info("bench: %s%s", what, timed)
    start = time.monotonic()
    yield
    log.info("bench: %s took %s in all", what, duration(time.monotonic() - start))


@contextlib.contextmanager
def sigint_interrupts() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here even where the process started with it ignored: a
    shell script's background job, or ``timeout -s INT`` run from one, hands its programs SIGINT
    ignored, and Python then installs no handler of its own (``edgerl train`` installs its own
    for the same reason). The old handler comes back after; off the main thread, nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
