"""A population learner added the way docs/development.md says: one module with the learner, its
memory and its memory's kind, plus two registry entries (the test that uses it adds them). It is
the shape of a genetic algorithm, not one: each environment plays whole episodes with a member of
its own (the learner's ``policy`` says ``per_env``), the memory keeps each
environment's running return and the episodes it finished, and the learner is owed work when
episodes have finished (``owed`` sees the memory). Once every member has played an episode the
best one is the policy, and the next generation is it plus mutated copies. Small, so the test is
about the seams (acting per environment, work owed from the memory, a memory kind of its own),
not evolution; the real genetic algorithm, built on the same seams, is edgerl/learners/ga.py.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from edgerl.config import Config
from edgerl.envs import EnvSpec
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import num_actions_of
from edgerl.learners.shared import LossMeter
from edgerl.memories.budget import MemoryPlan

MEMBERS = 6
NOISE = 0.05
FORWARDS: list[tuple[int, ...]] = []  # the members each acting forward pass used (the test)


class EpisodeReturns:
    """The memory: each environment's return so far, and the (env, return) of each episode that
    ended since the learner last took them."""

    keeps_steps = False

    def __init__(self, num_envs: int) -> None:
        self.running = np.zeros(num_envs)
        self.finished: list[tuple[int, float]] = []

    capacity = property(lambda self: len(self.running))
    nbytes = property(lambda self: self.running.nbytes)

    def add_first(self, obs: np.ndarray, envs: np.ndarray | None = None) -> None:
        self.running[slice(None) if envs is None else envs] = 0.0

    def add(self, actions, rewards, terminated, truncated, next_obs, final_obs, envs=None):  # type: ignore[no-untyped-def]
        ids = np.arange(len(self.running)) if envs is None else np.asarray(envs)
        self.running[ids] += rewards
        for env in ids[np.asarray(terminated) | np.asarray(truncated)]:
            self.finished.append((int(env), float(self.running[env])))
            self.running[env] = 0.0

    def set_guard(self, on: bool) -> None: ...

    def note_extras(self, extras, version): ...  # type: ignore[no-untyped-def]

    def rng_state(self) -> None:
        return None

    def set_rng_state(self, state: object) -> None: ...


class EpisodesKind:
    """The memory's kind: a few numbers per environment, on the CPU."""

    keeps_steps = False
    lockstep = False
    label = "the toy's scores"  # what sentences call it

    def size_key(self, cfg: Config) -> str:  # what makes it smaller
        return "env.num_envs"

    def refuse(self, cfg: Config) -> None: ...  # no keys of its own to check

    def where(self, cfg: Config, device: torch.device) -> torch.device:
        return torch.device("cpu")

    def plan(self, cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
        size = 8 * cfg.env.num_envs
        return MemoryPlan(cfg.env.num_envs, 8, size, 1 << 30, "host"), "episode returns"

    def fix(self, cfg: Config, plan: MemoryPlan) -> str:
        return ""

    def check(self, cfg: Config, device: torch.device, plan: MemoryPlan) -> None: ...

    def build(self, cfg, spec, device, available, num_envs):  # type: ignore[no-untyped-def]
        return EpisodeReturns(num_envs)


class Population(nn.Module):
    """The acting network: row i acts with the member environment ``envs[i]`` plays."""

    per_env = True

    def __init__(self, net: nn.Module, num_envs: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(copy.deepcopy(net) for _ in range(MEMBERS))
        self.register_buffer("member_of", torch.arange(num_envs) % MEMBERS)

    def forward(self, obs: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        which = self.member_of[envs]
        FORWARDS.append(tuple(which.tolist()))
        outs = [self.members[int(m)](obs[i : i + 1]) for i, m in enumerate(which)]
        return torch.cat(outs)


class Evolution:
    kind = "toy-pop"

    def __init__(self, net: nn.Module, cfg: Config, device: torch.device) -> None:
        self.device = device
        self.q = net.to(device)  # the best member so far: what play and export use
        self.population = Population(self.q, cfg.env.num_envs).to(device)
        self.losses = LossMeter(device)
        self.updates = 0  # generations made
        self.per_launch = 1
        self.cuda_graphs = False
        self.learn_from = (0, 0)
        self.steps_per_unit = cfg.env.num_envs * 20  # roughly an episode of every environment
        self.scores: dict[int, float] = {}  # member -> its episode's return, this generation
        self.credited_episodes = 0
        # An environment's episode counts for its member only if it started with that member.
        self.fresh = np.zeros(cfg.env.num_envs, dtype=bool)
        self.generator = torch.Generator().manual_seed(cfg.env.seed)
        self._mutate_all_but_the_first()

    def _mutate_all_but_the_first(self) -> None:
        with torch.no_grad():
            for member in list(self.population.members)[1:]:
                for p in member.parameters():
                    p.add_(NOISE * torch.randn(p.shape, generator=self.generator).to(p.device))

    @property
    def policy(self) -> EpsilonGreedy:
        members = num_actions_of(self.population.members[0])
        return EpsilonGreedy(self.population, members, per_env=True)

    def describe(self) -> str:
        return f"{self.device.type}, a population of {MEMBERS}"

    def figures(self) -> dict[str, float]:
        return {"generation": float(self.updates)}

    def epsilon(self, step: int) -> float:
        return 0.0  # members act greedily: their episodes are their fitness

    def owed(self, step: int, memory: EpisodeReturns) -> int:
        return 1 if memory.finished else 0

    def learn(self, memory: EpisodeReturns, step: int, n: int = 1) -> None:
        finished, memory.finished = memory.finished, []
        member_of = self.population.member_of
        for env, ret in finished:
            member = int(member_of[env])
            if self.fresh[env] and member not in self.scores:
                self.scores[member] = ret
                self.credited_episodes += 1
            waiting = [m for m in range(MEMBERS) if m not in self.scores]
            taken = set(member_of.tolist())
            free = [m for m in waiting if m not in taken or m == member]
            member_of[env] = free[0] if free else member
            self.fresh[env] = True
        if len(self.scores) == MEMBERS:
            self._next_generation()

    def _next_generation(self) -> None:
        best = max(self.scores, key=self.scores.__getitem__)
        elite = self.population.members[best].state_dict()
        self.q.load_state_dict(elite)
        for member in self.population.members:
            member.load_state_dict(elite)
        self._mutate_all_but_the_first()
        self.scores.clear()
        self.fresh[:] = False  # episodes under way started with the old members
        self.updates += 1

    def resume_at(self, step: int, refill: int = 0) -> None:
        self.learn_from = (step, self.updates)

    def state_dict(self) -> dict[str, Any]:
        return {
            POLICY_KEY: self.q.state_dict(),
            "population": self.population.state_dict(),
            "updates": self.updates,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state[POLICY_KEY])
        self.population.load_state_dict(state["population"])
        self.updates = int(state["updates"])
        self.generator.set_state(state["generator"])


class EvolutionKind(Basics):
    switches_per_episode = True  # each environment plays a member's whole episode

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> Evolution:
        return Evolution(net, cfg, device)

    def learning_rewards(self, spec: EnvSpec, rewards: np.ndarray) -> np.ndarray:
        return rewards  # a member's fitness is its score

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        return {"act": 1.0, "values": 0.0, "targets": 0.0, "gradients": 0.0}

    def forwards_per_update(self, cfg: Config) -> float:
        return 0.0


KIND = EvolutionKind()
