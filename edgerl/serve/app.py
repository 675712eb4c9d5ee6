"""The web server of ``edgerl serve`` (aiohttp): the page and its assets, a JSON document per
panel, the frame stream as a WebSocket, and ``/metrics``.

Routes (all GET)::

    /                          the page (index.html)
    /assets/<name>             its script, style sheet and icon, from a fixed table
    /api/runs                  the runs: id, game, state, last update
    /api/runs/<id>/summary     status, learner, time left, best evaluation, load now
    /api/runs/<id>/curves      training return, evaluations, steps/s (env steps and time)
    /api/runs/<id>/load        the last minutes of load.csv
    /api/runs/<id>/frames      WebSocket: the game (see edgerl.serve.frames)
    /metrics                   Prometheus

Files are read in worker threads, never on the event loop, so a slow disk delays a document but
no other client. With a token (given, or made for the start on 127.0.0.1) every request but
the page's own files must carry it: ``Authorization: Bearer TOKEN``, which the page sends once
opened as ``/?token=TOKEN`` (it keeps the token in the tab's sessionStorage, never a cookie), or
``?token=`` on the frame stream, whose WebSocket takes no header. Without one
(``--trusted-network``) the server answers only to this machine's names (on 127.0.0.1: its
loopback names), so that a web page elsewhere cannot reach it through a name of its own (DNS
rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from edgerl.serve import ServeOptions, is_loopback, local_names
from edgerl.serve.exporter import RunsCollector, metrics_text
from edgerl.serve.frames import FrameHub, stream_to
from edgerl.serve.runs import RunFiles

log = logging.getLogger(__name__)

PUBLIC = ("/", "/assets/")  # the page and its files: the same for everyone, no run in them
FRAMES = re.compile(r"/api/runs/[^/]+/frames")  # the one path that may take ?token=
ASSETS = {  # the only files the server sends: name -> content type
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    # Everything the page uses comes from here; nothing else may run or be framed.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the first address may hold the token
    "X-Frame-Options": "DENY",
}
SERVED: web.AppKey[Served] = web.AppKey("served")


@dataclass
class Served:
    """What the handlers share: the options, the runs' files, a hub per watched run."""

    opts: ServeOptions
    files: RunFiles
    assets: dict[str, bytes]
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="edgerl-serve-files")
    )
    frame_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="edgerl-serve-frames")
    )
    hubs: dict[Path, FrameHub] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)  # the Host names --trusted-network answers
    sockets: set[web.WebSocketResponse] = field(default_factory=set)
    # Called with each request that has shown the token (or passed the Host check without
    # one); False: its connection may not stay (the server holds as many as it may). The
    # server's connection cap sets it: a connection counts as a stranger's until then.
    admit: Callable[[web.Request], bool] = field(default=lambda request: True)

    def viewers(self) -> int:
        return sum(hub.viewers for hub in self.hubs.values())


def load_assets() -> dict[str, bytes]:
    """The page's files, read once from the package."""
    folder = resources.files("edgerl.serve").joinpath("assets")
    return {name: folder.joinpath(name).read_bytes() for name in ASSETS}


def _json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite made None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _json_response(request: web.Request, doc: Any, status: int = 200) -> web.Response:
    body = json.dumps(_json_safe(doc), separators=(",", ":"), allow_nan=False).encode()
    etag = f'"{zlib.crc32(body):08x}-{len(body)}"'
    headers = {"Cache-Control": "no-cache", "ETag": etag}
    if status == 200 and request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)  # unchanged: a poll costs a header
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


def _same(given: str, expected: str) -> bool:
    """A constant-time comparison of text from a request (whatever bytes it holds)."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape")
    )


def _authorized(request: web.Request, token: str) -> bool:
    """The token as ``Authorization: Bearer``, or (on the frame stream alone: a browser's
    WebSocket takes no header) as ``?token=``. No cookie: a browser sends a host's cookies to
    every port of it, where another account's server could take one and replay it."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return _same(auth[7:].strip(), token)
    given = request.query.get("token")
    if FRAMES.fullmatch(request.path) is None or given is None:
        return False
    # A query reads "+" as a space: a base64 token pasted into the address as it is (its "+"
    # not written %2B) arrives with spaces where the token has "+".
    return _same(given, token) or _same(given.replace(" ", "+"), token)


def _request_host(request: web.Request) -> str | None:
    """The Host the request names, lower case and without its port; None when it names none a
    browser could have used (a port beyond 65535, characters no name holds)."""
    try:
        host = request.url.host
    except ValueError:
        return None
    return host.lower().strip("[]") if host else None


def _token_shown(request: web.Request) -> bool:
    """Whether ``request`` shows a token where one is taken (a Bearer, or ``?token=`` on the
    frame stream), right or wrong."""
    bearer = request.headers.get("Authorization", "")[:7].lower() == "bearer "
    return bearer or ("token" in request.query and FRAMES.fullmatch(request.path) is not None)


def _unauthorized(wrong: bool = False) -> web.Response:
    """The 401 for a request without the token, or (``wrong``) with one that is not it."""
    where = (
        "TOKEN is in the file given with --token-file, or in the address edgerl serve printed "
        "at its start; in an address, a & or # in it must be written %26 or %23"
    )
    said = (
        "the token this request shows is not this edgerl serve's (one started again without "
        f"--token-file makes a new one): open the page as /?token=TOKEN ({where}), or send "
        "the header Authorization: Bearer TOKEN\n"
        if wrong
        else f"edgerl serve wants a token: open the page as /?token=TOKEN ({where}), or send "
        "the header Authorization: Bearer TOKEN\n"
    )
    return web.Response(
        status=401, text=said, headers={"WWW-Authenticate": 'Bearer realm="edgerl"'}
    )


def _host_refused(names: str) -> web.Response:
    return web.Response(
        status=403, text=f"edgerl serve answers to {names} only unless it has a token\n"
    )


def _busy() -> web.Response:
    return web.Response(
        status=503,
        text="edgerl serve has as many connections open as it keeps: close some, try again\n",
    )


def _closing(response: web.Response) -> web.Response:
    """``response``, after which its connection is closed: a client refused has nothing more
    to ask on it, and it must not hold a socket until it is timed out."""
    response.force_close()
    return response


def _refusal(request: web.Request, served: Served) -> web.Response | None:
    """Why ``request`` is refused (401, 403), None when it has shown the token (or, without
    one, names a Host of this machine's); None too for the page's own files, which want none."""
    opts, token = served.opts, served.opts.token
    if token is not None:
        if request.path == PUBLIC[0] or request.path.startswith(PUBLIC[1]):
            return None
        return None if _authorized(request, token) else _unauthorized(_token_shown(request))
    if is_loopback(opts.host):
        if not is_loopback(_request_host(request) or ""):
            return _host_refused("this machine's own names (localhost, 127.0.0.1)")
    elif (_request_host(request) or "") not in served.hosts:
        # --trusted-network: this machine's names and addresses, and --allowed-host, so that a
        # web page elsewhere cannot reach the server through a name of its own (DNS rebinding)
        return _host_refused("this machine's names and addresses and --allowed-host")
    return None


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """The token (or, without one, a Host of this machine's), then the handler; an error in a
    handler is a JSON sentence with status 500, never a traceback sent to the client. A
    request refused closes its connection; one that showed the token has it counted as the
    token holder's (:attr:`Served.admit`), the page's own files leave it a stranger's."""
    served = request.app[SERVED]
    refused = _refusal(request, served)
    if refused is not None:
        return _closing(refused)
    public = request.path == PUBLIC[0] or request.path.startswith(PUBLIC[1])
    if (served.opts.token is None or not public) and not served.admit(request):
        return _closing(_busy())
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except web.HTTPException:
        raise
    except ConnectionError:  # a browser closed the page: aiohttp lets the connection go quietly
        log.debug("%s: the client went away", request.path)
        raise
    except Exception as e:
        log.exception("internal error serving %s", request.path)
        return web.json_response({"problem": f"internal error: {type(e).__name__}"}, status=500)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


async def _in_pool(request: web.Request, fn: Any, *args: Any) -> Any:
    served = request.app[SERVED]
    return await asyncio.get_running_loop().run_in_executor(served.pool, fn, *args)


async def page(request: web.Request) -> web.Response:
    return _asset(request, "index.html")


async def asset(request: web.Request) -> web.Response:
    return _asset(request, request.match_info["name"])


def _asset(request: web.Request, name: str) -> web.Response:
    data = request.app[SERVED].assets.get(name)  # a name from the table or nothing
    if data is None:
        raise web.HTTPNotFound(text="no such file here\n")
    return web.Response(
        body=data, headers={"Content-Type": ASSETS[name], "Cache-Control": "no-cache"}
    )


async def runs(request: web.Request) -> web.Response:
    files = request.app[SERVED].files
    return _json_response(request, {"runs": await _in_pool(request, files.listing)})


def _run_doc(files: RunFiles, run_id: str, what: str) -> dict[str, Any] | None:
    run_dir = files.runs().get(run_id)
    if run_dir is None:
        return None
    if what == "summary":
        return files.summary(run_id, run_dir)
    return files.curves(run_dir) if what == "curves" else files.load_history(run_dir)


async def run_doc(request: web.Request) -> web.Response:
    run_id, what = request.match_info["run"], request.match_info["what"]
    doc = await _in_pool(request, _run_doc, request.app[SERVED].files, run_id, what)
    if doc is None:
        return _json_response(request, {"problem": f"no run {run_id!r} here"}, status=404)
    return _json_response(request, doc)


async def frames(request: web.Request) -> web.StreamResponse:
    served = request.app[SERVED]
    run_dir = (await _in_pool(request, served.files.runs)).get(request.match_info["run"])
    if run_dir is None:
        return _json_response(request, {"problem": "no such run here"}, status=404)
    origin = request.headers.get("Origin")
    if origin is not None and origin.split("://", 1)[-1] != request.host:
        return web.Response(status=403, text="the game is streamed to this server's own page\n")
    if served.viewers() >= served.opts.max_viewers:
        text = f"{served.opts.max_viewers} viewers watch already: try again later"
        return _json_response(request, {"problem": text}, status=503)
    hub = served.hubs.get(run_dir)
    if hub is None:
        hub = served.hubs[run_dir] = FrameHub(run_dir, served.opts.fps, served.frame_pool)
    ws = web.WebSocketResponse(heartbeat=20.0, compress=False, max_msg_size=1024)
    await ws.prepare(request)
    served.sockets.add(ws)
    try:
        await stream_to(ws, hub)
    finally:
        served.sockets.discard(ws)
        await ws.close()
    return ws


async def metrics(request: web.Request) -> web.Response:
    served = request.app[SERVED]
    collector = RunsCollector(served.files, served.viewers)
    body = await _in_pool(request, metrics_text, collector)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _close(app: web.Application) -> None:
    served = app[SERVED]
    for ws in list(served.sockets):
        await ws.close(code=1001, message=b"edgerl serve is stopping")
    for hub in served.hubs.values():
        await hub.close()
    served.pool.shutdown(wait=False, cancel_futures=True)
    served.frame_pool.shutdown(wait=False, cancel_futures=True)


def make_app(opts: ServeOptions) -> web.Application:
    """The application for ``opts`` (not listening yet)."""
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    served = Served(opts, RunFiles(opts.roots), load_assets())
    if opts.trusted_network:
        served.hosts = {*local_names(), opts.host.lower(), *(h.lower() for h in opts.allowed_hosts)}
    app[SERVED] = served
    app.on_response_prepare.append(_add_headers)
    app.on_shutdown.append(_close)
    app.router.add_get("/", page)
    app.router.add_get("/assets/{name}", asset)
    app.router.add_get("/api/runs", runs)
    app.router.add_get("/api/runs/{run}/frames", frames)
    app.router.add_get("/api/runs/{run}/{what:summary|curves|load}", run_doc)
    app.router.add_get("/metrics", metrics)
    return app
