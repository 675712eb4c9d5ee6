"""Soft Actor-Critic (Haarnoja et al. 2018) for games whose actions are numbers: a squashed
Gaussian policy, twin critics with slowly following targets, and the entropy's temperature
tuned towards a target entropy. The details follow CleanRL's ``sac_continuous_action.py``:

* the policy: an MLP with a mean and a log-std head, the log-std squashed into [-5, 2] by a
  tanh; an action is ``tanh(mean + std * noise)`` scaled to the game's bounds, its
  log-probability corrected for the tanh and the scale;
* the critics: two MLPs of (observation, action), each learning towards
  ``r + gamma * (min of the two targets' Q(s', a') - alpha * log pi(a'|s'))`` with ``a'`` drawn
  from the policy at ``s'``, the targets following by ``sac.tau`` after every update;
* the policy and the temperature: ``sac.policy_frequency`` updates of each after every
  ``sac.policy_frequency`` critic updates (TD3's delay, made up in number), the policy towards
  ``alpha * log pi - min Q``, the temperature towards the target entropy ``-numbers``.

Where edgerl's preset differs from the reference: the policy's learning rate follows
``agent.lr_end`` (the vector preset's 1e-5 unless set: annealed over ``train.steps``; the
reference keeps it constant, ``--set agent.lr_end=-1``), and the temperature starts at
``sac.alpha`` (0.2) where the reference, tuning it, starts at 1; the runs on record used both.

A unit of learning is one critic update, made every ``agent.train_freq`` env steps once
``agent.learning_starts`` steps have been taken with uniformly random actions (the learner's
epsilon is 1 until then, 0 after: its exploration is the policy's own noise). The policy
network that checkpoints keep, ``edgerl play`` plays and export writes outputs the greedy
action, ``tanh(mean)`` scaled to the bounds; acting samples from the same network's mean and
log-std (:class:`TanhGaussian`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from edgerl.config import Config
from edgerl.config.sections import AgentConfig, SACConfig
from edgerl.envs import EnvSpec, random_actions
from edgerl.errors import EnvError
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.hw.device import indexed
from edgerl.learners.dqn import Sampler, make_adam
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import hidden_layers
from edgerl.learners.shared import (
    FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP,
    LossMeter,
    anneal_lr,
    loadable_optimizer_state,
)
from edgerl.memories.replay.sampling import Batch

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # CleanRL's bounds of the policy's log-std
TANH_EPS = 1e-6  # keeps log(1 - tanh^2) finite where the tanh saturates


class SquashedGaussian(nn.Module):
    """SAC's policy network for a game of ``spec`` (vector observations, continuous actions):
    called, the greedy action of each observation (``tanh(mean)`` within the bounds), what
    play and export use; :meth:`stats` gives the mean and log-std acting and learning sample
    from."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.game = spec  # what acting needs of it: its actions' numbers and bounds
        inputs = math.prod(spec.obs_shape)
        self.trunk, width = hidden_layers(inputs, hidden)
        self.mean = nn.Linear(width, spec.num_actions)
        self.log_std = nn.Linear(width, spec.num_actions)
        low = torch.tensor(spec.action_low, dtype=torch.float32)
        high = torch.tensor(spec.action_high, dtype=torch.float32)
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    def stats(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each observation's Gaussian before the tanh: its mean and log-std."""
        h = self.trunk(obs.float().flatten(1))
        squashed = torch.tanh(self.log_std(h))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (squashed + 1)
        return self.mean(h), log_std

    def squash(self, x: torch.Tensor) -> torch.Tensor:
        """The action of a Gaussian draw ``x``: its tanh, scaled to the bounds."""
        return torch.tanh(x) * self.scale + self.bias

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.squash(self.stats(obs)[0])

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action of each observation and its log-probability."""
        mean, log_std = self.stats(obs)
        std = log_std.exp()
        x = mean + std * torch.randn_like(mean)
        y = torch.tanh(x)
        gaussian = -0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
        logp = gaussian - torch.log(self.scale * (1 - y.pow(2)) + TANH_EPS)
        return y * self.scale + self.bias, logp.sum(dim=1)


class MeanAndLogStd(nn.Module):
    """What the actor runs for :class:`TanhGaussian`: the policy's mean and log-std side by
    side, ``(n, 2 * numbers)``."""

    def __init__(self, policy: SquashedGaussian) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.policy.stats(obs), dim=1)


class TanhGaussian:
    """SAC's acting policy: each row's action ``tanh(mean + std * noise)`` scaled to the
    bounds, the noise standard normal numbers drawn on the host (a seeded run repeats, and a
    CUDA graph draws nothing); at epsilon 1 (before learning starts) uniformly random actions
    within the bounds, with no forward pass. The viewer's figures are the greedy action."""

    per_env = False
    extras: tuple[str, ...] = ()
    noise_dtype = "float32"

    def __init__(self, net: MeanAndLogStd, spec: EnvSpec) -> None:
        self.net = net
        self.spec = spec
        self.num_actions = spec.num_actions
        self.action_shape = spec.action_shape
        self.noise_shape = spec.action_shape

    def draw(self, epsilon: float | np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        if not self.needs_forward(epsilon):
            return random_actions(self.spec, n, rng)
        return rng.standard_normal((n, *self.noise_shape), dtype=np.float32)

    def needs_forward(self, epsilon: float | np.ndarray) -> bool:
        return bool(np.any(np.asarray(epsilon) < 1.0))

    def choose(self, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        mean, log_std = out.float().chunk(2, dim=1)
        return self.net.policy.squash(mean + log_std.exp() * noise)

    def per_action(self, out: torch.Tensor) -> torch.Tensor:
        mean, _ = out.float().chunk(2, dim=1)
        return self.net.policy.squash(mean)


class Critic(nn.Module):
    """Q(s, a): an MLP of the observation and the action side by side."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.trunk, width = hidden_layers(math.prod(spec.obs_shape) + spec.num_actions, hidden)
        self.out = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat((obs.float().flatten(1), actions.float()), dim=1)
        return self.out(self.trunk(x)).squeeze(1)


class SAC:
    """The policy, twin critics and their targets, the temperature, their optimizers and the
    schedules of learning. A :class:`~edgerl.learners.Learner` whose unit of learning is one
    critic update (the policy's and temperature's follow, see the module docstring)."""

    kind = "sac"

    def __init__(
        self,
        policy: SquashedGaussian,
        spec: EnvSpec,
        cfg: AgentConfig,
        sac: SACConfig,
        device: torch.device,
        total_steps: int = 0,
    ) -> None:
        self.cfg, self.sac = cfg, sac
        self.device = indexed(device)
        self.total_steps = total_steps
        self.q = policy.to(device)  # the policy network, as the interface names it
        self._policy = TanhGaussian(MeanAndLogStd(self.q), spec)
        hidden = tuple(cfg.hidden)
        self.critics = nn.ModuleList([Critic(spec, hidden), Critic(spec, hidden)]).to(device)
        self.targets = copy.deepcopy(self.critics).eval()
        self.targets.requires_grad_(False)
        self.policy_optimizer = make_adam(self.q, cfg.lr, eps=cfg.adam_eps)
        self.critic_optimizer = make_adam(self.critics, sac.q_lr, eps=cfg.adam_eps)
        self.log_alpha = torch.tensor(math.log(sac.alpha), device=device, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=sac.q_lr, eps=cfg.adam_eps)
        self.target_entropy = -float(spec.num_actions)
        self.losses = LossMeter(device)
        self._policy_loss: torch.Tensor | None = None  # read as a number by figures() only
        self.per_launch = 1
        self.cuda_graphs = False
        self.steps_per_unit = cfg.train_freq
        self.updates = 0
        self.learn_from = (cfg.learning_starts, 0)

    def describe(self) -> str:
        temperature = "tuned" if self.sac.autotune else "fixed"
        return f"{self.device.type}, mlp, temperature {temperature}"

    # -- schedules ------------------------------------------------------------------------------

    @property
    def policy(self) -> TanhGaussian:
        """The squashed Gaussian on the policy network, for every environment."""
        return self._policy

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def figures(self) -> dict[str, float]:
        """The temperature and the policy's last loss (NaN before its first update)."""
        loss = math.nan if self._policy_loss is None else float(self._policy_loss)
        return {"alpha": self.alpha, "policy_loss": loss}

    def epsilon(self, step: int) -> float:
        """1 (uniformly random actions) until learning starts, then 0: the policy's noise."""
        return 1.0 if step < self.learn_from[0] else 0.0

    def owed(self, step: int, memory: Any = None) -> int:
        """Critic updates due at ``step`` and not made yet (one per ``agent.train_freq``)."""
        start_step, start_updates = self.learn_from
        if step < start_step:
            return 0
        return start_updates + (step - start_step) // self.cfg.train_freq - self.updates

    def resume_at(self, step: int, refill: int) -> None:
        """Continue a resumed run at ``step``: random actions and no learning for ``refill``
        steps (0 when the replay was restored), never before ``agent.learning_starts``."""
        self.learn_from = (max(step + refill, self.cfg.learning_starts), self.updates)

    # -- learning -------------------------------------------------------------------------------

    def learn(self, replay: Sampler, step: int, n: int = 1) -> None:
        """Make ``n`` critic updates at env step ``step``, each with the policy's and the
        temperature's updates and the targets' step that follow it."""
        anneal_lr(self.policy_optimizer, self.cfg, self.total_steps, step)
        every = self.sac.policy_frequency
        for _ in range(n):
            batch = replay.sample(self.cfg.batch_size)
            self.losses.add(self.update_critics(batch), 1)
            self.updates += 1
            if self.updates % every == 0:
                for _ in range(every):
                    self.update_policy(batch)
            self.follow_targets()

    def update_critics(self, b: Batch) -> torch.Tensor:
        """One step of both critics towards the soft Bellman target; returns the loss."""
        weights = b.weights / b.weights.sum().clamp(min=1.0)
        with torch.no_grad():
            next_actions, next_logp = self.q.sample(b.next_obs)
            t1, t2 = (t(b.next_obs, next_actions) for t in self.targets)
            soft = torch.min(t1, t2) - self.log_alpha.exp() * next_logp
            target = b.rewards + b.discounts * soft
        q1, q2 = (c(b.obs, b.actions) for c in self.critics)
        errors = (q1 - target).pow(2) + (q2 - target).pow(2)
        loss = (errors * weights).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._clip(self.critics)
        self.critic_optimizer.step()
        return loss.detach()

    def update_policy(self, b: Batch) -> None:
        """One step of the policy towards ``alpha * log pi - min Q`` and, with
        ``sac.autotune``, one of the temperature towards the target entropy."""
        weights = b.weights / b.weights.sum().clamp(min=1.0)
        actions, logp = self.q.sample(b.obs)
        self.critics.requires_grad_(False)  # the policy's loss goes through them, not into them
        try:
            q1, q2 = (c(b.obs, actions) for c in self.critics)
            alpha = self.log_alpha.detach().exp()
            loss = ((alpha * logp - torch.min(q1, q2)) * weights).sum()
            self.policy_optimizer.zero_grad(set_to_none=True)
            loss.backward()
        finally:
            self.critics.requires_grad_(True)
        self._clip(self.q)
        self.policy_optimizer.step()
        self._policy_loss = loss.detach()  # no wait for the device here
        if self.sac.autotune:
            entropy_gap = (logp.detach() + self.target_entropy) * weights
            alpha_loss = -(self.log_alpha.exp() * entropy_gap).sum()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()

    def follow_targets(self) -> None:
        """Move each target critic ``sac.tau`` of the way to its critic."""
        with torch.no_grad():
            online = list(self.critics.parameters())
            torch._foreach_lerp_(list(self.targets.parameters()), online, self.sac.tau)

    def _clip(self, module: nn.Module) -> None:
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(module.parameters(), self.cfg.grad_clip, foreach=True)

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            POLICY_KEY: self.q.state_dict(),
            "critics": self.critics.state_dict(),
            "targets": self.targets.state_dict(),
            "log_alpha": self.log_alpha.detach().cpu(),
            "policy_optimizer": self.policy_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": self.alpha_optimizer.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state[POLICY_KEY])
        self.critics.load_state_dict(state["critics"])
        self.targets.load_state_dict(state["targets"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        for name, optimizer in (
            ("policy_optimizer", self.policy_optimizer),
            ("critic_optimizer", self.critic_optimizer),
            ("alpha_optimizer", self.alpha_optimizer),
        ):
            optimizer.load_state_dict(loadable_optimizer_state(state[name], optimizer, self.device))
        self.updates = int(state["updates"])


class SACKind(Basics):
    """SAC's kind (its registry line's ``KIND``): a squashed Gaussian policy network for games
    whose actions are numbers and whose observations are vectors, acting by sampling it,
    evaluated and played greedily (its mean)."""

    continuous_actions = True

    def refuse_game(self, spec: EnvSpec, algo: str) -> None:
        """Raise EnvError (one sentence) for a game of discrete actions or of frames."""
        if not spec.continuous:
            raise EnvError(
                f"agent.algo={algo} learns actions that are numbers, and '{spec.id}' has "
                f"{spec.num_actions} discrete ones: use dqn, pqn or ppo for it, or a game of "
                "continuous actions (Pendulum-v1, a MuJoCo task such as HalfCheetah-v5)"
            )
        if spec.has_frames:
            raise EnvError(
                f"agent.algo={algo} learns from observations that are vectors, and "
                f"'{spec.id}' shows frames: train it with agent.algo=ppo, or train {algo} on "
                "a game with vector observations (Pendulum-v1, a MuJoCo task)"
            )

    def network(self, spec: EnvSpec, hidden: tuple[int, ...]) -> nn.Module:
        self.refuse_game(spec, "sac")
        return SquashedGaussian(spec, hidden)

    def acting_policy(self, net: nn.Module) -> TanhGaussian:
        assert isinstance(net, SquashedGaussian)
        return TanhGaussian(MeanAndLogStd(net), net.game)

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> SAC:
        assert isinstance(net, SquashedGaussian)
        return SAC(net, net.game, cfg.agent, cfg.sac, device, total_steps=cfg.train.steps)

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """Its share of the updates, each ``batch_size`` transitions: the targets (the policy
        at s' and two target critics), the critics' gradient step (two networks) and, on
        average one per critic update, the policy's (the policy and two critics)."""
        per_update = cfg.agent.batch_size / cfg.agent.train_freq
        gradients = per_update * 5 * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
        return {"act": 1.0, "values": 0.0, "targets": per_update * 3, "gradients": gradients}

    def forwards_per_update(self, cfg: Config) -> float:
        fwd = self.forwards_per_env_step(cfg, values_reused=False)
        return (fwd["targets"] + fwd["gradients"]) * cfg.agent.train_freq


KIND = SACKind()
