"""What the training loop knows of actors that run elsewhere: a :class:`Transport` delivers
their steps as :class:`Chunk` batches and takes the weights and exploration rates back.

The loop (:mod:`edgerl.run.remote`) does not know what carries them: ``edgerl.fleet`` is the one
transport, Ray actors on other machines (the ``edgerl[fleet]`` extra). A chunk holds single
frames: the replay keeps one frame per step and rebuilds stacks itself, so an actor sends each
observation's newest frame (or, for vector observations, the vector) and nothing more.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np


class Chunk(NamedTuple):
    """``T`` vector steps of one actor's ``E`` environments, in order."""

    actor: int  # the actor's index in the fleet
    envs: np.ndarray  # (E,) int64: the learner's ids of its environments (replay rows)
    first: np.ndarray | None  # (E, *item): the items after its environments' reset, else None
    items: np.ndarray  # (T, E, *item): the newest frame (or vector) after each step
    actions: np.ndarray  # (T, E): the action that led to it
    rewards: np.ndarray  # (T, E) float32, unclipped
    terminated: np.ndarray  # (T, E) bool
    truncated: np.ndarray  # (T, E) bool
    final_items: np.ndarray  # (K, *item): each ended episode's last item, in (t, e) order
    version: int  # the learner's update count of the weights that acted

    @property
    def steps(self) -> int:
        """Transitions it holds."""
        return int(self.actions.size)


class Transport(Protocol):
    """Actors elsewhere, as the training loop sees them. Made by a factory the trainer is given
    (``edgerl.fleet.open_fleet``), which raises EdgerlError subclasses for what a user can fix."""

    num_envs: int  # environments over all actors: the replay's rows

    def start(self, weights: dict[str, np.ndarray], version: int, seed: int) -> None:
        """Start the actors with these weights (the learner's ``version``: its update count);
        their environments are seeded from ``seed``."""
        ...

    def receive(self, timeout_s: float) -> list[Chunk]:
        """The batches that arrived, each actor's in the order it sent them, after waiting up to
        ``timeout_s`` for the first (empty when none came); asks each actor that delivered for
        its next. An actor lost on the way is named in the log and left out; raises
        EdgerlError when no actor can run at all."""
        ...

    def set_exploration(self, epsilons: np.ndarray) -> None:
        """The exploration rate of each environment (``num_envs`` of them) for the batches asked
        for from now on."""
        ...

    def publish(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Newer weights for the actors' next batches."""
        ...

    def status(self) -> dict[str, Any]:
        """JSON-ready state for status.json: ``actors`` (a list of dicts with at least ``id``,
        ``state`` and ``node``) and totals."""
        ...

    def close(self) -> None:
        """Stop every actor (and what the transport started); safe to call twice."""
        ...


def apex_epsilons(n: int, base: float, alpha: float) -> np.ndarray:
    """Ape-X's exploration rates for ``n`` environments: ``base ** (1 + alpha * i / (n - 1))``
    for environment ``i`` (``base`` alone for one), from much exploration to almost none."""
    if n == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(n) / (n - 1))
