"""What watches the episodes played: one step as observers see it, and the observer's hooks."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgerl.envs import VecEnv

if TYPE_CHECKING:
    from edgerl.play.record import Recording


@dataclass(frozen=True)
class Moment:
    """One step played, as observers see it (one environment: no batch dimension)."""

    obs: np.ndarray  # the observation the action was chosen on
    action: int
    q: np.ndarray | None  # its Q-values, when an observer asked for them
    next_obs: np.ndarray  # after the step (the next episode's first when the game ended one)
    final_obs: np.ndarray | None  # the episode's last observation when the game ended it
    ret: float  # the episode's return so far
    episode: int  # counted from 1
    steps: int  # steps played in all


class Observer:
    """What watches the episodes played. Every method does nothing unless a subclass says so."""

    screens = False  # needs the environment to draw its colour screen
    window = False  # draws in a window of its own (other screens are drawn offscreen)
    wants_q = False  # needs each step's Q-values (the policy then computes them)
    recording: Recording | None = None  # the file recorded, once playing ended

    def on_start(self, env: VecEnv, cleanup: contextlib.ExitStack) -> None:
        """The environment was made; what enters ``cleanup`` is left when playing ends, by an
        exception too."""

    def on_reset(self, obs: np.ndarray, episode: int) -> None:
        """Episode ``episode`` (counted from 1) begins with ``obs``: only episodes that will be
        played begin."""

    def on_step(self, moment: Moment) -> bool:
        """A step was played; False ends playing (not a stop: what was played counts)."""
        return True

    def on_episode(self, episode: int, ret: float, length: int) -> None:
        """Episode ``episode`` ended (by the game or cut) with return ``ret`` after ``length``
        steps."""

    def on_end(self, stopped: bool) -> None:
        """Playing ended without an error; ``stopped``: by ``PlayOptions.stop``."""
