"""``edgerl serve``: a web page and Prometheus metrics of the runs on this machine, read from
what their trainers write (the frame stream, ``status.json`` and the CSV files), never from the
trainers themselves, so that no viewer can slow or stop training.

The server needs the ``web`` extra (aiohttp and prometheus-client). This module holds what is
decided before it starts (who may connect, with which token) and imports neither; the rest of
the package is imported only once :func:`require_web` has found them.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from edgerl.errors import ConfigError, MissingDependencyError
from edgerl.files.regular import read_regular

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765
TOKEN_ENV = "EDGERL_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True)
class ServeOptions:
    """What ``edgerl serve`` was asked for (its token from :func:`access_token`)."""

    roots: list[Path]  # run directories, or directories of runs
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    trusted_network: bool = False
    fps: float = 15.0  # most frames a viewer is sent per second
    max_viewers: int = 32  # frame streams at once; more are refused, never queued
    nice: int = 10  # the server's CPU priority: below the trainer's
    # With --trusted-network: the Host names a browser may use besides this machine's own
    # names and addresses (--allowed-host), so a page elsewhere cannot rebind a name to it.
    allowed_hosts: tuple[str, ...] = ()


def local_names() -> set[str]:
    """This machine's names and the addresses of its interfaces, lower case: the Host values a
    browser on the network uses to reach it."""
    import socket

    import psutil

    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    try:
        for addresses in psutil.net_if_addrs().values():
            names.update(a.address.split("%")[0] for a in addresses if a.family in (2, 10))
    except OSError:
        pass
    return {n.lower() for n in names if n}


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def access_token(host: str, token: str | None, trusted_network: bool) -> str | None:
    """The token every request must carry: the one given; on this machine's loopback without
    one, a new one for this start, since other accounts on the machine are not trusted either
    (the run directories keep them out, and the page must not let them in); None with
    ``--trusted-network``, which says whoever can reach the port may watch. Raises ConfigError,
    with the sentence, for a token and --trusted-network at once, and for listening beyond this
    machine with neither."""
    if token is not None and trusted_network:
        raise ConfigError("give either a token or --trusted-network, not both")
    if token is not None or trusted_network:
        return token
    if is_loopback(host):
        return secrets.token_urlsafe(24)
    raise ConfigError(
        f"listening on {host} lets other machines connect, so edgerl serve wants a token: put "
        f"one in a file and give --token-file FILE (or set {TOKEN_ENV}), or say "
        "--trusted-network if everyone who can reach this port may watch"
    )


def read_token(path: Path | None, environ: dict[str, str] | None = None) -> str | None:
    """The token from ``path`` (its first line), else from ``$EDGERL_SERVE_TOKEN``, else None;
    raises ConfigError when the file cannot be read or the token is too short or holds spaces
    or control characters."""
    environ = dict(os.environ) if environ is None else environ
    where = f"${TOKEN_ENV}"
    if path is not None:
        try:
            data = read_regular(path, MAX_TOKEN_FILE_BYTES, streams=True)
        except FileNotFoundError:
            raise ConfigError(f"token file {path} does not exist") from None
        except OSError as e:
            raise ConfigError(f"cannot read token file {path}: {e.strerror or e}") from None
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise ConfigError(f"token file {path} is not plain ASCII text") from None
        token, where = (text.splitlines() or [""])[0].strip(), f"token file {path}"
        warn_if_others_read(path)
    elif environ.get(TOKEN_ENV):
        token = environ[TOKEN_ENV].strip()
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        raise ConfigError(
            f"the token in {where} must be at least {MIN_TOKEN_CHARS} characters without spaces "
            "(make one with: head -c 24 /dev/urandom | base64)"
        )
    return token


def warn_if_others_read(path: Path) -> None:
    """A warning, as ssh gives for its keys, when users other than the owner may read the token
    file: whoever reads it may watch every run."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return
    if mode & 0o077:
        log.warning(
            "token file %s may be read by other users (mode %04o): whoever reads it may watch "
            "every run; chmod 600 %s",
            path,
            mode,
            path,
        )


# The web extra's modules and their packages (what `edgerl serve` needs).
WEB_MODULES = (("aiohttp", "aiohttp"), ("prometheus_client", "prometheus-client"))


def require_web() -> None:
    """Raise MissingDependencyError, naming the ``web`` extra, when aiohttp or
    prometheus-client is not installed."""
    import importlib.util

    for module, package in WEB_MODULES:
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(package, "web", "edgerl serve")
