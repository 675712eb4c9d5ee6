"""Signals turned into requests that the training loop handles (so tests can send them)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator


class StoppedDuringSetup(Exception):
    """A stop (SIGTERM, Ctrl-C) arrived before the first step: set-up was abandoned at once.

    Nothing is lost: no step of this session was taken, so the newest checkpoint is still current.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped by {reason} during start-up")
        self.reason = reason


class StopRequest:
    """A stop that may arrive before the trainer exists (a signal during set-up)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._target: Callable[[str], None] | None = None

    @property
    def target(self) -> Callable[[str], None] | None:
        return self._target

    @target.setter
    def target(self, fn: Callable[[str], None]) -> None:
        self._target = fn
        if self.reason is not None:
            fn(self.reason)

    def set(self, reason: str) -> None:
        self.reason = reason
        if self._target is not None:
            self._target(reason)


@contextlib.contextmanager
def stop_on_signals(
    request_stop: Callable[[str], None],
    on_hangup: Callable[[], None] | None = None,
) -> Iterator[dict[str, str]]:
    """Turn SIGINT/SIGTERM into a stop request (a second SIGINT aborts at once) and, if given,
    SIGHUP into ``on_hangup``; the old handlers come back on exit."""
    received: dict[str, str] = {}

    def stop(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        received["signal"] = name
        request_stop(name)

    def hangup(signum: int, frame: object) -> None:
        assert on_hangup is not None
        on_hangup()

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    if on_hangup is not None:
        old[signal.SIGHUP] = signal.signal(signal.SIGHUP, hangup)
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)
