"""How a learner's environments pick their actions while it trains: its acting policy.

The actor (:mod:`edgerl.run.actor`) runs the policy's network on a batch of observations and
hands the output to the policy, which picks each row's action and says what else to keep of
that row (its *extras*, such as the greedy value a rollout learner reuses). The actor knows no
algorithm: epsilon-greedy is DQN's, PQN's and the GA's policy here, and a learner that samples
from a distribution brings a policy of its own.

A policy has two halves, so that the device half can run inside a captured CUDA graph:

* :meth:`ActingPolicy.draw`, on the host: the randomness of one step (each row's noise), from
  the actor's numpy generator, so that a seeded run repeats on the CPU and on a GPU alike, and
  no graph draws random numbers on the GPU (see :mod:`edgerl.run.actor` for why);
* :meth:`ActingPolicy.choose`, tensor operations only: the rows' actions and extras from the
  network's output and that noise.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import nn

from edgerl.learners.explore import exploration


class ActingPolicy(Protocol):
    net: nn.Module  # called as net(obs), or as net(obs, envs) where per_env
    per_env: bool  # each row's environment may act with a network of its own (a population)
    num_actions: int  # discrete actions; a continuous action's numbers
    # One action's shape: () an action id (float32 in choose()'s column, int64 once unpacked),
    # (numbers,) a continuous game's float32 vector.
    action_shape: tuple[int, ...]
    extras: tuple[str, ...]  # what choose() gives beside each action, in its columns' order
    noise_dtype: str  # the dtype of draw()'s array (a torch dtype's name)
    noise_shape: tuple[int, ...]  # one row's noise: () a number, (k,) k numbers

    def draw(self, epsilon: float | np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """The noise of ``n`` rows at exploration rate ``epsilon`` (one, or one per row),
        shape ``(n, *noise_shape)``; where :meth:`needs_forward` is False, it is the actions
        themselves, shape ``(n, *action_shape)``."""
        ...

    def needs_forward(self, epsilon: float | np.ndarray) -> bool:
        """Whether the network must run: False when :meth:`draw` alone picks the actions."""
        ...

    def choose(self, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Each row's action and extras, ``(n, width + len(extras))`` float32 (the action in
        the first ``width`` columns: an id, exact as a float, or a vector's numbers; ``width``
        is :func:`action_width`), from the network's output ``out`` and the rows' ``noise``;
        tensor operations only, no random numbers (a CUDA graph captures it)."""
        ...

    def per_action(self, out: torch.Tensor) -> torch.Tensor:
        """The figures the viewer shows per action, ``(n, num_actions)`` (for a continuous
        game, its action's numbers as the policy would act greedily)."""
        ...


def action_width(policy: ActingPolicy) -> int:
    """The columns one action takes in :meth:`ActingPolicy.choose`'s rows: 1 for an id, a
    continuous action's numbers."""
    return int(np.prod(policy.action_shape, dtype=np.int64)) if policy.action_shape else 1


class EpsilonGreedy:
    """The greedy action of the network's output (argmax, the first of equal ones), a uniformly
    random one with probability epsilon; with ``keep_values``, each row's greedy value
    ``max_a Q`` as the extra ``"value"``; with ``per_env``, ``net`` is called with the rows'
    environment ids as well. At epsilon 1 no forward pass runs."""

    action_shape: tuple[int, ...] = ()
    noise_dtype = "int64"
    noise_shape: tuple[int, ...] = ()

    def __init__(
        self, net: nn.Module, num_actions: int, keep_values: bool = False, per_env: bool = False
    ) -> None:
        self.net = net
        self.num_actions = num_actions
        self.per_env = per_env
        self.extras: tuple[str, ...] = ("value",) if keep_values else ()

    def draw(self, epsilon: float | np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """Each row's random action where it explores, -1 where it acts greedily."""
        return exploration(epsilon, self.num_actions, n, rng)

    def needs_forward(self, epsilon: float | np.ndarray) -> bool:
        return bool(np.any(np.asarray(epsilon) < 1.0))

    def choose(self, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        q = out.float()
        actions = torch.where(noise >= 0, noise, q.argmax(dim=1)).float()
        if not self.extras:
            return actions.unsqueeze(1)
        return torch.stack((actions, q.max(dim=1).values), dim=1)

    def per_action(self, out: torch.Tensor) -> torch.Tensor:
        return out.float()
