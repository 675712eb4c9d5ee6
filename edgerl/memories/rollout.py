"""A rollout learner's memory (PQN's, PPO's): the last ``rollout_steps`` vector steps of every
environment (``pqn.rollout_steps``, ``ppo.rollout_steps``), nothing older.

It takes the same writes as the replay (:meth:`add_first` after a reset, :meth:`add` after each
vector step), so the training loop does not know which learner it feeds. Observations are kept
whole (frame stacks), on the learner's device: a rollout of Pong at 128 environments and 32 steps
is 116 MB, against 7 GB for a DQN replay of a million transitions. Actions are kept as the
learner chose them: int64 for a discrete game, a continuous game's float32 numbers
(``actions`` is ``(steps, envs, *spec.action_shape)``), before the environment clipped them.

Beside each observation it keeps what the learner's acting policy said of it when it acted on it
(:meth:`RolloutBuffer.note_extras`): PQN's greedy values, PPO's values and the log-probabilities
of the actions taken, whatever names the policy declares; it stores them without knowing the
algorithm. Once full, the learner computes its returns from it (PQN: :func:`lambda_returns`) and
learns; :meth:`clear` then starts the next rollout from the newest observations. Where the
learner learns one rollout while the next is collected (:mod:`edgerl.run.lagged`),
:meth:`take_full` hands the full rollout over and goes on writing into a second set of tensors:
twice the memory, and the learner's rollout never changes under it.
"""

from __future__ import annotations

import numpy as np
import torch

from edgerl.envs import EnvSpec
from edgerl.memories.budget import continuous_actions
from edgerl.words import fmt_bytes


def rollout_bytes(spec: EnvSpec, num_envs: int, steps: int) -> int:
    """Bytes a rollout of ``steps`` vector steps of ``num_envs`` environments holds."""
    obs = int(np.prod(spec.obs_shape)) * np.dtype(spec.obs_dtype).itemsize
    action = 4 * int(np.prod(spec.action_shape)) if spec.continuous else 8  # float32s, an int64
    # obs, action, reward, flags and two extras (PQN keeps one: the greedy value; PPO two)
    return num_envs * (steps + 1) * (obs + action + 4 + 2 + 2 * 4)


def lambda_returns(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    next_values: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Q(lambda) returns of a rollout, (T, N) each: transition t's reward plus the discounted
    mix of the next step's return (weight ``lam``) and the greedy value of its next observation
    (``next_values[t]``, max_a Q). A termination stops both; a truncation (or the rollout's
    end) bootstraps from the next observation's value alone."""
    steps = rewards.shape[0]
    returns = torch.empty_like(rewards)
    alive = 1.0 - terminated.float()
    cut = truncated.float()
    following = next_values[-1]
    for t in range(steps - 1, -1, -1):
        if t == steps - 1:
            blend = next_values[t]
        else:
            blend = lam * following + (1.0 - lam) * next_values[t]
            blend = cut[t] * next_values[t] + (1.0 - cut[t]) * blend
        following = rewards[t] + gamma * alive[t] * blend
        returns[t] = following
    return returns


# The tensors a rollout is stored in (take_full swaps them between the two sets).
_ROLLOUT_TENSORS = ("obs", "actions", "rewards", "terminated", "truncated", "values")


class RolloutBuffer:
    """The last ``steps`` vector steps of ``num_envs`` environments, on ``device``."""

    keeps_steps = False  # each rollout is learned once, then written anew

    def __init__(self, spec: EnvSpec, num_envs: int, steps: int, device: torch.device) -> None:
        self.spec = spec
        self.num_envs = num_envs
        self.steps = steps
        self.device = device
        dtype = getattr(torch, spec.obs_dtype)
        # obs[t] is the observation transition t starts from; obs[steps] the newest one.
        self.obs = torch.zeros((steps + 1, num_envs, *spec.obs_shape), dtype=dtype, device=device)
        action_dtype = torch.float32 if spec.continuous else torch.long
        shape = (steps, num_envs, *spec.action_shape)
        self.actions = torch.zeros(shape, dtype=action_dtype, device=device)
        self.rewards = torch.zeros((steps, num_envs), device=device)
        self.terminated = torch.zeros((steps, num_envs), dtype=torch.bool, device=device)
        self.truncated = torch.zeros((steps, num_envs), dtype=torch.bool, device=device)
        # The final observations of truncated episodes: (t, env rows, observations).
        self.finals: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        # What the actor's policy said of obs[t] as it acted on it: the extra "value" (PQN's
        # max_a Q, PPO's V) in ``values``, any other in ``kept`` by name (made when first
        # noted), and the learner's update count the acting weights came from (-1: nothing
        # noted): PQN reuses values where its weights are still the same.
        self.values = torch.zeros((steps + 1, num_envs), device=device)
        self.kept: dict[str, torch.Tensor] = {}
        self.values_version = np.full(steps + 1, -1, dtype=np.int64)
        self.t = 0  # transitions stored in this rollout
        self.valid = 0  # transitions stored (the trainer's progress line reads it)
        self._spare: RolloutBuffer | None = None  # the rollout handed over last (take_full)

    @property
    def nbytes(self) -> int:
        return rollout_bytes(self.spec, self.num_envs, self.steps)

    def describe(self) -> str:
        size = fmt_bytes(self.nbytes)
        return f"a rollout of {self.steps} steps x {self.num_envs} environments ({size})"

    @property
    def capacity(self) -> int:
        """Transitions a rollout holds."""
        return self.steps * self.num_envs

    def rng_state(self) -> None:
        """A rollout draws nothing (the learner's minibatch order is in its own state)."""
        return None

    def set_rng_state(self, state: object) -> None:
        """Nothing to restore (see :meth:`rng_state`)."""

    def set_guard(self, on: bool) -> None:
        """Nothing to guard: a rollout is learned from between its writes, never during them."""

    @property
    def full(self) -> bool:
        return self.t == self.steps

    def __len__(self) -> int:
        return self.valid

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(array, device=self.device)

    def add_first(self, obs: np.ndarray, envs: np.ndarray | None = None) -> None:
        """Start from the observations after a reset (every environment: PQN steps them all)."""
        if envs is not None and len(envs) != self.num_envs:
            raise ValueError("a rollout is written for every environment at once")
        self.t = 0
        self.finals.clear()
        self.values_version[:] = -1
        self.obs[0].copy_(self._tensor(obs))

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
        """Record one vector step of every environment: ``actions`` one integer each, or for
        a continuous game float32 ``(envs, *spec.action_shape)``. Raises ValueError when full,
        or for actions of another shape."""
        if self.full:
            raise ValueError("the rollout is full: learn from it and clear it first")
        if envs is not None and len(envs) != self.num_envs:
            raise ValueError("a rollout is written for every environment at once")
        t = self.t
        if self.spec.continuous:
            numbers = continuous_actions(self.spec, actions, self.num_envs)
            self.actions[t].copy_(self._tensor(numbers))
        else:
            self.actions[t].copy_(self._tensor(np.asarray(actions, dtype=np.int64)))
        self.rewards[t].copy_(self._tensor(np.asarray(rewards, dtype=np.float32)))
        self.terminated[t].copy_(self._tensor(np.asarray(terminated, dtype=bool)))
        trunc = np.asarray(truncated, dtype=bool) & ~np.asarray(terminated, dtype=bool)
        self.truncated[t].copy_(self._tensor(trunc))
        if trunc.any():
            if final_obs is None:
                raise ValueError("final_obs is required when an episode ends")
            rows = np.flatnonzero(trunc)
            self.finals.append((t, self._tensor(rows), self._tensor(final_obs[rows])))
        self.obs[t + 1].copy_(self._tensor(next_obs))
        self.values_version[t + 1] = -1
        self.t = t + 1
        self.valid = min(self.valid + self.num_envs, self.steps * self.num_envs)

    def note_extras(self, extras: dict[str, np.ndarray], version: int) -> None:
        """Keep what the acting policy said of the newest observations (one row per
        environment), computed with the weights of the learner's update ``version``, every
        extra by its name (``extras["value"]`` in :attr:`values`, the rest in :attr:`kept`).
        The actor's forward pass already made them: the learner need not compute them again."""
        for name, rows in extras.items():
            self.extra(name)[self.t].copy_(self._tensor(np.asarray(rows, dtype=np.float32)))
        self.values_version[self.t] = version

    def extra(self, name: str) -> torch.Tensor:
        """The stored extra ``name``, (steps + 1, envs): slot t is what the policy said of
        ``obs[t]`` (where :attr:`values_version` says it was noted)."""
        if name == "value":
            return self.values
        if name not in self.kept:
            self.kept[name] = torch.zeros_like(self.values)
        return self.kept[name]

    def _carry_newest(self, source: RolloutBuffer) -> None:
        """Start at slot 0 from ``source``'s newest observation and what was noted of it (the
        actor may have acted on it already: its extras belong to the next rollout's first
        step)."""
        t = source.t
        self.obs[0].copy_(source.obs[t])
        version = source.values_version[t]
        self.values_version[:] = -1
        self.values_version[0] = version
        if version >= 0:
            self.values[0].copy_(source.values[t])
            for name, stored in source.kept.items():
                self.extra(name)[0].copy_(stored[t])

    def take_full(self) -> RolloutBuffer:
        """Hand the full rollout over and go on with the next one in a second set of tensors
        (made at the first call; the rollout handed over before this one is overwritten, so
        its learning must be over). Returns the full rollout: a buffer of its own that no write
        here changes. Raises ValueError when the rollout is not full."""
        if not self.full:
            raise ValueError("only a full rollout is handed over")
        if self._spare is None:
            self._spare = RolloutBuffer(self.spec, self.num_envs, self.steps, self.device)
        full, spare = self._spare, self._spare
        for name in _ROLLOUT_TENSORS:  # swap the storage: the spare's tensors are written next
            mine, theirs = getattr(self, name), getattr(spare, name)
            setattr(self, name, theirs)
            setattr(full, name, mine)
        full.finals, self.finals = self.finals, full.finals
        full.values_version, self.values_version = self.values_version, full.values_version
        full.kept, self.kept = self.kept, full.kept
        full.t, full.valid = self.t, self.capacity
        self._carry_newest(full)  # the next rollout starts from the newest
        self.t = 0
        self.finals.clear()
        return full

    def clear(self) -> None:
        """Start the next rollout from the newest observations."""
        self._carry_newest(self)
        self.t = 0
        self.finals.clear()
