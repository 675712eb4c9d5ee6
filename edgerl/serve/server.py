"""Running the server of ``edgerl serve``: listen, say where, serve until SIGTERM or Ctrl-C.

The process lowers its own CPU priority first (nice 10 unless it is lower already): on a board
whose cores the trainer keeps busy, a page being watched takes what the trainer leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
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
    )
    await runner.setup()
    site = web.TCPSite(runner, opts.host, opts.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ServeError(listen_error(opts.host, opts.port, e)) from None
    port = runner.addresses[0][1] if runner.addresses else opts.port
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    ready(f"http://{shown}:{port}/")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("edgerl serve: stopping")
        await runner.cleanup()
    return 0
