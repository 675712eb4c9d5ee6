"""What the rest of edgerl knows of a learning algorithm: the :class:`Learner` interface.

A learner owns its network (the policy that exports and plays: greedy actions are the argmax of its
output, or for a game whose actions are numbers the output itself), how its environments act while
it trains (:attr:`Learner.policy`, an :class:`~edgerl.learners.acting.ActingPolicy`: its network
or one around it, a different member in each environment for a population learner, and how an
action is picked from its output), its optimizer and its schedules: how much exploration at an env
step, and how much learning is due (:meth:`Learner.owed`, in units the learner chooses: DQN's and
SAC's gradient updates, PQN's and PPO's rollouts, the GA's ended episodes; it sees the memory, so a
learner can owe work for what it holds, such as finished episodes). The pipeline asks it to
:meth:`Learner.learn` from its memory (a replay, a rollout, episodes' scores) what is due;
checkpoints hold its :meth:`Learner.state_dict`. The learners are the modules the registry
(:mod:`edgerl.config.learners`) names, each with a ``KIND`` (:mod:`edgerl.learners.kinds`) that
builds it; a new one is a module with a class that has these members and a kind, and a line in
the registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the package loads no PyTorch: edgerl.learners.explore is numpy only
    import torch
    from torch import nn

    from edgerl.learners.acting import ActingPolicy
    from edgerl.learners.shared import LossMeter
    from edgerl.memories import Memory


class Learner(Protocol):
    kind: str  # its registry name (agent.algo): checkpoints record it
    device: torch.device
    q: nn.Module  # the policy network: what checkpoints keep under POLICY_KEY, play and export
    updates: int  # gradient updates so far
    per_launch: int  # units learn() makes at a time (the rest waits for the end of a run)
    losses: LossMeter
    cuda_graphs: bool  # the actor may capture its forward pass too
    learn_from: tuple[int, int]  # the env step learning starts at, and the units done then
    steps_per_unit: int  # env steps one unit of learning stands for (an update, a rollout)

    def describe(self) -> str:
        """How it learns here, in a few words (device, layout, precision)."""
        ...

    def epsilon(self, step: int) -> float:
        """The exploration rate at env step ``step``."""
        ...

    @property
    def policy(self) -> ActingPolicy:
        """How the actor acts while training: the policy's network (``q`` itself where one
        network acts for every environment; where the policy says ``per_env`` it is called as
        ``forward(obs, envs)``, ``envs`` the rows' environment ids, a long tensor on its device,
        so that each environment can act with a network of its own) and how each row's action
        and extras come from its output."""
        ...

    def figures(self) -> dict[str, float]:
        """Its own figures by name, for the progress line, metrics.csv, status and ``/metrics``
        (a genetic algorithm's generation and scores; NaN while not known); the same names
        every call. Empty for a learner with none (DQN's, PQN's)."""
        ...

    def owed(self, step: int, memory: Memory) -> int:
        """Units of learning due at env step ``step``, with ``memory`` as the actor has written
        it so far, and not made yet. In the async pipelines the learner's thread asks while the
        actor's writes the memory: a learner that reads the memory here learns in the actor's
        loop (``beside_actor = ""`` in its registry line), or reads it safely."""
        ...

    def learn(self, memory: Memory, step: int, n: int) -> None:
        """Make ``n`` units of learning from ``memory`` at env step ``step``."""
        ...

    def resume_at(self, step: int, refill: int) -> None:
        """Continue a resumed run at ``step``, with ``refill`` steps before learning resumes."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything it needs to resume; the acting network's weights under
        :data:`edgerl.files.checkpoint.POLICY_KEY` (what play and export load), the rest its own."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
