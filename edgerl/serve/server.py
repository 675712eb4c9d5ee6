"""Running the server of ``edgerl serve``: listen, say where, serve until SIGTERM or Ctrl-C.

The process lowers its own CPU priority first (nice 10 unless it is lower already): on a board
whose cores the trainer keeps busy, a page being watched takes what the trainer leaves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web

from edgerl.errors import ServeError
from edgerl.serve import ServeOptions
from edgerl.serve.app import make_app

log = logging.getLogger(__name__)

# A connection that has not sent a whole request within this long, or sits idle this long after
# one, is closed (aiohttp keeps one for an hour by default: a thousand silent or half-sent
# connections stopped the page and /metrics for everyone before any token was asked for).
IDLE_S = 15.0
BAD_REQUEST_NOTE_S = 60.0  # malformed requests are said at most once a minute, with a count
# Open connections at once: from one address (an IPv6 /64), and in all (the unit's LimitNOFILE
# is 8,192). A browser opens about six to a host, and the page's game streams are capped at 32;
# beyond these a new connection is closed at once, so no one address can hold every socket.
PER_ADDRESS_CONNECTIONS = 64
ALL_CONNECTIONS = 1024


class ConnectionCap:
    """A protocol factory around aiohttp's (``runner.server``) that closes a connection at once
    when its address has :data:`PER_ADDRESS_CONNECTIONS` open or the server
    :data:`ALL_CONNECTIONS`; the ones it keeps go to aiohttp's handler unchanged."""

    def __init__(self, factory: Callable[[], asyncio.Protocol]) -> None:
        self.factory = factory
        self.open: collections.Counter[str] = collections.Counter()
        self.refused = 0
        self.noted_at = -BAD_REQUEST_NOTE_S

    def __call__(self) -> asyncio.Protocol:
        return _Capped(self)

    def admit(self, address: str) -> bool:
        if self.open[address] >= PER_ADDRESS_CONNECTIONS or self.open.total() >= ALL_CONNECTIONS:
            self.refused += 1
            now = time.monotonic()
            if now - self.noted_at >= BAD_REQUEST_NOTE_S:  # once a minute at most, counted
                log.warning(
                    "edgerl serve: %d connections refused in the last minute: one address "
                    "may open %d at once, all together %d",
                    self.refused,
                    PER_ADDRESS_CONNECTIONS,
                    ALL_CONNECTIONS,
                )
                self.noted_at, self.refused = now, 0
            return False
        self.open[address] += 1
        return True

    def leave(self, address: str) -> None:
        self.open[address] -= 1
        if self.open[address] <= 0:
            del self.open[address]


def peer_key(peer: object) -> str:
    """What one connection counts against: its IPv4 address, or its IPv6 address's /64 (one
    host is given a /64 and may use any address in it)."""
    if not isinstance(peer, tuple) or not peer:
        return "?"
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:  # IPv4 on a dual-stack socket
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class _Capped(asyncio.Protocol):
    """One connection: admitted (and handed to aiohttp's handler) or closed at once."""

    def __init__(self, cap: ConnectionCap) -> None:
        self.cap = cap
        self.inner: asyncio.Protocol | None = None
        self.address = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.address = peer_key(transport.get_extra_info("peername"))
        if not self.cap.admit(self.address):
            transport.abort()
            return
        self.inner = self.cap.factory()
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is not None:
            self.cap.leave(self.address)
            self.inner.connection_lost(exc)
            self.inner = None

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()


class BadRequestLines(logging.Filter):
    """aiohttp logs every malformed request (a TLS hello on the HTTP port, a header that is no
    header, a line over 8 KiB) at ERROR with a traceback, after refusing it: anyone could
    fill the journal. Such a record becomes one INFO line without the traceback, at most once a
    minute with the count since the last; other records pass as they are."""

    def __init__(self) -> None:
        super().__init__()
        self.unsaid = 0
        self.said_at = -BAD_REQUEST_NOTE_S

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError):
            return True
        self.unsaid += 1
        now = time.monotonic()
        if now - self.said_at < BAD_REQUEST_NOTE_S:
            return False
        first = (error.message or type(error).__name__).strip().splitlines()[0][:200]
        said = f"{record.getMessage()} ({self.unsaid} malformed in the last minute, refused)"
        record.msg, record.args = "%s: %s", (said, first)
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
        self.said_at, self.unsaid = now, 0
        return True


def http_logger() -> logging.Logger:
    """The logger aiohttp's request handler writes to, malformed requests quieted."""
    logger = logging.getLogger("edgerl.serve.http")
    if not any(isinstance(f, BadRequestLines) for f in logger.filters):
        logger.addFilter(BadRequestLines())
    return logger


def listen_error(host: str, port: int, error: OSError) -> str:
    """The sentence for a socket that cannot listen at ``host:port``."""
    where = f"cannot listen on {host}:{port}"
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {host}: no address of this machine has that name"
    if error.errno == errno.EADDRINUSE:
        return f"{where}: something else listens there already; stop it or give another --port"
    if error.errno == errno.EACCES:
        return f"{where}: ports below 1024 need root; give a port above 1023 with --port"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: it is no address of this machine"
    return f"{where}: {error.strerror or error}"


def lower_priority(nice: int) -> None:
    """Make this process at least ``nice`` (never raises: a sandbox may forbid it)."""
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) < nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def serve(opts: ServeOptions, ready: Callable[[str], None]) -> int:
    """Serve until SIGTERM or SIGINT; ``ready`` is called with the page's address once the
    socket listens. Returns 0; raises ServeError when it cannot listen."""
    lower_priority(opts.nice)
    return asyncio.run(_serve(opts, ready))


async def _serve(opts: ServeOptions, ready: Callable[[str], None]) -> int:
    # Open frame streams are closed by the app itself; two seconds is plenty for the rest.
    runner = web.AppRunner(
        make_app(opts),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=2.0,
        keepalive_timeout=IDLE_S,
        logger=http_logger(),
    )
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    try:
        listening = await loop.create_server(
            ConnectionCap(runner.server), opts.host, opts.port, reuse_address=True
        )
    except OSError as e:
        await runner.cleanup()
        raise ServeError(listen_error(opts.host, opts.port, e)) from None
    sockets = listening.sockets
    port = sockets[0].getsockname()[1] if sockets else opts.port
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    ready(f"http://{shown}:{port}/")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("edgerl serve: stopping")
        listening.close()  # no new connections; the open ones are closed by the runner
        await runner.cleanup()
    return 0
