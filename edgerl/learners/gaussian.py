"""PPO's policy for games whose actions are numbers: a Gaussian head with a state-independent
log-std, and the observation and reward normalisation of CleanRL's ``ppo_continuous_action.py``.

* :class:`GaussianPolicy`, the policy network: observations normalised by running statistics
  it keeps as buffers (so a checkpoint, ``edgerl play`` and an exported file normalise as
  training did) and clipped to +-10, a tanh MLP, the action's mean; a log-std per number that
  no observation changes. Called, it gives the greedy action, the mean within the bounds.
  For a game that shows frames (CarRacing-v3's steering, gas and brake) the mean comes from
  the Nature CNN instead (:class:`~edgerl.learners.nets.NatureCNN`: its 512 features, its
  output layer one number per action), the frames scaled to [0, 1] as every learner's are
  and not normalised, as in PPO's Atari reference.
* :class:`GaussianPolicyAndValue`, what the actor runs: the mean, the log-std and the value of
  each observation, the value a tanh MLP of its own on the same normalised observations (on
  frames, a head on the CNN's features: one pass for both, as PPO's Atari reference).
* :class:`GaussianSampling`, the acting policy: ``mean + std * noise`` with standard normal noise
  drawn on the host, its log-probability and the value as extras. The action is not clipped
  here: the game's environment clips what it is sent, and the rollout keeps the sample, whose
  log-probability the ratio needs.
* :class:`RewardScale`: each environment's discounted return summed, the rewards learned from
  divided by the running standard deviation of those returns and clipped to +-10, after the
  reference's ``NormalizeReward``.

Where edgerl differs from the reference: the observation statistics take in a rollout's
observations once it has been learned (the reference takes in each observation as it comes), so
that a rollout is learned with the statistics it was acted with and the probability ratio starts
at 1; the reward scale is applied when a rollout is learned, step by step in the order the steps
were taken, as the reference applies it as they come; it keeps one variance over every
environment's returns (the reference wraps each environment, with a variance of its own) and
starts a return again where an episode ends, truncated too (the reference's gymnasium wrapper
only where it terminates).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from edgerl.envs import EnvSpec
from edgerl.learners.nets import NatureCNN, hidden_layers, output_layer

OBS_CLIP = REWARD_CLIP = 10.0  # the reference's TransformObservation / TransformReward clips
NORM_EPS = 1e-8


def tanh_mlp(inputs: int, outputs: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """Linear layers of widths ``hidden`` with tanh after each (the reference's), then one to
    ``outputs``."""
    trunk, width = hidden_layers(inputs, hidden, nn.Tanh)
    return nn.Sequential(*trunk, nn.Linear(width, outputs))


class RunningNorm(nn.Module):
    """Running mean and variance of observations (Chan et al.'s parallel update, as gymnasium's
    ``NormalizeObservation``), kept as buffers; ``on`` False leaves observations as they are
    (and the statistics unused)."""

    def __init__(self, size: int, on: bool) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))
        self.register_buffer("on", torch.tensor(on))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float().flatten(1)
        if not bool(self.on):
            return x
        scaled = (x - self.mean.float()) / torch.sqrt(self.var.float() + NORM_EPS)
        return scaled.clamp(-OBS_CLIP, OBS_CLIP)

    @torch.no_grad()
    def take_in(self, obs: torch.Tensor) -> None:
        """Add a batch of observations ``(n, *shape)`` to the statistics."""
        x = obs.double().flatten(1)
        n = float(x.shape[0])
        mean, var = x.mean(dim=0), x.var(dim=0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta.pow(2) * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.copy_(total)


class GaussianPolicy(nn.Module):
    """PPO's policy network for a game of ``spec`` (continuous actions; vector observations or
    frames); see the module docstring. ``normalize`` turns the observation statistics on (for
    vectors: frames are scaled, never normalised)."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...], normalize: bool = False) -> None:
        super().__init__()
        self.game = spec  # what acting needs of it: its actions' numbers
        self.frames = spec.has_frames
        if self.frames:
            self.cnn = NatureCNN(spec.obs_shape[0], spec.num_actions)  # its last layer: the mean
        else:
            inputs = math.prod(spec.obs_shape)
            self.norm = RunningNorm(inputs, normalize)
            self.mean = tanh_mlp(inputs, spec.num_actions, hidden)
        self.log_std = nn.Parameter(torch.zeros(spec.num_actions))
        self.register_buffer("low", torch.tensor(spec.action_low, dtype=torch.float32))
        self.register_buffer("high", torch.tensor(spec.action_high, dtype=torch.float32))
        self.input_dtype = torch.float32

    @property
    def channels_last(self) -> bool:
        """Whether its convolutions keep their weights NHWC (never, on vectors)."""
        return self.frames and self.cnn.channels_last

    def use_channels_last(self, enabled: bool = True) -> GaussianPolicy:
        """The CNN's fast convolution layout, or not (nothing to do on vectors)."""
        if self.frames:
            self.cnn.use_channels_last(enabled)
        return self

    def normalizes(self, on: bool) -> None:
        """Normalise observations by the running statistics from now on, or not (vectors)."""
        if not self.frames:
            self.norm.on.fill_(on)

    def take_in(self, obs: torch.Tensor) -> None:
        """Add a batch of observations to the statistics (vectors; frames keep none)."""
        if not self.frames:
            self.norm.take_in(obs)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """What the mean (and the value) is computed from: the normalised observations, or the
        CNN's 512 features of a frame stack."""
        return self.cnn.hidden(obs) if self.frames else self.norm(obs)

    def mean_of(self, features: torch.Tensor) -> torch.Tensor:
        """Each number's mean, not yet within the bounds."""
        if self.frames:
            return output_layer(self.cnn.last, features)
        return self.mean(features)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean = self.mean_of(self.features(obs))
        return torch.maximum(torch.minimum(mean, self.high), self.low)


class GaussianPolicyAndValue(nn.Module):
    """What the actor runs: each observation's mean, log-std and value, ``(n, 2A + 1)`` (the
    value in the last column): on vectors an MLP of the policy's widths of its own, on frames a
    head on the policy's CNN features."""

    def __init__(self, policy: GaussianPolicy, value: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value = value

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.policy.features(obs)
        mean = self.policy.mean_of(x)
        log_std = self.policy.log_std.expand_as(mean)
        value = output_layer(self.value, x) if self.policy.frames else self.value(x)
        return torch.cat((mean.float(), log_std, value.float()), dim=1)


def gaussian_value_network(policy: GaussianPolicy) -> nn.Module:
    """The value's layers beside ``policy``: a linear head on the CNN's features for frames;
    for vectors an MLP of its widths, tanh, one output."""
    if policy.frames:
        return nn.Linear(policy.cnn.last.in_features, 1)
    linears = [m for m in policy.mean.modules() if isinstance(m, nn.Linear)]
    widths = tuple(m.out_features for m in linears[:-1])
    return tanh_mlp(linears[0].in_features, 1, widths)


def gaussian_terms(out: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability of each row's ``actions`` under the Gaussian of its ``out`` (a row
    of :class:`GaussianPolicyAndValue`), summed over the numbers, and its entropy."""
    mean, log_std = out[:, :-1].float().chunk(2, dim=1)
    z = (actions - mean) / log_std.exp()
    logp = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=1)
    entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(dim=1)
    return logp, entropy


class GaussianSampling:
    """PPO's acting policy for a continuous game (see the module docstring): no epsilon, the
    distribution's own noise explores."""

    per_env = False
    extras = ("value", "logp")
    noise_dtype = "float32"

    def __init__(self, net: GaussianPolicyAndValue, spec: EnvSpec) -> None:
        self.net = net
        self.num_actions = spec.num_actions
        self.action_shape = spec.action_shape
        self.noise_shape = spec.action_shape

    def draw(self, epsilon: float | np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal((n, *self.noise_shape), dtype=np.float32)

    def needs_forward(self, epsilon: float | np.ndarray) -> bool:
        return True

    def choose(self, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        out = out.float()
        mean, log_std = out[:, :-1].chunk(2, dim=1)
        actions = mean + log_std.exp() * noise
        logp, _ = gaussian_terms(out, actions)
        return torch.cat((actions, out[:, -1:], logp.unsqueeze(1)), dim=1)

    def per_action(self, out: torch.Tensor) -> torch.Tensor:
        """The mean action's numbers, within the bounds."""
        mean = out[:, :-1].float().chunk(2, dim=1)[0]
        policy = self.net.policy
        return torch.maximum(torch.minimum(mean, policy.high), policy.low)


class RewardScale:
    """The reference's reward normalisation for ``num_envs`` environments: each one's
    discounted return, and the running variance of those returns over every step."""

    def __init__(self, num_envs: int, gamma: float) -> None:
        self.gamma = gamma
        self.returns = torch.zeros(num_envs, dtype=torch.float64)
        self.norm = RunningNorm(1, True)

    @torch.no_grad()
    def __call__(
        self, rewards: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor
    ) -> torch.Tensor:
        """A rollout's rewards ``(T, N)`` as learned from: each step's divided by the standard
        deviation of the returns so far, that step's included, and clipped to +-10."""
        out = torch.empty_like(rewards)
        ended = (terminated | truncated).cpu()
        for t in range(rewards.shape[0]):
            self.returns = self.returns * self.gamma + rewards[t].double().cpu()
            self.norm.take_in(self.returns.unsqueeze(1))
            std = math.sqrt(float(self.norm.var[0]) + NORM_EPS)
            out[t] = (rewards[t] / std).clamp(-REWARD_CLIP, REWARD_CLIP)
            self.returns[ended[t]] = 0.0
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns.clone(), **self.norm.state_dict()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """The statistics a checkpoint kept; each environment's return too where the run
        resumes with as many environments (else they start again from 0)."""
        self.norm.load_state_dict({k: v for k, v in state.items() if k != "returns"})
        returns = state.get("returns")
        if isinstance(returns, torch.Tensor) and returns.shape == self.returns.shape:
            self.returns = returns.clone().double()
