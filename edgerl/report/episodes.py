"""The episodes of a training run: those in flight (a return and a length per environment, kept
in arrays) and those that ended (the count, the last 100 returns, a row each in episodes.csv).

Only the environments whose episode ended in a step get any per-environment Python; the rest of
a step is two array additions.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from edgerl.report.metrics import EpisodeWriter, TrainStats
from edgerl.stream import FrameMeta

RECENT_EPISODES = 100


class Episodes:
    """The trainer's episode bookkeeping (its count and recent returns are checkpointed)."""

    def __init__(self) -> None:
        self.count = 0  # episodes ended, over the whole run
        self.recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.returns = np.zeros(0, dtype=np.float64)  # of the episodes in flight, per env
        self.lengths = np.zeros(0, dtype=np.int64)
        self.shown = 0  # the environment the viewer shows
        self.shown_episode = 1  # the number its episode in flight will have
        self._csv: EpisodeWriter | None = None

    def start(self, num_envs: int, shown: int, csv: EpisodeWriter | None) -> None:
        """Begin a session: every environment starts an episode."""
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.shown, self.shown_episode = shown, self.count + 1
        self._csv = csv

    def mean_return(self) -> float:
        """Mean return of the last 100 episodes (NaN before the first)."""
        return float(np.mean(self.recent)) if self.recent else math.nan

    def add(
        self,
        rewards: np.ndarray,
        done: np.ndarray,
        envs: np.ndarray | None,
        step: int,
        wall_s: float,
    ) -> None:
        """One step of ``envs`` (None: all, in order) with real (unclipped) ``rewards``; the
        episodes ``done`` ended at env step ``step``."""
        rows = slice(None) if envs is None else envs
        self.returns[rows] += rewards
        self.lengths[rows] += 1
        if not done.any():
            return
        ended = np.flatnonzero(done) if envs is None else envs[done]
        for i in ended.tolist():
            self.add_whole(float(self.returns[i]), int(self.lengths[i]), i, step, wall_s)
        self.returns[ended] = 0.0
        self.lengths[ended] = 0
        if self.shown in ended:
            self.shown_episode = self.count + 1

    def add_whole(self, ret: float, length: int, env: int, step: int, wall_s: float) -> None:
        """An episode of environment ``env`` ended at env step ``step`` (one of :meth:`add`'s,
        or one played elsewhere, whose steps this tally never saw)."""
        self.recent.append(ret)
        self.count += 1
        if self._csv is not None:
            self._csv.write(step, self.count, env, ret, length, wall_s)

    def restart(self, envs: np.ndarray) -> None:
        """Environments ``envs`` start over without their episodes ending (a remote actor lost
        and started again): what those episodes had gathered is dropped, never counted."""
        self.returns[envs] = 0.0
        self.lengths[envs] = 0

    def frame_meta(
        self, step: int, epsilon: float, action: int, stats: TrainStats, q_values: object = None
    ) -> FrameMeta:
        """The overlay of the shown environment's frame at ``step``: its episode and return
        so far, with the run's pace and load."""
        ret = float(self.returns[self.shown])
        sps, load = stats.sps, stats.load
        return FrameMeta.of(step, self.shown_episode, ret, epsilon, action, sps, load, q_values)
