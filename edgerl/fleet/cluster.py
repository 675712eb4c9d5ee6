"""Joining a Ray cluster (or starting a Ray instance of this process's own) for the fleet.

What Ray 2.x does by itself that a fleet must not rely on, and what is done instead:

* token authentication turns itself on for a new local instance and off when joining, depending
  on ``RAY_AUTH_MODE`` being unset and on a token file: the mode is set here explicitly from
  ``fleet.auth`` (every node of the fleet must set the same, see docs/fleet.md);
* a local instance's servers (GCS, raylet, workers) listen on every network of the machine,
  whatever node address it is given: it always has a token, made for it where none is set, so
  ``fleet.auth = disabled`` does not let other machines join it or run code there;
* usage statistics are sent home unless ``RAY_USAGE_STATS_ENABLED=0``: set here (a board may
  have no route out, and a learner's unit has no network but the cluster's);
* a bare ``ray.init()`` attaches to whatever cluster an old ``/tmp/ray`` names: never called
  here. With ``fleet.address`` the cluster named is joined; without it a new instance is
  started (``address="local"``) in a temporary directory of its own;
* Ray makes its temporary directory, the session's, ``sockets/``, ``logs/`` and
  ``runtime_resources/*`` mode 0777 without the sticky bit (so that several accounts can share
  ``/tmp/ray``): any account could delete, rename or plant files among the instance's sockets
  and logs. A local instance's directory is made inside a folder made here, 0700: no other
  account gets through it, whatever Ray does to the folders below;
* the object store takes 30% of memory by default: a local instance gets
  ``fleet.object_store_mb``;
* Ray does not see a Jetson's integrated GPU: a local instance is given torch's GPU count.

Joining an address that does not answer would make ``ray.init`` retry for a minute: the
address is tried with a plain TCP connection first, so a wrong one is one sentence at once.
``ray.init`` also takes SIGTERM for itself (it exits at once); the handler the run had (a stop
request: the step in flight finishes and a checkpoint is written) is put back.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from edgerl.config.fleet import FleetConfig, parse_resource
from edgerl.errors import ConfigError, FleetError, MissingDependencyError
from edgerl.hw.cpus import usable_cpus

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
TOKEN_FILE = Path.home() / ".ray" / "auth_token"  # where `ray get-auth-token` keeps it


def import_ray() -> ModuleType:
    """Ray, imported; raises MissingDependencyError naming the fleet extra when it is missing."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("ray", "fleet", "fleet.actors (remote actors)") from None
    return ray


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` as (host, port); raises ConfigError for anything else."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"fleet.address must be HOST:PORT of the Ray head (`ray start --head` prints it, "
            f"port 6379 by default), got {address!r}"
        )
    return host, int(port)


def check_reachable(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raises FleetError when nothing accepts a TCP connection at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as e:
        why = e.strerror or type(e).__name__
        if isinstance(e, socket.gaierror):
            why = f"unknown host: {e.strerror}"
        elif isinstance(e, TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        raise FleetError(
            f"cannot reach the Ray cluster at {host}:{port} ({why}): start its head there with "
            f"`ray start --head --port={port}` (docs/fleet.md), or correct fleet.address"
        ) from None


def has_token() -> bool:
    """A Ray token is set for this process: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or Ray's file."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(path).is_file() if path else TOKEN_FILE.is_file()


class Cluster:
    """This process's connection to Ray: :meth:`open` joins or starts, :meth:`close` leaves
    (and stops an instance started here)."""

    def __init__(self, fleet: FleetConfig) -> None:
        self.fleet = fleet
        self.ray: Any = None
        self.started_here = False
        self._temp_dir: str | None = None
        self._environ: dict[str, str | None] = {}  # what open() changed, as it was

    def open(self) -> Any:
        """Ray, connected; a local instance gets room for every actor. Raises ConfigError,
        FleetError or MissingDependencyError with one sentence."""
        fleet = self.fleet
        resources = parse_resource(fleet.resource)
        # Read by Ray in this process and every process it starts: before ray is imported.
        self._environ = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
        os.environ["RAY_AUTH_MODE"] = fleet.auth if fleet.address else "token"
        if not fleet.address and fleet.auth == "disabled":
            log.info(
                "fleet: the Ray instance of this process's own keeps a token whatever "
                "fleet.auth says: Ray's servers listen on every network of this machine"
            )
        os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
        if not sys.stderr.isatty():  # the actors' lines in a log file or the journal: no colours
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")
        if fleet.address:
            host, port = split_address(fleet.address)
            if fleet.auth == "token" and not has_token():
                raise FleetError(
                    "fleet.auth=token needs the cluster's token on this machine: copy it from "
                    f"the head node's {TOKEN_FILE} (`ray get-auth-token` prints it) to the same "
                    "place here or set RAY_AUTH_TOKEN, or set fleet.auth=disabled and "
                    "RAY_AUTH_MODE=disabled on every node"
                )
            check_reachable(host, port)
        elif not has_token():
            # A token for this instance alone, kept in its processes' environment: no file
            # under a home directory the service cannot write.
            os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        ray = import_ray()
        self.ray = ray
        if ray.is_initialized():  # a test or a caller that joined already: not ours to reuse
            raise FleetError("Ray is already connected in this process; edgerl joins by itself")
        sigterm = signal.getsignal(signal.SIGTERM)
        try:
            if fleet.address:
                ray.init(
                    address=fleet.address,
                    namespace="edgerl",
                    logging_level=logging.WARNING,
                )
            else:
                self._start_local(ray, resources)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
            self.close()
            where = f"join the Ray cluster at {fleet.address}" if fleet.address else "start Ray"
            raise FleetError(f"cannot {where}: {first_line(e)}") from None
        finally:
            if sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, sigterm)
        return ray

    def _start_local(self, ray: Any, resources: dict[str, float]) -> None:
        """A Ray instance of this process's own, with room for every actor, in a short
        temporary directory (Ray's socket paths must stay under 108 bytes) inside a folder
        only this account can enter, which :meth:`close` removes."""
        import math

        import torch

        fleet = self.fleet
        # mkdtemp makes a new folder (never a link), 0700, this account's; Ray opens up only
        # the folders below it, its own.
        self._temp_dir = tempfile.mkdtemp(prefix="edgerl-ray-", dir="/tmp")
        self.started_here = True
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        ray.init(
            address="local",
            namespace="edgerl",
            # The actors' reservations, not the cores: trying a fleet on one machine may
            # oversubscribe it, as the user chose.
            num_cpus=max(usable_cpus(), math.ceil(fleet.actors * fleet.cpus_per_actor)),
            num_gpus=gpus,
            resources={k: v * fleet.actors for k, v in resources.items()} or None,
            object_store_memory=self.fleet.object_store_mb << 20,
            include_dashboard=False,
            logging_level=logging.WARNING,
            _temp_dir=os.path.join(self._temp_dir, "ray"),
        )

    def close(self) -> None:
        """Disconnect from Ray (an instance started here stops); safe to call twice."""
        if self.ray is not None and self.ray.is_initialized():
            try:
                self.ray.shutdown()
            except Exception:  # leaving must go on
                log.exception("error while leaving the Ray cluster")
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
        # The mode and a token made for an instance of its own go with it: a later join in
        # this process must not take that token for the cluster's.
        for key, value in self._environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._environ = {}


def first_line(error: BaseException) -> str:
    """An exception's message, first line only (Ray's carry whole tracebacks)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
