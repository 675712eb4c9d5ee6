"""Running the server of ``edgerl serve``: listen, say where, serve until SIGTERM or Ctrl-C.

The process lowers its own CPU priority first (nice 10 unless it is lower already): on a board
whose cores the trainer keeps busy, a page being watched takes what the trainer leaves.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import random
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web

from edgerl.errors import ServeError
from edgerl.serve import ServeOptions
from edgerl.serve.app import SERVED, make_app
from edgerl.serve.peers import connection_key

log = logging.getLogger(__name__)

# A connection must show the token within this long of opening (send a request that carries it;
# with --trusted-network, one whose Host passes), else it is closed. Until then it may be anyone's:
# aiohttp alone kept a half-sent request IDLE_S, and one that only asks for the page's public
# files for ever, each holding a socket before any token was asked for.
TOKEN_S = 10.0
IDLE_S = 15.0  # a connection that has shown the token is closed after this long idle
BAD_REQUEST_NOTE_S = 60.0  # malformed requests are said at most once a minute, with a count
# Connections that have not shown the token yet, from one peer (an account of this machine, or an
# address elsewhere: see edgerl.serve.peers) and in all. A new connection is never refused for
# them: the oldest waiting one of its own peer makes room, or, when all are taken, the oldest of
# the peer holding most. So no account (and no few addresses) can keep another from connecting:
# each other one's own connection shows its token in a moment, and is then counted apart.
WAITING_PER_PEER = 32
WAITING_ALL = 256
# Connections that have shown the token: from one peer, and in all (the unit's LimitNOFILE is
# 8,192). A browser opens about six to a host, and the page's game streams are capped at 32;
# beyond these a request is answered 503 and its connection closed.
PER_ADDRESS_CONNECTIONS = 64
ALL_CONNECTIONS = 1024
WAITING, ADMITTED, GONE = "waiting", "admitted", "gone"


class ConnectionCap:
    """A protocol factory around aiohttp's (``runner.server``): each connection is handed to
    aiohttp's handler as it comes and held as waiting, against its peer
    (:func:`~edgerl.serve.peers.connection_key`), until a request of it shows the token
    (:meth:`admit_request`, called by the app); one still waiting after :data:`TOKEN_S` is
    closed, and so is the oldest waiting one of the peer when it has :data:`WAITING_PER_PEER`
    (of the peer holding most, when all :data:`WAITING_ALL` are taken) to let a new one in."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        key_of: Callable[[object, object], str] = connection_key,
    ) -> None:
        self.factory = factory
        self.key_of = key_of
        self.waiting: dict[str, dict[_Capped, None]] = {}  # per peer, oldest first
        self.waiting_count = 0
        self.admitted: collections.Counter[str] = collections.Counter()
        self.made_room = self.refused = 0
        self.noted_at = -BAD_REQUEST_NOTE_S

    def __call__(self) -> asyncio.Protocol:
        return _Capped(self)

    def arrive(self, conn: _Capped) -> None:
        """Hold a new connection as waiting, closing an older waiting one where it needs room."""
        mine = self.waiting.get(conn.key, {})
        if len(mine) >= WAITING_PER_PEER:
            self._make_room(next(iter(mine)))
        elif self.waiting_count >= WAITING_ALL:
            # The peer holding most gives way; among equals one at random, so that the oldest
            # (the owner's, waiting to show its token) is not always the one that goes.
            top = max(len(held) for held in self.waiting.values())
            most = random.choice([held for held in self.waiting.values() if len(held) == top])
            self._make_room(next(iter(most)))
        self.waiting.setdefault(conn.key, {})[conn] = None
        self.waiting_count += 1
        conn.state = WAITING

    def admit(self, conn: _Capped) -> bool:
        """Count ``conn`` as one that has shown the token; False (it is to be closed) when its
        peer or the server has all the connections it may have."""
        if conn.state != WAITING:
            return conn.state == ADMITTED
        if (
            self.admitted[conn.key] >= PER_ADDRESS_CONNECTIONS
            or self.admitted.total() >= ALL_CONNECTIONS
        ):
            self.refused += 1
            self._note()
            return False
        self._unwait(conn)
        conn.state = ADMITTED
        self.admitted[conn.key] += 1
        return True

    def admit_request(self, request: web.Request) -> bool:
        """:meth:`admit` for the connection ``request`` came on (True for one not made here)."""
        transport = request.transport
        conn = transport.get_protocol() if transport is not None else None
        return self.admit(conn) if isinstance(conn, _Capped) else True

    def leave(self, conn: _Capped) -> None:
        """``conn`` is closed: its place is free."""
        if conn.state == WAITING:
            self._unwait(conn)
        elif conn.state == ADMITTED:
            self.admitted[conn.key] -= 1
            if self.admitted[conn.key] <= 0:
                del self.admitted[conn.key]
        conn.state = GONE

    def late(self, conn: _Capped) -> None:
        """``conn`` has not shown the token within TOKEN_S: closed (unless it has meanwhile)."""
        if conn.state == WAITING:
            self.leave(conn)
            conn.close()

    def _unwait(self, conn: _Capped) -> None:
        mine = self.waiting.get(conn.key)
        if mine is not None and conn in mine:
            del mine[conn]
            self.waiting_count -= 1
            if not mine:
                del self.waiting[conn.key]

    def _make_room(self, conn: _Capped) -> None:
        self.leave(conn)
        conn.close()
        self.made_room += 1
        self._note()

    def _note(self) -> None:
        now = time.monotonic()
        if now - self.noted_at < BAD_REQUEST_NOTE_S:
            return  # once a minute at most, counted
        log.warning(
            "edgerl serve, in the last minute: %d connections that had not shown the token "
            "closed to let newer ones in (a peer may have %d such at once, all together %d); "
            "%d requests with the token refused (a peer may have %d connections, all together "
            "%d)",
            self.made_room,
            WAITING_PER_PEER,
            WAITING_ALL,
            self.refused,
            PER_ADDRESS_CONNECTIONS,
            ALL_CONNECTIONS,
        )
        self.noted_at, self.made_room, self.refused = now, 0, 0


class _Capped(asyncio.Protocol):
    """One connection: aiohttp's handler, and its place in the cap (waiting, admitted, gone)."""

    def __init__(self, cap: ConnectionCap) -> None:
        self.cap = cap
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.key = "?"
        self.state = GONE
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        get = transport.get_extra_info
        self.key = self.cap.key_of(get("peername"), get("sockname"))
        self.cap.arrive(self)
        loop = asyncio.get_running_loop()
        self.deadline = loop.call_later(TOKEN_S, self.cap.late, self)
        self.inner = self.cap.factory()
        self.inner.connection_made(transport)

    def close(self) -> None:
        """Close at once (it waited too long, or makes room for a newer one)."""
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        self.cap.leave(self)
        if self.inner is not None:
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
    app = make_app(opts)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=2.0,
        keepalive_timeout=IDLE_S,
        logger=http_logger(),
    )
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    cap = ConnectionCap(runner.server)
    app[SERVED].admit = cap.admit_request  # the app says when a request has shown the token
    try:
        listening = await loop.create_server(cap, opts.host, opts.port, reuse_address=True)
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
