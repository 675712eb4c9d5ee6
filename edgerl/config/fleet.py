"""The ``[fleet]`` section: actors on other machines (Ray actors) feeding this learner.

Only settings live here; the fleet itself (``edgerl.fleet``, the optional ``edgerl[fleet]``
extra) reads them. With ``fleet.actors = 0`` (the default) the run acts in its own process.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgerl.config.fields import setting
from edgerl.errors import ConfigError

if TYPE_CHECKING:
    from edgerl.config import Config

MAX_ACTORS = 4096
# A custom Ray resource: NAME or NAME=AMOUNT (Ray's names are words, dashes, dots, colons).
RESOURCE = re.compile(r"^(?P<name>[A-Za-z_][\w.:-]*)(?:=(?P<amount>[0-9]+(?:\.[0-9]+)?))?$")


@dataclass
class FleetConfig:
    actors: int = setting(
        0,
        "remote actor processes (Ray actors), each running env.num_envs environments and a "
        "copy of the policy and sending its steps here; 0: act in this process",
        min=0,
        max=MAX_ACTORS,
    )
    address: str = setting(
        "",
        "the Ray cluster to join, HOST:PORT of `ray start --head` on the learner's machine "
        "(empty: start a Ray instance of this process's own, to try the fleet on one machine)",
    )
    auth: str = setting(
        "token",
        "Ray's RAY_AUTH_MODE, set on this node: token (every node needs the same token, from "
        "RAY_AUTH_TOKEN or ~/.ray/auth_token) or disabled (when joining fleet.address: an "
        "instance of this process's own always has a token)",
        choices=("token", "disabled"),
    )
    cpus_per_actor: float = setting(1.0, "CPUs Ray reserves for each actor", min=0.0, max=1024.0)
    gpus_per_actor: float = setting(
        0.0,
        "GPUs Ray reserves for each actor; above 0 its policy copy acts on the node's GPU (Ray "
        "sees a Jetson's GPU only when the node was started with --num-gpus=1)",
        min=0.0,
        max=64.0,
    )
    resource: str = setting(
        "",
        "a custom Ray resource each actor needs, NAME or NAME=AMOUNT (default 1): actors go "
        "only to nodes started with --resources='{\"NAME\": N}'",
    )
    batch_steps: int = setting(
        32,
        "vector steps in each batch an actor sends (batch_steps x env.num_envs transitions)",
        min=1,
        max=100_000,
    )
    max_inflight: int = setting(
        2,
        "batches asked of each actor and not yet received (backpressure: an actor collects "
        "only what the learner asked for)",
        min=1,
        max=64,
    )
    weights_every: int = setting(
        50, "learner updates between sending the weights to the actors", min=1, max=1_000_000
    )
    exploration: str = setting(
        "apex",
        "apex: environment i of the fleet's N explores with apex_epsilon^(1 + apex_alpha "
        "i/(N-1)) once learning starts, as Ape-X; schedule: every environment follows "
        "agent.eps_*",
        choices=("apex", "schedule"),
    )
    apex_epsilon: float = setting(0.4, "Ape-X's base exploration rate", min=0.0, max=1.0)
    apex_alpha: float = setting(7.0, "Ape-X's exponent", min=0.0, max=100.0)
    object_store_mb: int = setting(
        512,
        "object store of a Ray instance started here (fleet.address empty), in MiB; Ray's own "
        "default is 30% of memory",
        min=64,
        max=1 << 20,
    )


def parse_resource(text: str) -> dict[str, float]:
    """``fleet.resource`` as Ray's ``resources`` argument (empty: none); raises ConfigError."""
    if not text:
        return {}
    m = RESOURCE.match(text.strip())
    if m is None or m["name"] in ("CPU", "GPU", "memory", "object_store_memory"):
        raise ConfigError(
            f"fleet.resource must be NAME or NAME=AMOUNT (a custom resource the actors' nodes "
            f"were started with), got {text!r}; CPUs and GPUs are fleet.cpus_per_actor and "
            "fleet.gpus_per_actor"
        )
    amount = float(m["amount"]) if m["amount"] else 1.0
    if amount <= 0:
        raise ConfigError(f"fleet.resource's amount must be above 0, got {text!r}")
    return {m["name"]: amount}


def fleet_envs(cfg: Config) -> int:
    """The environments a run learns from: ``env.num_envs`` here, or that many on each of the
    ``fleet.actors`` remote actors (the replay's rows)."""
    return cfg.env.num_envs * max(cfg.fleet.actors, 1)
