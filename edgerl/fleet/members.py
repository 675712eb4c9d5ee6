"""One actor of a population learner's fleet (the genetic algorithm): it plays members' episodes
from their seeds and sends back only each episode's score and length.

A job is a ticket and a genome (the seeds that make a member, :mod:`edgerl.learners.population`):
the actor rebuilds the member's weights itself, from the parents it was told to keep (one draw of
noise per child), and plays one whole episode with it in one of its environments. What crosses
the network is a few bytes per seed out and about twenty back per member, where a step-collecting
actor sends every frame.

The actor keeps a queue of jobs between calls and steps its environments only inside a call,
which returns once the episodes it was asked to wait for have ended, or after about a second.
The fleet sends an instance a job for each environment and as many more as a call waits for
in its first call, that many in each other first one, then in each call as many as the last
answer gave back (episodes ended, jobs dropped): every call starts with a job waiting for each
episode it waits to end, and an environment starts its next member the step its episode
ends. Should the queue run dry all the same (more episodes ending in one step than it waited
for), an environment goes on with the member it had until its episode ends (those steps count
for nobody). A job waiting in the queue when its generation ended is dropped unplayed and its
ticket sent back.

:class:`MemberActor` is a plain class (the transport makes it a Ray actor), so tests and the
benchmark run it without Ray too.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from edgerl.fleet.actor import actor_env_config, where_am_i


class Played(NamedTuple):
    """What one call of :meth:`MemberActor.play` sends back."""

    tickets: np.ndarray  # (K,) int64: the episodes that ended, by ticket
    scores: np.ndarray  # (K,) float64: each one's score (the game's own points, summed)
    lengths: np.ndarray  # (K,) int64: each one's length in env steps
    envs: np.ndarray  # (K,) int64: the environment each one ended in (the learner's ids, once in)
    dropped: np.ndarray  # (D,) int64: tickets dropped unplayed (their generation had ended)
    steps: int  # env steps taken in this call, every environment's (idle ones' too)


def pack_genomes(genomes: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Genomes as two int arrays (the seeds, one after another; each genome's length): what a
    call carries, four bytes a seed."""
    lengths = np.array([len(g) for g in genomes], dtype=np.int32)
    seeds = np.fromiter((s for g in genomes for s in g), dtype=np.int32, count=int(lengths.sum()))
    return seeds, lengths


def unpack_genomes(seeds: np.ndarray, lengths: np.ndarray) -> list[tuple[int, ...]]:
    ends = np.cumsum(lengths)
    flat = seeds.tolist()
    return [
        tuple(flat[end - n : end]) for end, n in zip(ends.tolist(), lengths.tolist(), strict=True)
    ]


class MemberActor:
    """``config`` and ``spec`` are the learner's (``Config.to_dict``, ``EnvSpec.to_dict``): the
    actor builds the same network and ``env.num_envs`` environments, seeded from ``seed``."""

    def __init__(self, config: dict[str, Any], spec: dict[str, Any], seed: int) -> None:
        import torch

        from edgerl.config import from_dict
        from edgerl.envs import EnvSpec, make_env
        from edgerl.learners.factory import policy_network
        from edgerl.learners.population import Genomes, Population

        cfg = from_dict(config, "the learner's config")
        self.spec = EnvSpec.from_dict(spec)
        torch.set_num_threads(max(1, int(cfg.fleet.cpus_per_actor)))
        net = policy_network(cfg, self.spec).eval().requires_grad_(False)
        self.genomes = Genomes(net, cfg.ga.sigma)
        self.env = make_env(actor_env_config(cfg, torch.device("cpu")), self.spec)
        self.num_envs = n = self.env.num_envs
        self.population = Population(net, n, torch.device("cpu"))
        self.obs = self.env.reset(seed=seed)
        self.queue: deque[tuple[int, int, tuple[int, ...]]] = deque()  # (ticket, token, genome)
        self.tickets = np.full(n, -1, dtype=np.int64)  # each environment's ticket; -1: none
        self.at_start = np.ones(n, dtype=bool)  # its next step is an episode's first
        self.score = np.zeros(n, dtype=np.float64)
        self.length = np.zeros(n, dtype=np.int64)
        self.kept_version = -1  # the learner's generation whose parents are kept
        self.idle_steps = 0  # env steps of environments that had no job (they count for nobody)
        self.busy_s = 0.0

    def where(self) -> dict[str, Any]:
        """Where this actor runs (see :class:`~edgerl.fleet.actor.RemoteActor`)."""
        return where_am_i()

    def play(
        self,
        tickets: np.ndarray,
        seeds: np.ndarray,
        lengths: np.ndarray,
        token: int,
        wanted: int,
        kept: tuple[int, np.ndarray, np.ndarray] | None = None,
        max_seconds: float = float("inf"),
    ) -> Played:
        """Queue the jobs ``tickets`` (genomes packed by :func:`pack_genomes`), taken in
        generation ``token``, and play until ``wanted`` episodes have ended, nothing is left to
        play, or ``max_seconds`` have passed (so that the learner hears from it often even
        when episodes are long). ``kept`` (a generation's number and its parents, packed)
        replaces the weights kept when newer."""
        started = time.perf_counter()
        deadline = started + max_seconds
        if kept is not None and kept[0] > self.kept_version:
            self.genomes.keep(unpack_genomes(kept[1], kept[2]))
            self.kept_version = kept[0]
        stale = [job for job in self.queue if job[1] < token]
        self.queue = deque(job for job in self.queue if job[1] >= token)
        genomes = unpack_genomes(seeds, lengths)
        self.queue.extend(zip(tickets.tolist(), [token] * len(genomes), genomes, strict=True))
        ended: list[tuple[int, float, int, int]] = []
        steps = 0
        self._start_jobs()
        while len(ended) < wanted and (self.queue or (self.tickets >= 0).any()):
            steps += self._step(ended)
            self._start_jobs()
            if time.perf_counter() >= deadline:
                break
        self.busy_s += time.perf_counter() - started
        out = np.array(ended, dtype=np.float64).reshape(-1, 4)
        return Played(
            out[:, 0].astype(np.int64),
            out[:, 1],
            out[:, 2].astype(np.int64),
            out[:, 3].astype(np.int64),
            np.array([job[0] for job in stale], dtype=np.int64),
            steps,
        )

    def _start_jobs(self) -> None:
        """Environments at an episode's start with no job take the queue's next ones."""
        for env in np.flatnonzero(self.at_start & (self.tickets < 0)).tolist():
            if not self.queue:
                return
            ticket, _, genome = self.queue.popleft()
            self.tickets[env] = ticket
            self.population.assign(env, self.genomes.weights(genome))

    def _step(self, ended: list[tuple[int, float, int, int]]) -> int:
        """One step of every environment, each with its member (one batched forward pass);
        appends the episodes that ended with a ticket to ``ended``. Returns the env steps."""
        import torch

        with torch.no_grad():
            q = self.population(torch.from_numpy(self.obs), self.population.every_env)
        self.idle_steps += int(np.count_nonzero(self.tickets < 0))
        result = self.env.step(q.argmax(dim=1).numpy())
        self.obs = result.obs
        self.score += result.rewards
        self.length += 1
        done = result.terminated | result.truncated
        for env in np.flatnonzero(done).tolist():
            if self.tickets[env] >= 0:
                ticket, score = int(self.tickets[env]), float(self.score[env])
                ended.append((ticket, score, int(self.length[env]), env))
            self.tickets[env] = -1
        self.score[done], self.length[done] = 0.0, 0
        self.at_start = done
        return self.num_envs

    def close(self) -> None:
        """Close the environments."""
        self.env.close()
