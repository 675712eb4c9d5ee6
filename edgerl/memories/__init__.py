"""What learners learn from: the replay (DQN, SAC), the rollout (PQN, PPO) and episodes' scores
(the GA), with the memory budget, and the :class:`Memory` protocol that the trainer, the
pipeline and checkpoints know them by."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Memory(Protocol):
    """A learner's memory as the rest of a run sees it: the actor writes every vector step into
    it, a learner reads it (a replay's samples, a rollout in order), checkpoints keep its random
    state. :class:`~edgerl.memories.replay.buffer.ReplayBuffer` and
    :class:`~edgerl.memories.rollout.RolloutBuffer` are two of them; which one a learner learns
    from is its line in :mod:`edgerl.config.learners`."""

    # True: learning samples what it holds and the steps stay (a replay: filled before learning
    # starts, saved beside a checkpoint where asked); False: each unit of learning takes the
    # whole memory, which the actor then writes anew (a rollout).
    keeps_steps: bool

    @property
    def capacity(self) -> int:
        """Transitions it holds."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes it takes (host or device)."""
        ...

    def add_first(self, obs: np.ndarray, envs: np.ndarray | None = None) -> None:
        """The first observation of every environment (or of ``envs``) after a reset."""
        ...

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
        """One vector step: the actions taken and what followed (``envs``: the rows' env ids)."""
        ...

    def set_guard(self, on: bool) -> None:
        """Whether a learner reads while the actor writes (the async pipeline)."""
        ...

    def note_extras(self, extras: dict[str, np.ndarray], version: int) -> None:
        """What the learner's acting policy said of the newest observations beside their
        actions (:attr:`edgerl.learners.acting.ActingPolicy.extras`, one row per environment,
        every environment in order), from the weights of the learner's update ``version``: a
        memory keeps those it has room for and ignores the rest (a replay keeps none)."""
        ...

    def rng_state(self) -> Any:
        """Its random state, for a checkpoint."""
        ...

    def set_rng_state(self, state: Any) -> None:
        """Restore what :meth:`rng_state` gave."""
        ...
