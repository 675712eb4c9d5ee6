"""A Transport without Ray: the fleet's RemoteActor objects in this process, whose batches
arrive irregularly (some actors each time, batches of varying length), as a real fleet's do.

It lets a real Trainer run its remote loop in a few seconds; the Ray transport itself is tested
on a real Ray cluster (test_fleet.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerl.config import Config
from edgerl.config.learners import RemoteActors
from edgerl.envs import EnvSpec
from edgerl.fleet.actor import RemoteActor
from edgerl.run.transport import Chunk


class InProcessFleet:
    plays = RemoteActors.STEPS

    def __init__(self, cfg: Config, spec: EnvSpec) -> None:
        self.cfg, self.spec = cfg, spec
        self.per_actor = cfg.env.num_envs
        self.num_envs = cfg.fleet.actors * self.per_actor
        self.actors: list[RemoteActor] = []
        self.epsilons = np.ones(self.num_envs)
        self.published: list[int] = []  # versions received, in order
        self.sizes: list[int] = []  # transitions of each batch delivered
        self.closed = False

    def start(self, weights: dict[str, np.ndarray], version: int, seed: int) -> None:
        config, spec = self.cfg.to_dict(), self.spec.to_dict()
        self.actors = [
            RemoteActor(config, spec, seed + i * self.per_actor)
            for i in range(self.cfg.fleet.actors)
        ]
        self.rng = np.random.default_rng(seed)
        self.publish(weights, version)

    def publish(self, weights: dict[str, np.ndarray], version: int) -> None:
        self.weights, self.version = weights, version
        self.published.append(version)

    def set_exploration(self, epsilons: np.ndarray) -> None:
        self.epsilons = epsilons

    def receive(self, timeout_s: float) -> list[Chunk]:
        out = []
        for i, actor in enumerate(self.actors):
            if self.rng.random() < 0.4:  # this one has nothing for the learner yet
                continue
            envs = np.arange(i * self.per_actor, (i + 1) * self.per_actor)
            steps = int(self.rng.integers(1, 2 * self.cfg.fleet.batch_steps))
            fresh = actor.version < self.version
            chunk = actor.collect(
                steps, self.epsilons[envs], self.weights if fresh else None, self.version
            )
            self.sizes.append(chunk.steps)
            out.append(chunk._replace(actor=i, envs=envs))
        return out

    def status(self) -> dict[str, Any]:
        actors = [{"id": i, "state": "running", "node": "here"} for i in range(len(self.actors))]
        return {"actors": actors, "running": len(actors), "transitions": sum(self.sizes)}

    def close(self) -> None:
        for actor in self.actors:
            actor.close()
        self.closed = True
