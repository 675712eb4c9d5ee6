"""Actors on other machines feeding this learner, through Ray (the optional ``edgerl[fleet]``
extra): the cluster (cluster.py), the actor process (actor.py) and the transport the training
loop reads (transport.py). Nothing below this package imports it; Ray is imported only when a
run asks for remote actors (``fleet.actors``). A population learner's fleet (member_fleet.py,
members.py) plays members from their seeds instead of sending steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgerl.config import Config
    from edgerl.envs import EnvSpec
    from edgerl.run.transport import Transport


def open_fleet(cfg: Config, spec: EnvSpec) -> Transport:
    """Join the Ray cluster ``fleet.address`` names (or start one here) and return the
    transport of ``fleet.actors`` actors, not started yet. Raises MissingDependencyError
    without Ray, ConfigError or FleetError with one sentence when the cluster cannot be used."""
    from edgerl.config.learners import RemoteActors, learner_info
    from edgerl.fleet.cluster import Cluster
    from edgerl.fleet.member_fleet import MemberFleet
    from edgerl.fleet.transport import RayFleet

    # A population learner's actors play its members from their seeds; the others' send steps
    # for its memory (the config refuses a learner that takes no remote actors).
    transports = {RemoteActors.STEPS: RayFleet, RemoteActors.MEMBERS: MemberFleet}
    transport = transports[learner_info(cfg.agent.algo).remote]
    cluster = Cluster(cfg.fleet)
    cluster.open()
    try:
        return transport(cfg, spec, cluster)
    except BaseException:
        cluster.close()
        raise
