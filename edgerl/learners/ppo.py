"""PPO: proximal policy optimisation with the clipped objective (Schulman et al. 2017, "Proximal
Policy Optimization Algorithms"; the Atari details as in CleanRL's ``ppo_atari.py``).

The learner that proves the seam (docs/development.md): it brings its own acting policy, which
samples each action from the policy's distribution instead of taking an argmax, and declares
what its rollout keeps beside each step (the value and the log-probability of the action taken,
:class:`Sampling`'s extras); the actor, the pipelines and the rollout run it without knowing it.

Many environments step together for ``ppo.rollout_steps`` steps; the learner then computes
generalised advantage estimates (GAE, lambda ``ppo.lam``) from the values its policy noted as
it acted, and makes ``ppo.epochs`` passes of ``ppo.minibatches`` minibatches: the clipped
probability-ratio objective against the log-probabilities noted, a value loss and an entropy
bonus, one Adam step each, the gradient clipped to ``agent.grad_clip``.

Its network is the Q-networks' shape (:mod:`edgerl.learners.nets`, no LayerNorm): the output
layer gives the actions' logits, so a checkpoint's policy, ``edgerl play`` and ``edgerl export``
take it as they take a Q-network (the greedy action is the most probable one); the value's layers
(:func:`value_network`) are the learner's own state.

Where this differs from the reference, and why: truncated episodes bootstrap from the value of
their final observation (edgerl's environments hand it out) instead of counting as ended; the
value of a rollout's newest observation, and of any step whose extras were not noted, comes from
the current weights at learning time. Learning beside the actor (the lagged pipeline, a GPU)
acts with weights one rollout old: the log-probabilities noted are those weights', so the
probability ratio measures the update from the policy that acted, as PPO's clipping requires.
Two of the reference's defaults are keys, off unless set (the frames preset sets both), so that
the runs on record before them repeat: the value loss clipped as the policy's
(``ppo.clip_value``, its ``clip_vloss``) and orthogonal initial weights (``ppo.orthogonal_init``,
its ``layer_init``). The learning rate anneals over ``ppo.anneal_steps`` (the reference's over
its whole run: ``train.steps`` where the key is 0). Its figures (:meth:`PPO.figures`, in
metrics.csv) are the reference's of each rollout: approx_kl, the fraction clipped and the
explained variance.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgerl.config import AgentConfig, Config, PerfConfig, PPOConfig
from edgerl.envs import EnvSpec
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.learners.gaussian import (
    GaussianPolicy,
    GaussianPolicyAndValue,
    GaussianSampling,
    RewardScale,
    gaussian_terms,
    gaussian_value_network,
)
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import MLP, NatureCNN, build_q_network, num_actions_of, output_layer
from edgerl.learners.pqn import minibatch_shape
from edgerl.learners.shared import (
    FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP,
    LossMeter,
    anneal_lr,
    loadable_optimizer_state,
    rollouts_owed,
    rows_of,
)
from edgerl.memories import Memory
from edgerl.memories.rollout import RolloutBuffer

log = logging.getLogger(__name__)

VALUE_CHUNK = 256  # observations per no-grad forward pass when computing values
# CleanRL's layer_init gains: ReLU layers, logits that start near uniform, a value at scale.
HIDDEN_GAIN, POLICY_GAIN, VALUE_GAIN = math.sqrt(2.0), 0.01, 1.0
FIGURES = ("approx_kl", "clip_fraction", "explained_variance")  # of the last rollout learned


class PolicyAndValue(nn.Module):
    """What PPO's actor runs: each observation's action logits and its value, ``(n, A + 1)``
    (the value in the last column). On frames the value is a head on the policy network's own
    features (one pass, as the Atari reference); on vectors it is a network of its own, the
    policy's shape (as the reference's CartPole: there, a shared one lets the value's error,
    tens of points, swamp the policy's gradient)."""

    def __init__(self, policy: nn.Module, value: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value = value
        self.shared = isinstance(value, nn.Linear)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        hidden = self.policy.hidden(obs)
        logits = output_layer(self.policy.last, hidden)
        value = output_layer(self.value, hidden) if self.shared else self.value(obs)
        return torch.cat((logits, value), dim=1)


def value_network(policy: nn.Module) -> nn.Module:
    """The value's layers beside ``policy``: a head on its features for the Nature CNN, an MLP
    of the policy's widths with one output for vectors."""
    if isinstance(policy, NatureCNN):
        return nn.Linear(policy.last.in_features, 1)
    linears = [m for m in policy.modules() if isinstance(m, nn.Linear)]
    widths = tuple(m.out_features for m in linears[:-1])
    return MLP(linears[0].in_features, 1, widths)


def categorical_terms(
    out: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability of each row's action id under the softmax of its logits (a row of
    :class:`PolicyAndValue`) and the softmax's entropy."""
    logp_all = torch.log_softmax(out[:, :-1].float(), dim=1)
    logp = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
    return logp, -(logp_all.exp() * logp_all).sum(dim=1)


def orthogonal_init(policy: nn.Module, value: nn.Module) -> None:
    """CleanRL's ``layer_init`` on ``policy`` and ``value`` (:func:`value_network`'s layers):
    orthogonal weights, gain sqrt(2) for every hidden layer (the convolutions too), 0.01 for the
    policy's output and 1 for the value's, biases 0. Drawn from torch's global generator, as
    the default initialisation is."""
    for net, gain in ((policy, POLICY_GAIN), (value, VALUE_GAIN)):
        layers = [m for m in net.modules() if isinstance(m, nn.Linear | nn.Conv2d)]
        for layer in layers:
            nn.init.orthogonal_(layer.weight, HIDDEN_GAIN if layer is not layers[-1] else gain)
            nn.init.zeros_(layer.bias)


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - Var(target - predicted) / Var(target)``, as the reference logs it: 1 where the
    values predict the returns, 0 where they do no better than the returns' mean, NaN where the
    returns do not vary."""
    spread = target.var(unbiased=False)
    unexplained = (target - predicted).var(unbiased=False) / spread
    return torch.where(spread > 0, 1.0 - unexplained, torch.full_like(spread, math.nan))


class Sampling:
    """PPO's acting policy: each row's action drawn from the softmax of its logits, by inverse
    CDF of a uniform number drawn on the host (so a seeded run repeats, and a CUDA graph draws
    nothing); its extras are the row's value and the log-probability of the action drawn.
    Exploration is the distribution's own: the trainer's epsilon is not used."""

    action_shape: tuple[int, ...] = ()  # an action id
    noise_dtype = "float32"
    noise_shape: tuple[int, ...] = ()
    per_env = False
    extras = ("value", "logp")

    def __init__(self, net: nn.Module, num_actions: int) -> None:
        self.net = net
        self.num_actions = num_actions

    def draw(self, epsilon: float | np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.random(n, dtype=np.float32)

    def needs_forward(self, epsilon: float | np.ndarray) -> bool:
        return True

    def choose(self, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(out[:, :-1].float(), dim=1)
        below = (logp.exp().cumsum(dim=1) < noise.unsqueeze(1)).sum(dim=1)
        actions = below.clamp(max=self.num_actions - 1)  # a sum a hair under 1
        taken = logp.gather(1, actions.unsqueeze(1)).squeeze(1)
        return torch.stack((actions.float(), out[:, -1].float(), taken), dim=1)

    def per_action(self, out: torch.Tensor) -> torch.Tensor:
        """The actions' probabilities."""
        return torch.softmax(out[:, :-1].float(), dim=1)


def gae(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalised advantage estimates of a rollout, (T, N) each (Schulman et al. 2016):
    ``delta_t = r_t + gamma * V(next_t) - V(s_t)`` (no bootstrap after a termination) summed
    with weights ``(gamma * lam)^k`` over the steps of the same episode: a termination or a
    truncation stops the sum (a truncated step bootstraps from its final observation's value,
    ``next_values[t]``)."""
    alive = 1.0 - terminated.float()
    goes_on = alive * (1.0 - truncated.float())
    deltas = rewards + gamma * alive * next_values - values
    advantages = torch.empty_like(rewards)
    following = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        following = deltas[t] + gamma * lam * goes_on[t] * following
        advantages[t] = following
    return advantages


class PPO:
    """The policy network, its value head, one Adam over both and the schedules of learning,
    one rollout at a time (a unit of learning is one rollout's epochs, as PQN's)."""

    kind = "ppo"

    def __init__(
        self,
        net: nn.Module,
        cfg: AgentConfig,
        ppo: PPOConfig,
        num_envs: int,
        device: torch.device,
        perf: PerfConfig | None = None,
        total_steps: int = 0,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.ppo = ppo
        self.device = device
        self.total_steps = total_steps
        self.anneal_steps = ppo.anneal_steps or total_steps  # the learning rate's horizon
        # A continuous game's: a Gaussian head, its observations and rewards maybe normalised
        self.gaussian = isinstance(net, GaussianPolicy)
        value_head = gaussian_value_network(net) if self.gaussian else value_network(net)
        if ppo.orthogonal_init:  # before channels-last: the weights as they are laid out
            orthogonal_init(net, value_head)
        if isinstance(net, NatureCNN | GaussianPolicy):
            net.use_channels_last()  # on frames: the convolutions' fast layout
        self.q = net.to(device)  # the policy: the actions' logits or mean (the name play reads)
        self.value_head = value_head.to(device)
        self.acting: nn.Module
        self._policy: Sampling | GaussianSampling
        self.reward_scale: RewardScale | None = None
        if isinstance(net, GaussianPolicy):
            net.normalizes(ppo.normalize_obs)
            self.acting = GaussianPolicyAndValue(net, self.value_head)
            self._policy = GaussianSampling(self.acting, net.game)
            if ppo.normalize_rewards:
                self.reward_scale = RewardScale(num_envs, cfg.gamma)
        else:
            self.acting = PolicyAndValue(self.q, self.value_head)
            self._policy = Sampling(self.acting, num_actions_of(net))
        self.terms = gaussian_terms if self.gaussian else categorical_terms
        # torch's Adam, as PPO's runs on record trained: with the fused kernel (make_adam) the
        # CartPole test's run played 394.9 on a 2-core AMD EPYC against the 450 asked, and with
        # this one it passes (tests/test_ppo.py): the fused step rounds the same sums otherwise.
        self.optimizer = torch.optim.Adam(self.acting.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.losses = LossMeter(device)
        self.per_launch = 1
        self.cuda_graphs = False  # the update stays eager (the actor may still capture its own)
        self.steps_per_unit = ppo.rollout_steps * num_envs
        self.updates = 0  # gradient updates (minibatches)
        self.rollouts = 0
        self.learn_from = (0, 0)
        self.generator = torch.Generator().manual_seed(seed)  # minibatch order, on the CPU
        self.recomputed = 0  # steps whose value or log-probability the actor had not noted
        self.last_rollout = dict.fromkeys(FIGURES, math.nan)  # its figures (none learned yet)

    def describe(self) -> str:
        layout = "channels_last" if getattr(self.q, "channels_last", False) else "mlp"
        return f"{self.device.type}, PPO, {layout}"

    def figures(self) -> dict[str, float]:
        """The last rollout's, as the reference logs them each update (NaN before the first):
        ``approx_kl``, the estimate ``mean((ratio - 1) - log ratio)`` of its last minibatch;
        ``clip_fraction``, the share of its steps whose ratio was outside the clip range, over
        all its minibatches; ``explained_variance`` of its returns by the values noted."""
        return dict(self.last_rollout)

    def epsilon(self, step: int) -> float:
        """0: the policy samples its actions (its entropy is its exploration)."""
        return 0.0

    @property
    def policy(self) -> Sampling | GaussianSampling:
        return self._policy

    def owed(self, step: int, memory: Memory | None = None) -> int:
        """Rollouts complete at env step ``step`` and not learned from yet."""
        return rollouts_owed(self.learn_from, self.rollouts, step, self.steps_per_unit)

    def resume_at(self, step: int, refill: int = 0) -> None:
        self.learn_from = (step, self.rollouts)

    # -- learning -------------------------------------------------------------------------------

    def learn(self, memory: RolloutBuffer, step: int, n: int = 1) -> None:
        for _ in range(n):
            self._learn_rollout(memory, step)

    def _learn_rollout(self, memory: RolloutBuffer, step: int) -> None:
        if not memory.full:
            raise ValueError("PPO learns from a full rollout")
        a, p = self.cfg, self.ppo
        anneal_lr(self.optimizer, a, self.anneal_steps, step)
        steps = memory.steps
        with torch.no_grad():
            values, logp = self._noted(memory)
            next_values = values[1:].clone()
            for t, rows, final in memory.finals:
                next_values[t, rows] = self._values(final)
            rewards = memory.rewards
            if self.reward_scale is not None:
                rewards = self.reward_scale(rewards, memory.terminated, memory.truncated)
            advantages = gae(
                rewards,
                memory.terminated,
                memory.truncated,
                values[:steps],
                next_values,
                a.gamma,
                p.lam,
            )
            returns = (advantages + values[:steps]).flatten()
            explained = explained_variance(values[:steps].flatten(), returns)
        batch = (
            memory.obs[:steps].flatten(0, 1),
            memory.actions.flatten(0, 1),  # ids (T * N,), or numbers (T * N, A)
            logp[:steps].flatten(),
            advantages.flatten(),
            returns,
            values[:steps].flatten(),
        )
        total = batch[1].shape[0]
        size, count = minibatch_shape(total, p.minibatches)
        clipped = torch.zeros((), device=self.device)
        for _ in range(p.epochs):
            order = torch.randperm(total, generator=self.generator).to(self.device)
            for i in range(count):
                rows = order[i * size : (i + 1) * size]
                loss, approx_kl, clip_fraction = self.update_step(rows_of(batch, rows))
                self.losses.add(loss)
                clipped += clip_fraction
                self.updates += 1
        figures = torch.stack((approx_kl, clipped / (p.epochs * count), explained)).tolist()
        self.last_rollout = dict(zip(FIGURES, figures, strict=True))  # one wait a rollout
        if self.gaussian:  # after learning: the next rollout acts and learns with the same
            self.q.take_in(memory.obs[:steps].flatten(0, 1))
        memory.clear()
        self.rollouts += 1

    def _noted(self, memory: RolloutBuffer) -> tuple[torch.Tensor, torch.Tensor]:
        """The values of every observation of the rollout, (steps + 1, envs), and the
        log-probabilities of every action taken, (steps, envs): as the actor noted them, and
        from the current weights where it did not (the newest observation, acted on after
        this learning; a step noted by no one)."""
        noted = memory.values_version >= 0
        values = memory.extra("value").clone()
        logp = memory.extra("logp").clone()
        for t in np.flatnonzero(~noted):
            out = self._forward_chunks(memory.obs[t])
            values[t] = out[:, -1]
            if t < memory.steps:
                logp[t] = self.terms(out, memory.actions[t])[0]
                self.recomputed += memory.num_envs
        return values, logp

    def _forward_chunks(self, obs: torch.Tensor) -> torch.Tensor:
        out = [
            self.acting(obs[i : i + VALUE_CHUNK]).float() for i in range(0, len(obs), VALUE_CHUNK)
        ]
        return torch.cat(out)

    def _values(self, obs: torch.Tensor) -> torch.Tensor:
        return self._forward_chunks(obs)[:, -1]

    def update_step(
        self, batch: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One Adam step on a minibatch (observations, actions, log-probabilities noted,
        advantages, returns, values noted): the clipped surrogate, half the squared value error
        (with ``ppo.clip_value``, the larger of it and the error of the value clipped to within
        ``ppo.clip`` of the one noted) weighted ``ppo.vf_coef``, minus the entropy weighted
        ``ppo.ent_coef``. Returns the detached loss and, before the step, the reference's
        approx_kl and the fraction of ratios outside the clip range (tensors: no wait)."""
        obs, actions, old_logp, advantages, returns, old_values = batch
        p = self.ppo
        out = self.acting(obs).float()
        logp, entropies = self.terms(out, actions)
        entropy = entropies.mean()
        if len(advantages) > 1:  # normalised per minibatch, as the reference does
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        log_ratio = logp - old_logp
        ratio = torch.exp(log_ratio)
        clipped = torch.clamp(ratio, 1.0 - p.clip, 1.0 + p.clip)
        policy_loss = -torch.min(ratio * advantages, clipped * advantages).mean()
        value = out[:, -1]
        if p.clip_value:  # the reference's clip_vloss
            moved = old_values + torch.clamp(value - old_values, -p.clip, p.clip)
            worse = torch.max((value - returns) ** 2, (moved - returns) ** 2)
            value_loss = 0.5 * worse.mean()
        else:
            value_loss = 0.5 * F.mse_loss(value, returns)
        loss = policy_loss + p.vf_coef * value_loss - p.ent_coef * entropy
        with torch.no_grad():
            approx_kl = ((ratio - 1.0) - log_ratio).mean()
            clip_fraction = ((ratio - 1.0).abs() > p.clip).float().mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.acting.parameters(), self.cfg.grad_clip, foreach=True)
        self.optimizer.step()
        return loss.detach(), approx_kl, clip_fraction

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        scale = {} if self.reward_scale is None else {"reward_scale": self.reward_scale}
        return {
            **{k: v.state_dict() for k, v in scale.items()},
            POLICY_KEY: self.q.state_dict(),
            "value_head": self.value_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "rollouts": self.rollouts,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state[POLICY_KEY])
        self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(
            loadable_optimizer_state(state["optimizer"], self.optimizer, self.device)
        )
        self.updates = int(state["updates"])
        self.rollouts = int(state["rollouts"])
        self.generator.set_state(state["generator"])
        if self.reward_scale is not None and "reward_scale" in state:
            self.reward_scale.load_state_dict(state["reward_scale"])


class PPOKind(Basics):
    """PPO's kind (its registry line's ``KIND``): a Q-network's shape whose outputs are the
    actions' logits, acting by sampling them (with a value head of its own beside), and
    evaluated and played by sampling them too; for a game whose actions are numbers, a
    Gaussian head (:mod:`edgerl.learners.gaussian`), played by its mean."""

    samples_when_played = True
    continuous_actions = True

    def network(self, spec: EnvSpec, hidden: tuple[int, ...]) -> nn.Module:
        """The Q-networks' shape (logits); a Gaussian policy for a continuous game."""
        if spec.continuous:
            return GaussianPolicy(spec, hidden)
        return build_q_network(spec, hidden)

    def acting_policy(self, net: nn.Module) -> Sampling | GaussianSampling:
        """Actions sampled from ``net``'s logits (or its Gaussian), with a fresh value network
        beside it."""
        if isinstance(net, GaussianPolicy):
            value = gaussian_value_network(net)
            return GaussianSampling(GaussianPolicyAndValue(net, value), net.game)
        return Sampling(PolicyAndValue(net, value_network(net)), num_actions_of(net))

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> PPO:
        """Around ``net`` (fresh, the policy network); its minibatch order draws from a
        generator seeded from ``env.seed``."""
        n = cfg.env.num_envs
        return PPO(net, cfg.agent, cfg.ppo, n, device, cfg.perf, cfg.train.steps, cfg.env.seed + 1)

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """The actor's pass (logits and value together; the newest observation's value once a
        rollout) and ``ppo.epochs`` gradient steps over it."""
        gradients = cfg.ppo.epochs * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP
        return {
            "act": 1.0,
            "values": 1.0 / cfg.ppo.rollout_steps,
            "targets": 0.0,
            "gradients": gradients,
        }

    def forwards_per_update(self, cfg: Config) -> float:
        """One minibatch update."""
        batch = cfg.ppo.rollout_steps * cfg.env.num_envs // cfg.ppo.minibatches
        return batch * FORWARD_EQUIVALENTS_OF_A_GRADIENT_STEP


KIND = PPOKind()
