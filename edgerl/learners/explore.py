"""Exploration: epsilon-greedy actions for a batch of environments, the one implementation that
training's actor (through :class:`~edgerl.learners.acting.EpsilonGreedy`), evaluations and
``edgerl play --epsilon`` use. How much to explore at an env step is the learner's
:meth:`~edgerl.learners.Learner.epsilon`."""

from __future__ import annotations

import numpy as np


def exploration(
    epsilon: float | np.ndarray, num_actions: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """Where each of ``n`` environments explores: returns a uniformly random action (int64)
    with probability ``epsilon`` (one rate, or one per environment), else -1 (act greedily).

    One draw of uniform floats gives both the random actions and the coin flips (numpy's
    ``integers`` costs three times as much per call, for a handful of numbers)."""
    u = rng.random(2 * n)
    randoms = (u[:n] * num_actions).astype(np.int64)
    return np.where(u[n:] < epsilon, randoms, -1)


def epsilon_greedy(
    q_values: np.ndarray | None,
    epsilon: float | np.ndarray,
    num_actions: int,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Greedy actions from ``q_values`` (None: all random), each random with probability
    ``epsilon`` (one rate, or one per environment)."""
    explore = exploration(1.0 if q_values is None else epsilon, num_actions, n, rng)
    if q_values is None:
        return explore
    return np.where(explore >= 0, explore, q_values.argmax(axis=1))


def with_exploration(
    actions: np.ndarray, epsilon: float, num_actions: int, rng: np.random.Generator
) -> np.ndarray:
    """``actions`` (greedy, one per environment), each replaced by a uniformly random action
    with probability ``epsilon`` (int64)."""
    explore = exploration(epsilon, num_actions, len(actions), rng)
    return np.where(explore >= 0, explore, np.asarray(actions, dtype=np.int64))
