"""``edgerl serve``'s connections before and after the token, against the real server process
with real sockets: half-sent requests (more than one address could hold before), connections
that only ask for the page's public files, refused requests, and other accounts of this machine
(who all come from 127.0.0.1) filling every place a stranger's connection may take."""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401 - loaded here: another account's process cannot read it
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .test_serve import SLOW, request, start_server, stop_server

pytest.importorskip("aiohttp", reason="the web extra is not installed")

HALF_SENT = b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\nX-Slow: "  # and never the rest


@dataclass
class Server:
    url: str
    host: str
    port: int
    token: str

    def get(self, path: str) -> tuple[int, bytes]:
        return request(self.url, path, token=self.token)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``edgerl serve`` on 127.0.0.1 with the token it made for its start, over no runs: what
    is tested here is who may hold its sockets."""
    root = tmp_path_factory.mktemp("connections")
    (root / "runs").mkdir()
    proc, url, token = start_server(root / "runs")
    if token is None:
        stop_server(proc)
        raise AssertionError("no token made for the start")
    try:
        host, port = url.split("//")[1].strip("/").rsplit(":", 1)
        yield Server(url, host, int(port), token)
    finally:
        assert stop_server(proc) == 0


def half_sent(server: Server, source: str = "127.0.0.1") -> socket.socket:
    """A connection that sends a request's first lines and never the rest (slowloris)."""
    conn = socket.create_connection(
        (server.host, server.port), timeout=SLOW, source_address=(source, 0)
    )
    with contextlib.suppress(OSError):  # refused at once: what is checked is the owner's turn
        conn.sendall(HALF_SENT)
    return conn


def closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes ``conn`` (end of stream or reset) within ``within`` seconds
    (generous: what is checked is that it does, not how fast)."""
    conn.settimeout(within)
    try:
        while True:
            data = conn.recv(4096)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def read_response(conn: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (its body by Content-Length): status, headers (lower case), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionResetError(f"the server closed the connection: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = dict((k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in lines[1:]))
    while len(body) < int(headers.get("content-length", "0")):
        chunk = conn.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split(" ")[1]), headers, body


def test_half_sent_connections_beyond_the_old_limit_never_lock_out_the_token(server):
    """64 half-sent connections from 127.0.0.1 (which every local account shares) locked the
    owner out: a new connection was refused before any token was read. Now a connection that
    has not shown the token makes room for a newer one, and the owner's request is answered;
    and every connection that never shows the token is closed."""
    from edgerl.serve.server import PER_ADDRESS_CONNECTIONS, TOKEN_S, WAITING_PER_PEER

    count = PER_ADDRESS_CONNECTIONS + WAITING_PER_PEER  # more than one address could hold
    held = [half_sent(server) for _ in range(count)]
    held += [half_sent(server, "127.0.0.2") for _ in range(WAITING_PER_PEER)]
    try:
        for _ in range(3):  # answered, and again: its connections are not what fills up
            status, body = server.get("/api/runs")
            assert status == 200 and body.startswith(b'{"runs":'), (status, body[:200])
        status, _ = request(server.url, "/metrics")  # no token: refused as before
        assert status == 401
        for conn in held:
            assert closed_by_server(conn, 10 * TOKEN_S), "a half-sent connection was kept"
    finally:
        for conn in held:
            conn.close()
    assert server.get("/api/runs")[0] == 200


def test_a_connection_that_never_shows_the_token_is_closed_however_busy_it_keeps(server):
    """Asking for the page's public files (no token wanted) kept a connection for ever: each
    answer started aiohttp's idle time again. A connection now has TOKEN_S to show the token,
    whatever it asks meanwhile, and is closed after; so is a request sent a byte at a time."""
    from edgerl.serve.server import TOKEN_S

    busy = socket.create_connection((server.host, server.port), timeout=SLOW)
    trickle = socket.create_connection((server.host, server.port), timeout=SLOW)
    answered = 0
    try:
        deadline = time.monotonic() + 10 * TOKEN_S
        closed = False
        head = HALF_SENT + b"x\r\n\r\n"
        while time.monotonic() < deadline and not closed:
            try:
                busy.sendall(b"GET /assets/style.css HTTP/1.1\r\nHost: localhost\r\n\r\n")
                status, headers, _ = read_response(busy)
            except OSError:
                closed = True
                break
            assert status == 200 and headers.get("connection") != "close"
            answered += 1
            with contextlib.suppress(OSError):
                trickle.sendall(head[answered % len(head) : answered % len(head) + 1])
            time.sleep(1.0)
        assert answered >= 1, "the page's own files want no token"
        assert closed, f"a connection that never showed the token was kept {10 * TOKEN_S:.0f} s"
        assert closed_by_server(trickle, 10 * TOKEN_S)
    finally:
        busy.close()
        trickle.close()


def test_a_refused_request_closes_its_connection(server):
    """A request without the token (or with a wrong one) is answered 401 and its connection
    closed: it has nothing more to ask there, and held a socket until timed out before."""
    for auth in (b"", b"Authorization: Bearer wrong-token-0123456789\r\n"):
        with socket.create_connection((server.host, server.port), timeout=SLOW) as conn:
            conn.sendall(b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\n" + auth + b"\r\n")
            status, headers, _ = read_response(conn)
            assert status == 401 and headers.get("connection") == "close", headers
            assert closed_by_server(conn, SLOW)
    with socket.create_connection((server.host, server.port), timeout=SLOW) as conn:
        good = f"Authorization: Bearer {server.token}\r\n".encode()
        for _ in range(2):  # the token holder's connection stays open between requests
            conn.sendall(b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\n" + good + b"\r\n")
            status, headers, _ = read_response(conn)
            assert status == 200 and headers.get("connection") != "close", headers


# -- other accounts of this machine -----------------------------------------------------------


@contextlib.contextmanager
def as_account(uid: int, server: Server, count: int, again: int = 0) -> Iterator[int]:
    """A process of account ``uid`` holding ``count`` half-sent connections to ``server``,
    then, once the caller writes a byte to the descriptor given, ``again`` more; it writes a
    byte back after each batch, and ends (its connections with it) when the caller is done."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other account: no pytest here, only sockets, then _exit
        code = 0
        try:
            os.close(to_child_w)
            os.close(to_parent_r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            held = [half_sent(server) for _ in range(count)]
            os.write(to_parent_w, b"1")
            if os.read(to_child_r, 1) and again:
                held += [half_sent(server) for _ in range(again)]
                os.write(to_parent_w, b"2")
                os.read(to_child_r, 1)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(to_child_r)
    os.close(to_parent_w)
    try:
        assert os.read(to_parent_r, 1) == b"1", f"account {uid} could not connect"
        yield to_child_w
    finally:
        os.close(to_child_w)
        os.close(to_parent_r)
        os.waitpid(pid, 0)


def test_a_local_connection_counts_against_its_account_not_127_0_0_1():
    """Every account of the machine connects from 127.0.0.1: the kernel names which one owns
    the other end, and that is what the connection counts against."""
    from edgerl.serve.peers import connection_key

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        with socket.create_connection(listening.getsockname()):
            accepted, peer = listening.accept()
            with accepted:
                assert connection_key(peer, accepted.getsockname()) == f"uid {os.getuid()}"
        # an address elsewhere counts as that address, as before
        assert connection_key(("192.0.2.7", 5000), ("192.0.2.1", 8765)) == "192.0.2.7"
    if os.geteuid() == 0:
        to_child_r, to_child_w = os.pipe()
        with socket.socket() as listening:
            listening.bind(("127.0.0.1", 0))
            listening.listen()
            listening.settimeout(SLOW)
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(to_child_w)
                    os.setgid(65534)
                    os.setuid(65534)
                    conn = socket.create_connection(listening.getsockname())
                    os.read(to_child_r, 1)
                    conn.close()
                finally:
                    os._exit(0)
            accepted, peer = listening.accept()
            with accepted:
                assert connection_key(peer, accepted.getsockname()) == "uid 65534"
            os.close(to_child_w)
            os.waitpid(pid, 0)
        os.close(to_child_r)


def test_another_account_cannot_push_out_the_owners_connections_or_fill_every_place(server):
    """Another account opening as many half-sent connections as it can, again and again,
    closes its own oldest to make room, never the owner's (whose request, half sent while it
    does, is answered when finished); and accounts filling every place a stranger's connection
    may take leave the owner's new connection let in."""
    from edgerl.serve.server import WAITING_ALL, WAITING_PER_PEER

    if os.geteuid() != 0:
        pytest.skip("acting as other accounts of this machine needs root")
    good = f"Authorization: Bearer {server.token}\r\n\r\n".encode()
    mine = socket.create_connection((server.host, server.port), timeout=SLOW)
    with mine:
        mine.sendall(b"GET /api/runs HTTP/1.1\r\nHost: localhost\r\n")  # a slow link's first part
        many = 2 * WAITING_PER_PEER
        with as_account(65534, server, many, again=many) as other:
            os.write(other, b"+")  # another round while the owner's request is half sent
            mine.sendall(good)
            status, _, body = read_response(mine)
            assert status == 200 and body.startswith(b'{"runs":'), (status, body[:200])
            assert server.get("/api/runs")[0] == 200
    # Accounts enough to take every place (each all its own), then the owner.
    accounts = WAITING_ALL // WAITING_PER_PEER + 1
    with contextlib.ExitStack() as stack:
        for n in range(accounts):
            stack.enter_context(as_account(60001 + n, server, WAITING_PER_PEER))
        for _ in range(3):
            assert server.get("/api/runs")[0] == 200
