"""The memory of a learner that learns from whole episodes' scores (the genetic algorithm): each
environment's score and length so far, and the episodes that ended since the learner last took
them. No observations are kept: a few numbers per environment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Finished:
    """One episode that ended: its environment, its score (the game's own points, summed) and
    its length in env steps."""

    env: int
    score: float
    length: int


class EpisodeScores:
    """What the actor writes for a learner that learns from episodes' scores; the learner
    takes :attr:`finished` (see :meth:`take`)."""

    keeps_steps = False  # nothing to sample: each episode is taken once

    def __init__(self, num_envs: int) -> None:
        self.score = np.zeros(num_envs, dtype=np.float64)
        self.length = np.zeros(num_envs, dtype=np.int64)
        self.finished: list[Finished] = []

    @property
    def capacity(self) -> int:
        return len(self.score)

    @property
    def nbytes(self) -> int:
        return self.score.nbytes + self.length.nbytes

    def add_first(self, obs: np.ndarray, envs: np.ndarray | None = None) -> None:
        rows = slice(None) if envs is None else envs
        self.score[rows] = 0.0
        self.length[rows] = 0

    def add(
        self,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        final_obs: np.ndarray | None,
        envs: np.ndarray | None = None,
    ) -> None:
        ids = np.arange(len(self.score)) if envs is None else np.asarray(envs)
        self.score[ids] += np.asarray(rewards, dtype=np.float64)
        self.length[ids] += 1
        ended = ids[np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)]
        for env in ended.tolist():
            self.finished.append(Finished(env, float(self.score[env]), int(self.length[env])))
        self.score[ended] = 0.0
        self.length[ended] = 0

    def take(self) -> list[Finished]:
        """The episodes that ended since the last call, oldest first."""
        finished, self.finished = self.finished, []
        return finished

    def set_guard(self, on: bool) -> None:
        """Nothing to guard: its learner learns in the actor's loop."""

    def note_extras(self, extras: dict[str, np.ndarray], version: int) -> None:
        """Keeps none: a member's episode is its score alone."""

    def rng_state(self) -> None:
        return None  # it draws nothing

    def set_rng_state(self, state: object) -> None:
        """Nothing to restore."""
