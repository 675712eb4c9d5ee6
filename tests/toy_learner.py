"""A learner written the way docs/development.md says a new one is: one module with a class that
has the members of edgerl.learners.Learner and its kind (``KIND``: how it is built and what it
costs, the rest as edgerl.learners.kinds.Basics has it), plus one registry entry (the test that
uses it adds the entry). One-step Q-learning on each rollout, plain SGD: small, so
the test is about the plumbing (train, checkpoint, resume, play, export), not about learning."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import Config
from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import num_actions_of
from edgerl.learners.shared import LossMeter, epsilon_at
from edgerl.memories.rollout import RolloutBuffer


class OneStepQ:
    kind = "toy"

    def __init__(self, net: nn.Module, cfg: Config, device: torch.device) -> None:
        self.cfg = cfg.agent
        self.device = device
        self.q = net.to(device)
        self.optimizer = torch.optim.SGD(self.q.parameters(), lr=cfg.agent.lr)
        self.losses = LossMeter(device)
        self.updates = 0
        self.per_launch = 1
        self.cuda_graphs = False
        self.learn_from = (0, 0)
        self.steps_per_unit = cfg.pqn.rollout_steps * cfg.env.num_envs
        self.rollouts = 0

    def describe(self) -> str:
        return f"{self.device.type}, one-step Q"

    def figures(self) -> dict[str, float]:
        return {}  # nothing of its own to show beside the loss

    def epsilon(self, step: int) -> float:
        return epsilon_at(self.cfg, step, self.learn_from[0])

    @property
    def policy(self) -> EpsilonGreedy:
        return EpsilonGreedy(self.q, num_actions_of(self.q))

    def owed(self, step: int, memory: object = None) -> int:
        start_step, start_rollouts = self.learn_from
        return start_rollouts + max(0, step - start_step) // self.steps_per_unit - self.rollouts

    def learn(self, memory: RolloutBuffer, step: int, n: int = 1) -> None:
        for _ in range(n):
            steps, envs = memory.steps, memory.num_envs
            with torch.no_grad():
                following = self.q(memory.obs[1:].flatten(0, 1)).max(dim=1).values
                for t, rows, final in memory.finals:  # an episode's last observation
                    following.view(steps, envs)[t, rows] = self.q(final).max(dim=1).values
                done = memory.terminated.flatten().float()
                target = memory.rewards.flatten() + self.cfg.gamma * (1 - done) * following
            taken = self.q(memory.obs[:steps].flatten(0, 1)).gather(
                1, memory.actions.flatten().unsqueeze(1)
            )
            loss = F.mse_loss(taken.squeeze(1), target)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.losses.add(loss.detach())
            self.updates += 1
            self.rollouts += 1
            memory.clear()

    def resume_at(self, step: int, refill: int = 0) -> None:
        self.learn_from = (step, self.rollouts)

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q.state_dict(), "updates": self.updates, "rollouts": self.rollouts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.updates, self.rollouts = int(state["updates"]), int(state["rollouts"])


class OneStepQKind(Basics):
    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> OneStepQ:
        return OneStepQ(net, cfg, device)

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """The act, the next observations' values and one gradient step per rollout step."""
        return {"act": 1.0, "values": 1.0, "targets": 0.0, "gradients": 3.0}

    def forwards_per_update(self, cfg: Config) -> float:
        """A rollout's values and its one gradient step."""
        return 4.0 * cfg.pqn.rollout_steps * cfg.env.num_envs


KIND = OneStepQKind()
