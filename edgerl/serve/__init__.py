"""``edgerl serve``: a web page and Prometheus metrics of the runs on this machine, read from
what their trainers write (the frame stream, ``status.json`` and the CSV files), never from the
trainers themselves, so that no viewer can slow or stop training.

The server needs the ``web`` extra (aiohttp and prometheus-client). This module holds what is
decided before it starts (who may connect, with which token) and imports neither; the rest of
the package is imported only once :func:`require_web` has found them.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from edgerl.errors import ConfigError, MissingDependencyError
from edgerl.files.regular import read_regular

DEFAULT_PORT = 8765
TOKEN_ENV = "EDGERL_SERVE_TOKEN"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096


@dataclass(frozen=True)
class ServeOptions:
    """What ``edgerl serve`` was asked for (checked by :func:`check_access`)."""

    roots: list[Path]  # run directories, or directories of runs
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    token: str | None = None
    trusted_network: bool = False
    fps: float = 15.0  # most frames a viewer is sent per second
    max_viewers: int = 32  # frame streams at once; more are refused, never queued
    nice: int = 10  # the server's CPU priority: below the trainer's


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def check_access(host: str, token: str | None, trusted_network: bool) -> None:
    """Refuse to listen beyond this machine without a token, unless the network is said to be
    trusted; raises ConfigError with the sentence."""
    if token is not None and trusted_network:
        raise ConfigError("give either a token or --trusted-network, not both")
    if is_loopback(host) or token is not None or trusted_network:
        return
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


def require_web() -> None:
    """Raise MissingDependencyError, naming the ``web`` extra, when aiohttp or
    prometheus-client is not installed."""
    import importlib.util

    for module, package in (("aiohttp", "aiohttp"), ("prometheus_client", "prometheus-client")):
        if importlib.util.find_spec(module) is None:
            raise MissingDependencyError(package, "web", "edgerl serve")
