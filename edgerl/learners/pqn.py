"""The PQN learner: Q(lambda) without a replay memory or a target network (Gallici et al. 2024,
"Simplifying Deep Temporal Difference Learning"; reference code purejaxql, and CleanRL's
``pqn_atari_envpool.py``).

Many environments step together for ``pqn.rollout_steps`` steps (the rollout,
:mod:`edgerl.memories.rollout`); the learner then computes Q(lambda) returns over it with the
current network and makes ``pqn.epochs`` passes of ``pqn.minibatches`` minibatches each: the mean
squared error of Q(s, a) against the return, gradient clipping, RAdam. Then the next rollout starts.
LayerNorm in the network (:mod:`edgerl.learners.nets`) keeps this stable without a target network.
Memory is one rollout: for Pong at 128 environments 114 MiB, against 6.6 GiB for a replay of a
million transitions (a whole training process: 0.97 GiB against 7.0 GiB peak RSS, measured by
``scripts/bench_memory.py``), which makes PQN the learner for boards with little memory.

Where this differs from the reference, and why: truncated episodes bootstrap from their final
observation instead of counting as terminal (edgerl's environments hand that observation out);
the greedy values of the next observations are those the actor computed when it acted on them,
where the weights are still the same (all but the rollout's last step in the plain CPU loop), and
computed at learning time otherwise; and exploration decays over env steps, not updates, like
edgerl's DQN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import AgentConfig, Config, PerfConfig, PQNConfig
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.hw.device import resolve_amp
from edgerl.learners.nets import NatureCNN
from edgerl.learners.shared import (
    FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP,
    LossMeter,
    anneal_lr,
    autocast,
    epsilon_at,
)
from edgerl.memories.rollout import RolloutBuffer, lambda_returns

VALUE_CHUNK = 256  # observations per no-grad forward pass when computing greedy values


class PQN:
    """The network, its optimizer and the schedules of learning, one rollout at a time.

    ``num_envs`` environments make a rollout of ``pqn.rollout_steps`` vector steps; one unit of
    learning (:meth:`learn`) is one rollout's epochs.
    """

    kind = "pqn"

    def __init__(
        self,
        q_net: nn.Module,
        cfg: AgentConfig,
        pqn: PQNConfig,
        num_envs: int,
        device: torch.device,
        perf: PerfConfig | None = None,
        total_steps: int = 0,
        seed: int = 0,
    ) -> None:
        perf = perf or PerfConfig(amp="off", cuda_graphs="off", compile="off")
        self.cfg = cfg
        self.pqn = pqn
        self.device = device
        self.total_steps = total_steps
        if isinstance(q_net, NatureCNN):
            q_net.use_channels_last()
        self.q = q_net.to(device)
        self.amp = resolve_amp(perf.amp, device, frames=isinstance(q_net, NatureCNN))
        self.optimizer = torch.optim.RAdam(self.q.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.losses = LossMeter(device)
        self.cuda_graphs = False  # minibatches of hundreds: launches are not what limits
        self.per_launch = 1
        self.steps_per_unit = pqn.rollout_steps * num_envs
        self.updates = 0  # gradient updates (minibatches)
        self.rollouts = 0  # rollouts learned from
        # (step, rollouts) a session counts from: its first rollout starts at its first step.
        self.learn_from = (0, 0)
        self.generator = torch.Generator().manual_seed(seed)  # minibatch order, on the CPU

    def describe(self) -> str:
        layout = "channels_last" if getattr(self.q, "channels_last", False) else "mlp"
        parts = [self.device.type, "PQN", layout]
        if self.amp is not None:
            parts.append(f"amp {str(self.amp).removeprefix('torch.')}")
        return ", ".join(parts)

    # -- schedules ------------------------------------------------------------------------------

    def epsilon(self, step: int) -> float:
        """Exploration at ``step``: linear from eps_start to eps_end over eps_decay_steps (a
        rollout learner learns from its first rollout on: nothing to wait for)."""
        return epsilon_at(self.cfg, step, self.learn_from[0])

    def owed(self, step: int) -> int:
        """Rollouts complete at env step ``step`` and not learned from yet."""
        start_step, start_rollouts = self.learn_from
        done = start_rollouts + max(0, step - start_step) // self.steps_per_unit
        return done - self.rollouts

    def resume_at(self, step: int, refill: int = 0) -> None:
        """Continue a resumed run at ``step``: the first rollout starts there (``refill`` is
        a replay's business, not PQN's)."""
        self.learn_from = (step, self.rollouts)

    # -- learning -------------------------------------------------------------------------------

    def learn(self, memory: RolloutBuffer, step: int, n: int = 1) -> None:
        """Learn from the full rollout in ``memory`` (``n`` is 1: one rollout at a time) and
        clear it for the next."""
        for _ in range(n):
            self._learn_rollout(memory, step)

    def _learn_rollout(self, memory: RolloutBuffer, step: int) -> None:
        if not memory.full:
            raise ValueError("PQN learns from a full rollout")
        a, p = self.cfg, self.pqn
        anneal_lr(self.optimizer, a, self.total_steps, step)
        steps, envs = memory.steps, memory.num_envs
        with torch.no_grad():
            next_values = self._next_values(memory)
            for t, rows, final in memory.finals:
                next_values[t, rows] = self._greedy_values(final)
            returns = lambda_returns(
                memory.rewards,
                memory.terminated,
                memory.truncated,
                next_values,
                a.gamma,
                p.lam,
            ).flatten()
        obs = memory.obs[:steps].flatten(0, 1)
        actions = memory.actions.flatten()
        total = steps * envs
        size = max(1, total // p.minibatches)
        for _ in range(p.epochs):
            order = torch.randperm(total, generator=self.generator).to(self.device)
            for start in range(0, total - size + 1, size):
                rows = order[start : start + size]
                self.losses.add(self._update(obs[rows], actions[rows], returns[rows]))
                self.updates += 1
        memory.clear()
        self.rollouts += 1

    def _next_values(self, memory: RolloutBuffer) -> torch.Tensor:
        """max_a Q of every transition's next observation, (steps, envs): those the actor noted
        with the current weights (:meth:`RolloutBuffer.note_values`) as they are, the rest
        computed here."""
        known = memory.values_version[1:] == self.updates
        if not known.any():
            steps, envs = memory.steps, memory.num_envs
            return self._greedy_values(memory.obs[1:].flatten(0, 1)).view(steps, envs)
        next_values = memory.values[1:].clone()
        for t in np.flatnonzero(~known):  # usually the last: the actor acts on it after learning
            next_values[t] = self._greedy_values(memory.obs[t + 1])
        return next_values

    def _greedy_values(self, obs: torch.Tensor) -> torch.Tensor:
        """max_a Q(obs, a), in chunks (no gradient)."""
        out = [
            self.q(obs[i : i + VALUE_CHUNK]).float().max(dim=1).values
            for i in range(0, len(obs), VALUE_CHUNK)
        ]
        return torch.cat(out)

    def _update(self, obs: torch.Tensor, actions: torch.Tensor, returns: torch.Tensor) -> Any:
        """One gradient step: mean squared error of Q(s, a) against the Q(lambda) return."""
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.device, self.amp):
            q_taken = self.q(obs).float().gather(1, actions.unsqueeze(1)).squeeze(1)
            loss = F.mse_loss(q_taken, returns)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.q.parameters(), self.cfg.grad_clip, foreach=True)
        self.optimizer.step()
        return loss.detach()

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            POLICY_KEY: self.q.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "rollouts": self.rollouts,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state[POLICY_KEY])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.rollouts = int(state["rollouts"])
        self.generator.set_state(state["generator"])


def build(net: nn.Module, cfg: Config, device: torch.device) -> PQN:
    """The learner ``agent.algo = "pqn"`` names, around ``net`` (fresh, with LayerNorm: the
    registry says so); the registry's hook. Its minibatch order draws from a generator of its
    own, seeded from ``env.seed``."""
    n = cfg.env.num_envs
    return PQN(net, cfg.agent, cfg.pqn, n, device, cfg.perf, cfg.train.steps, cfg.env.seed + 1)


def forwards_per_env_step(cfg: Config, values_reused: bool) -> dict[str, float]:
    """What one env step costs in forward-pass equivalents (see
    :func:`edgerl.measure.compute.forwards_per_env_step`): the greedy values of the next
    observations (only each rollout's last when the actor's are reused) and ``pqn.epochs``
    gradient steps over it."""
    values = 1.0 / cfg.pqn.rollout_steps if values_reused else 1.0
    gradients = cfg.pqn.epochs * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
    return {"act": 1.0, "values": values, "targets": 0.0, "gradients": gradients}


def forwards_per_update(cfg: Config) -> float:
    """Forward-pass equivalents of one minibatch update, its share of computing the rollout's
    values included (the bench's learner-alone measurement reuses none)."""
    batch = cfg.pqn.rollout_steps * cfg.env.num_envs // cfg.pqn.minibatches
    values = forwards_per_env_step(cfg, values_reused=False)["values"]
    return batch * (values / cfg.pqn.epochs + FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP)
