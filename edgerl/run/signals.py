"""Signals turned into requests that the training loop handles (so tests can send them)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
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


# The helper :func:`said_while_held` starts: a POSIX shell that reads the wakeup pipe a byte at
# a time (od -b: octal, in every od). Byte 0 (no signal's number) is edgerl's own: the call is
# about to begin. A stop signal
# after it is said once, in the log's form; one before it is not (Python's handler is running
# then and says it), nor are other signals' (SIGHUP's). A shell, not a Python, because it must
# be reading before the stop comes: a fresh interpreter took 14 s to start on a busy 2-core
# machine. It ignores the signals itself (a Ctrl-C at the terminal reaches it too) and leaves at
# the pipe's end, which comes when edgerl closes it or dies.
_SAYER = """
trap '' INT TERM HUP
said=$1 stamped=$2 prefix=$3 armed=0
while :; do
  set -- $(dd bs=1 count=1 2>/dev/null | od -b)
  case $2 in
    '') exit 0 ;;
    000) armed=1; continue ;;
    002) name=SIGINT ;;
    017) name=SIGTERM ;;
    *) continue ;;
  esac
  [ "$armed" = 1 ] || continue
  stamp=''
  if [ "$stamped" = 1 ]; then stamp="$(date +%H:%M:%S) "; fi
  printf '%s%s%s %s\\n' "$stamp" "$prefix" "$name" "$said" >&2
  armed=0
done
"""


def _log_form() -> tuple[bool, str]:
    """How the log's lines begin, for the helper to write its own as they do: whether with the
    time (not under systemd, whose journal adds it), and what follows it before the message
    (``INFO `` on a terminal, journald's priority ``<6>`` under systemd)."""
    handlers = logging.getLogger().handlers
    if not handlers:  # no log set up (a library's use): the level and the message
        return False, "INFO "
    formatter = handlers[0].formatter or logging.Formatter()
    stamped = "asctime" in (getattr(formatter, "_fmt", "") or "")
    record = logging.LogRecord("edgerl", logging.INFO, __file__, 0, "\x01", None, None)
    try:
        prefix = formatter.format(record).split("\x01", 1)[0]
        written = formatter.formatTime(record, formatter.datefmt) if stamped else ""
    except Exception:  # a formatter of someone else's that wants more of a record
        return stamped, "INFO "
    if stamped and prefix.startswith(written + " "):  # now's time: the helper writes the signal's
        return True, prefix[len(written) + 1 :]
    return False, prefix  # a time elsewhere in the line (someone else's format): as it is


class HeldCall:
    """What :func:`said_while_held` gives its body: :meth:`arm`, called just before the call
    that holds Python's lock begins."""

    def __init__(self, pipe: int | None) -> None:
        self._pipe = pipe

    def arm(self) -> None:
        """From now a stop is said at once (before, Python's own handler says it)."""
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.write(self._pipe, b"\0")


def _start_sayer(doing: str) -> tuple[int, int, subprocess.Popen[bytes]] | None:
    """(the wakeup pipe's write end, the wakeup fd it replaced, the helper reading it), or None
    with nothing changed where it cannot be: not the main thread (ValueError), another reader
    of signals already set (an event loop: left to it), no pipe or process to spare."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    replaced: int | None = None
    try:
        os.set_blocking(write, False)
        replaced = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if replaced != -1:
            raise ValueError("another wakeup fd is set")
        said = f"heard while {doing}: that call holds Python, so edgerl stops as soon as it returns"
        stamped, prefix = _log_form()
        sayer = subprocess.Popen(
            ["/bin/sh", "-c", _SAYER, "edgerl-stop-sayer", said, str(int(stamped)), prefix],
            stdin=read,
            stdout=subprocess.DEVNULL,
        )
        return write, replaced, sayer
    except BaseException as e:  # a second Ctrl-C (KeyboardInterrupt) included: all put back
        if replaced is not None:
            signal.set_wakeup_fd(replaced)
        os.close(write)
        if isinstance(e, (OSError, ValueError)):
            return None
        raise
    finally:
        os.close(read)


@contextlib.contextmanager
def said_while_held(doing: str) -> Iterator[HeldCall]:
    """Say a stop (SIGINT, SIGTERM) at once while ``doing`` runs in one call that holds Python's
    lock (ALE builds an Atari game's environments so: seconds to a minute), when no handler can
    run until it returns. Python's own signal handler writes each signal's number to a wakeup
    pipe even then; a small process of its own reads it and says, in the log's form, that the
    stop was heard and is acted on when the call returns. The body calls ``arm()`` just before
    the call. The handlers themselves are unchanged: the stop takes effect as they run. Main
    thread only; elsewhere, or when the helper cannot start, nothing is said early and nothing
    is changed."""
    started = _start_sayer(doing)
    if started is None:
        yield HeldCall(None)
        return
    write, replaced, sayer = started
    try:
        yield HeldCall(write)
    finally:
        signal.set_wakeup_fd(replaced)
        os.close(write)  # the helper reads its end of file and leaves
        try:
            sayer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sayer.kill()
            sayer.wait()
