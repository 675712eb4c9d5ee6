"""systemd's service notification protocol (sd_notify): datagrams to ``$NOTIFY_SOCKET``.

The only maintained implementations are C (libsystemd) or unmaintained Python (``sdnotify``, last
released 2017, no abstract-socket test); the protocol is a newline-separated ``KEY=VALUE`` datagram
to a Unix socket whose name starting with ``@`` means the abstract namespace. Sending never raises
and never blocks: a service must keep running when nobody listens, and when its manager is slow
to read (a Unix datagram send blocks once 10 messages wait unread: ``net.unix.max_dgram_qlen``),
so a message that cannot go at once is dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    """Sends notifications to systemd, or does nothing when not started by systemd."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        self.address = address
        self._sock: socket.socket | None = None
        self._failed = False
        self._full = False
        if address:
            self._target = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            )

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: str | int) -> bool:
        """Send ``KEY=VALUE`` lines (keyword names are the keys); True if delivered. A value's
        own line breaks become spaces: one value never adds a key (an error's text can carry a
        config file's ``\nWATCHDOG=1``)."""
        if self._sock is None:
            return False
        message = "\n".join(f"{key}={one_line(value)}" for key, value in fields.items())
        try:
            self._sock.sendto(message.encode(), self._target)
        except BlockingIOError:
            if not self._full:  # say it once per backlog, not every watchdog tick
                log.warning(
                    "systemd is not reading its notification socket %s; dropping messages "
                    "until it does",
                    self.address,
                )
                self._full = True
            return False
        except OSError as e:
            if not self._failed:  # say it once, not every watchdog tick
                log.warning("cannot notify systemd at %s: %s", self.address, e)
                self._failed = True
            return False
        self._full = False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send(READY=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def extend(self, status: str, seconds: float) -> bool:
        """STATUS= with EXTEND_TIMEOUT_USEC=: the next message may take ``seconds``. It can
        only lengthen the start: systemd applies it once the start has run past its own
        ``TimeoutStartSec=``."""
        return self.send(STATUS=status, EXTEND_TIMEOUT_USEC=int(seconds * 1_000_000))

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def stopping(self, status: str = "") -> bool:
        return self.send(STOPPING=1, **({"STATUS": status} if status else {}))

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(RELOADING=1, MONOTONIC_USEC=usec)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def one_line(value: str | int) -> str:
    """``value`` as one line of a notification: its line breaks as spaces."""
    return str(value).replace("\r", " ").replace("\n", " ")


def watchdog_interval_s() -> float | None:
    """Half of ``$WATCHDOG_USEC`` (when set for this process), the interval to ping at."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
