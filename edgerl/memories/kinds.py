"""What each kind of memory says before it exists: where it lives, what it needs against what
is free (and the fix when it does not fit), how it is built, and how the environments must step
for it. A learner names its kind in :mod:`edgerl.config.learners` (``memory``); everything else
asks the kind, never which kind it is. A new kind is a buffer with the :class:`Memory` members,
a class here and a line in :data:`MEMORY_KINDS`."""

from __future__ import annotations

from typing import Protocol

import torch

from edgerl.config import Config
from edgerl.config.fleet import fleet_envs
from edgerl.config.learners import learner_info, rollouts_held
from edgerl.envs import EnvSpec
from edgerl.errors import ConfigError, ReplayMemoryError
from edgerl.hw.device import resolve_device
from edgerl.memories import Memory
from edgerl.memories.budget import (
    MEMORY_SHARE,
    MemoryPlan,
    available_memory,
    plan_memory,
)
from edgerl.memories.episodes import EpisodeScores
from edgerl.memories.replay import ReplayBuffer
from edgerl.memories.rollout import RolloutBuffer, rollout_bytes
from edgerl.words import fmt_bytes, plural


class MemoryKind(Protocol):
    # Learning samples what it holds and the steps stay (see Memory.keeps_steps).
    keeps_steps: bool
    # Every environment steps together, each step's rows in order: no ALE async mode (rows
    # of some environments) and no autotune of the environments (its unit is all of them).
    lockstep: bool
    # What the messages call it.
    label: str

    def size_key(self, cfg: Config) -> str:
        """The key that makes it smaller."""
        ...

    def refuse(self, cfg: Config) -> None:
        """Raise ConfigError (one sentence naming the keys to change) where ``cfg``'s own keys
        cannot make this memory, before anything is measured."""
        ...

    def where(self, cfg: Config, device: torch.device) -> torch.device:
        """The device it lives on, for a learner on ``device``."""
        ...

    def plan(self, cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
        """What it needs against what is free where it lives, and a sentence saying so."""
        ...

    def fix(self, cfg: Config, plan: MemoryPlan) -> str:
        """What to change when ``plan`` does not fit."""
        ...

    def check(self, cfg: Config, device: torch.device, plan: MemoryPlan) -> None:
        """Raise ReplayMemoryError (one sentence) when ``plan`` does not fit."""
        ...

    def build(
        self, cfg: Config, spec: EnvSpec, device: torch.device, available: int | None, num_envs: int
    ) -> Memory:
        """The memory, for ``num_envs`` environments and a learner on ``device``."""
        ...


class ReplayKind:
    """DQN's replay: ``replay.capacity`` transitions, sampled again and again."""

    keeps_steps = ReplayBuffer.keeps_steps
    lockstep = False
    label = "the replay"

    def size_key(self, cfg: Config) -> str:
        return "replay.capacity"

    def refuse(self, cfg: Config) -> None:
        """A sampled batch fits the replay, and the replay holds 16 steps of every environment
        it is written by (an n-step window and a frame stack need that many)."""
        capacity, batch = cfg.replay.capacity, cfg.agent.batch_size
        if batch > capacity:
            raise ConfigError(
                f"agent.batch_size ({batch}) must not exceed replay.capacity ({capacity})"
            )
        envs = fleet_envs(cfg)
        if capacity >= envs * 16:
            return
        if cfg.fleet.actors:
            raise ConfigError(
                f"replay.capacity ({capacity:,}) must hold at least 16 steps per environment "
                f"of the fleet ({cfg.fleet.actors} actors x env.num_envs={cfg.env.num_envs} = "
                f"{envs:,}): raise it to {envs * 16:,} or more"
            )
        # Fewer environments first: a replay raised to fit 100,000 of them would not fit memory.
        raise ConfigError(
            f"replay.capacity ({capacity:,}) must hold at least 16 steps per environment "
            f"(env.num_envs={envs:,}): lower env.num_envs to {max(capacity // 16, 1):,} or "
            f"less, or raise replay.capacity to {envs * 16:,} or more"
        )

    def where(self, cfg: Config, device: torch.device) -> torch.device:
        return device if cfg.replay.device == "auto" else resolve_device(cfg.replay.device)

    def plan(self, cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
        available, where = available_memory(self.where(cfg, device))
        plan = plan_memory(spec, cfg.replay.capacity, available, where)
        return plan, (
            f"replay.capacity={plan.capacity:,} needs {fmt_bytes(plan.total_bytes)} "
            f"({plan.bytes_per_transition:,} bytes per transition)"
        )

    def fix(self, cfg: Config, plan: MemoryPlan) -> str:
        return f"set replay.capacity to at most {plan.max_capacity:,}, or free memory"

    def check(self, cfg: Config, device: torch.device, plan: MemoryPlan) -> None:
        plan.check()

    def build(
        self, cfg: Config, spec: EnvSpec, device: torch.device, available: int | None, num_envs: int
    ) -> Memory:
        return ReplayBuffer(
            spec,
            cfg.replay.capacity,
            num_envs,
            self.where(cfg, device),
            cfg.env.seed + 1,
            available,
            out_device=device,
            n_step=cfg.agent.n_step,
            gamma=cfg.agent.gamma,
        )


def rollout_steps(cfg: Config) -> int:
    """The rollout length of ``cfg``'s rollout learner: the key its registry line names
    (``pqn.rollout_steps``, ``ppo.rollout_steps``)."""
    return int(cfg.get(learner_info(cfg.agent.algo).rollout_key))


class RolloutKind:
    """A rollout learner's (PQN's, PPO's): the last ``rollout_steps`` steps of every
    environment, learned once (two of them where the learner learns one while the next is
    collected)."""

    keeps_steps = RolloutBuffer.keeps_steps
    lockstep = True
    label = "the rollout"

    def size_key(self, cfg: Config) -> str:
        return learner_info(cfg.agent.algo).rollout_key

    def refuse(self, cfg: Config) -> None:
        """Nothing: its size is what the memory plan weighs against the machine."""

    def where(self, cfg: Config, device: torch.device) -> torch.device:
        return device

    def _held(self, cfg: Config, device: torch.device) -> int:
        return rollouts_held(cfg.perf.pipeline, device.type, cfg.agent.algo)

    def _what(self, cfg: Config, held: int) -> str:
        return (
            f"{'two rollouts' if held == 2 else 'a rollout'} of {rollout_steps(cfg)} steps x "
            f"{plural(cfg.env.num_envs, 'environment')} need{'' if held == 2 else 's'}"
        )

    def plan(self, cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
        available, where = available_memory(device)
        held = self._held(cfg, device)
        steps = rollout_steps(cfg)
        size = held * rollout_bytes(spec, cfg.env.num_envs, steps)
        plan = MemoryPlan(steps, size, size, available, where)
        return plan, (
            f"{self._what(cfg, held)} {fmt_bytes(size)} (no replay"
            + ("; one learned while the next is collected)" if held == 2 else ")")
        )

    def fix(self, cfg: Config, plan: MemoryPlan) -> str:
        return f"lower env.num_envs or {self.size_key(cfg)}, or free memory"

    def check(self, cfg: Config, device: torch.device, plan: MemoryPlan) -> None:
        if plan.fits:
            return
        raise ReplayMemoryError(
            f"{self._what(cfg, self._held(cfg, device))} {fmt_bytes(plan.total_bytes)} but "
            f"only {fmt_bytes(plan.available_bytes)} of {plan.where} memory is available, of "
            f"which edgerl uses at most {MEMORY_SHARE:.0%}; lower env.num_envs or "
            f"{self.size_key(cfg)}"
        )

    def build(
        self, cfg: Config, spec: EnvSpec, device: torch.device, available: int | None, num_envs: int
    ) -> Memory:
        return RolloutBuffer(spec, num_envs, rollout_steps(cfg), device)


class EpisodesKind:
    """The genetic algorithm's: each environment's score and length so far, and the episodes
    that ended (no observations; the members' weights are the learner's own)."""

    keeps_steps = EpisodeScores.keeps_steps
    lockstep = False
    label = "the episode scores"

    def size_key(self, cfg: Config) -> str:
        return "env.num_envs"

    def refuse(self, cfg: Config) -> None:
        """Nothing: two numbers an environment."""

    def where(self, cfg: Config, device: torch.device) -> torch.device:
        return torch.device("cpu")

    def plan(self, cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
        available, where = available_memory(torch.device("cpu"))
        size = 16 * cfg.env.num_envs
        plan = MemoryPlan(cfg.env.num_envs, 16, size, available, where)
        return plan, f"episode scores of {plural(cfg.env.num_envs, 'environment')}: no replay"

    def fix(self, cfg: Config, plan: MemoryPlan) -> str:
        return "lower env.num_envs, or free memory"

    def check(self, cfg: Config, device: torch.device, plan: MemoryPlan) -> None:
        plan.check()

    def build(
        self, cfg: Config, spec: EnvSpec, device: torch.device, available: int | None, num_envs: int
    ) -> Memory:
        return EpisodeScores(num_envs)


MEMORY_KINDS: dict[str, MemoryKind] = {
    "replay": ReplayKind(),
    "rollout": RolloutKind(),
    "episodes": EpisodesKind(),
}
