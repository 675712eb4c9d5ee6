"""A deep genetic algorithm (Such et al. 2017, "Deep Neuroevolution", arXiv 1712.06567): no
gradients, no optimizer, no replay; only forward passes.

Each generation is ``ga.population`` members, each a network that plays one episode; its
fitness is the game's own score (the memory gets the unclipped rewards: the registry line says
``raw_rewards``). The ``ga.elite_candidates`` best play ``ga.elite_episodes`` more episodes each
and the best mean becomes the elite: the policy (what play, export and evaluations use) and
member 0 of the next generation, unchanged. The other members are children of the elite and the
``ga.truncation - 1`` best children (the paper's Algorithm 1 keeps the elite among the parents,
so a lucky child's single episode never pushes the best network found out): a parent's weights
plus Gaussian noise of power ``ga.sigma``. The candidates for the next elite are the
``ga.elite_candidates`` best children and the elite (the paper: 9 and the elite). One
departure, for the scheduling below: the elite among the parents is the one chosen from the
generation before's candidates (member 0), as the newest is chosen while the children play.

**Genomes are seeds** (:mod:`edgerl.learners.population`). A member is the list of seeds
that made it (:data:`Genome`): the first draws its initial weights, each further one the noise
of one mutation. :class:`Genomes` rebuilds the weights from the list exactly (the same float32
operations in the same order: the same bits on the same kind of CPU and torch; x86's vectorised
random draws differ from ARM's in the last bits, which a resume on another kind of machine
notices and says); it keeps the parents' weights, so a child costs one draw of noise, not its
whole line. A checkpoint holds the seeds, a few bytes per member per generation, and resuming
rebuilds the parents from them.

**Batched forward passes.** Every environment plays a member of its own. :class:`Population`
keeps each environment's member's weights in one slot of a stacked tensor and runs the members
of all the rows in one call (``torch.func.vmap`` over ``functional_call``: the convolutions
become grouped ones), instead of one forward pass per member (:meth:`Population.forward_each`,
what ``edgerl bench`` compares it with).

**Scheduling.** The learner hands out jobs (a member's episode, a candidate's episode) to the
environments as their episodes end. The next generation's children need only the parents, so
they play while the previous generation's candidates play for the elite (member 0, whose fitness
is then its candidate episodes): one phase per generation. Once every job of a generation is
under way, an environment that comes free plays another episode of the job furthest behind, so
no environment waits idle for the generation's last episode; an episode still under way when its
generation ends counts for nobody (``wasted_steps``). **Like with like**: a job's episodes keep
the order they were handed out in, and only those before the first one still under way count;
members are ranked over the same number of episodes each (one, unless spare environments played
every member again in time), and candidates over exactly ``ga.elite_episodes``. Otherwise the
short episodes of a replay, ending first, would count where the long ones did not, and a
member's mean over three episodes would be ranked against another's single, sometimes lucky,
one.

An episode counts for its member only if it started with that member: the loop records a step
before acting on the next (the registry line says ``switches_per_episode``), so the first action
of an episode comes from the member it was handed to.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np
import psutil
import torch
from torch import nn

from edgerl.config import Config
from edgerl.envs import EnvSpec
from edgerl.files.checkpoint import POLICY_KEY
from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.generation import PLAYING, Generation, check_saved, first_in
from edgerl.learners.kinds import Basics
from edgerl.learners.nets import num_actions_of
from edgerl.learners.population import (
    Genome,
    Genomes,
    Population,
    flat_parameters,
    forward_rates,
    load_flat,
)
from edgerl.learners.shared import LossMeter
from edgerl.memories.episodes import EpisodeScores

log = logging.getLogger(__name__)

SEED_LIMIT = 2**31  # seeds are int32: four bytes each in a genome sent to another machine
NOTHING = -1  # the token and job of an environment before its first job


class GeneticAlgorithm:
    """The learner ``agent.algo = "ga"`` names (see the module docstring)."""

    kind = "ga"

    def __init__(self, net: nn.Module, cfg: Config, device: torch.device) -> None:
        self.cfg = cfg.ga
        self.device = device
        self.q = net.to(device).requires_grad_(False)  # the elite: what play and export use
        self.num_envs = cfg.env.num_envs
        self.genomes = Genomes(self.q, cfg.ga.sigma)
        self.rng = np.random.default_rng(cfg.env.seed + 3)
        self.losses = LossMeter(device)  # no losses: the interface's meter stays empty
        self.updates = 0  # generations finished
        self.per_launch = 1
        self.cuda_graphs = False
        self.learn_from = (0, 0)
        self.steps_per_unit = 1  # env steps per generation, measured as they finish
        self.token = 0  # counts generations: an episode counts only in the one it started in
        self.pending: deque[int] = deque()  # the generation's jobs not handed out yet
        # The jobs under way, by ticket (an environment here, or a job lent to a remote actor):
        # (token, job, place), the token the generation's it started in and the place of its
        # episode among the job's (the order they were handed out in).
        self.playing: dict[int, tuple[int, int, int]] = {}
        self.tickets = self.num_envs  # the next remote ticket (below it: the environments)
        self._population: Population | None = None  # built when the loop acts here
        self._policy: EpsilonGreedy | None = None  # acts with the population (built with it)
        self.remote = cfg.fleet.actors > 0  # remote actors take the jobs (take, settle)
        self.elite: Genome | None = None
        self.scores = {"elite": float("nan"), "best": float("nan"), "mean": float("nan")}
        self.episodes = 0  # episodes played, counted or not
        self.wasted_steps = 0  # steps of episodes that ended after their generation did
        self.steps_at_generation = 0
        self.steps_seen = 0
        members: list[Genome | None] = [(self._seed(),) for _ in range(self.cfg.population)]
        self.generation = Generation(0, members, [[] for _ in members])
        self.genomes.keep([])
        self._start_phase()
        load_flat(self.q, self.genomes.weights(members[0]))  # the policy until an elite is chosen

    def _seed(self) -> int:
        return int(self.rng.integers(SEED_LIMIT))

    # -- what the loop asks --------------------------------------------------------------

    @property
    def policy(self) -> EpsilonGreedy:
        """Epsilon-greedy on every environment's member, in batched calls (built on first
        use: the environments here take their first jobs then, unless remote actors play them
        all)."""
        if self._policy is None:
            self._policy = EpsilonGreedy(self.population, num_actions_of(self.q), per_env=True)
        return self._policy

    @property
    def population(self) -> Population:
        if self._population is None:
            self._population = Population(self.q, self.num_envs, self.device)
            self._hand_out_all()
        return self._population

    def describe(self) -> str:
        played = "in batched forward passes"
        if self.remote:
            played = "played by the fleet's actors from their seeds"
        return (
            f"{self.device.type}, a population of {self.cfg.population:,} {played}, "
            f"generation {self.generation.number}"
        )

    def figures(self) -> dict[str, float]:
        """The generation under way, and the scores of the last one finished: its elite's mean
        over the elite episodes, its best and its mean member's fitness."""
        return {
            "generation": float(self.generation.number),
            "elite_score": self.scores["elite"],
            "best_score": self.scores["best"],
            "mean_score": self.scores["mean"],
        }

    def epsilon(self, step: int) -> float:
        return 0.0  # members play greedily: their episodes are their fitness

    def owed(self, step: int, memory: EpisodeScores) -> int:
        return 1 if memory.finished else 0

    def learn(self, memory: EpisodeScores, step: int, n: int = 1) -> None:
        """Credit the episodes that ended to their members and hand those environments their
        next jobs (a generation ends inside when its last episode is credited)."""
        for episode in memory.take():
            self.settle(episode.env, episode.score, episode.length)
            self._hand_out(episode.env)
        if self.device.type == "cuda":
            # The members' weights came from the host: landed before the actor's next forward
            # pass, which runs on a stream of its own.
            torch.cuda.current_stream(self.device).synchronize()

    def resume_at(self, step: int, refill: int = 0) -> None:
        self.learn_from = (step, self.updates)

    # -- jobs for remote actors (edgerl.run.remote) ----------------------------------------

    def take(self) -> tuple[int, Genome]:
        """A job for a remote actor: its ticket (to :meth:`settle` or :meth:`release` it by)
        and the genome to play one episode with."""
        ticket, self.tickets = self.tickets, self.tickets + 1
        job = self._next_job()
        self.playing[ticket] = (self.token, job, self._place(job))
        return ticket, self._genome(job)

    def settle(self, ticket: int, score: float, length: int) -> None:
        """The episode of ``ticket`` ended with ``score`` after ``length`` steps: it counts for
        its job if its generation is still the one under way (a generation may end inside)."""
        token, job, place = self.playing.pop(ticket, (NOTHING, NOTHING, NOTHING))
        self.episodes += 1
        self.steps_seen += length
        if token == self.token:
            self._credit(job, place, score)
        else:
            self.wasted_steps += length

    def release(self, ticket: int) -> None:
        """``ticket``'s episode will never end (its actor was lost, or dropped it unplayed):
        its job is owed again, to the next taker (in the same place among its episodes)."""
        self.playing.pop(ticket, None)

    def kept_genomes(self) -> tuple[int, list[Genome]]:
        """The genomes whose weights a remote actor should keep to play this generation's
        children at one draw of noise each (the parents), with the generation's number."""
        return self.generation.number, list(self.genomes.kept)

    # -- jobs ----------------------------------------------------------------------------
    # A job is a member's episode (job m) or a candidate's (job len(members) + c); a generation
    # is one phase: its members' first episodes and the previous generation's candidates'
    # episodes are handed out together, so nobody waits for the elite to be chosen.

    def _genome(self, job: int) -> Genome:
        g = self.generation
        members = len(g.members)
        genome = g.members[job] if job < members else g.candidates[job - members]
        assert genome is not None  # member 0 gets no job while the elite is being chosen
        return genome

    def _episodes(self, job: int) -> list[float]:
        g, members = self.generation, len(self.generation.members)
        return g.scores[job] if job < members else g.trials[job - members]

    def _place(self, job: int) -> int:
        """The place of a new episode of ``job`` among its episodes: the first one left
        :data:`PLAYING` by an episode that will never end (a lost actor's; a resumed run's),
        else a new one."""
        episodes = self._episodes(job)
        taken = {p for token, j, p in self.playing.values() if token == self.token and j == job}
        for place, score in enumerate(episodes):
            if score != score and place not in taken:
                return place
        episodes.append(PLAYING)
        return len(episodes) - 1

    def _owed(self) -> np.ndarray:
        """Episodes each job still needs (negative: played more than needed; a job that takes
        no more episodes has a large negative number)."""
        g = self.generation
        closed = -(1 << 30)
        members = [1 if m is not None else closed for m in g.members]
        trials = self.cfg.elite_episodes if g.choosing else closed
        needed = np.array(members + [trials] * len(g.candidates), dtype=np.int64)
        return needed - g.finished()

    def _start_phase(self) -> None:
        """Hand out the generation's jobs: the candidates' episodes in turn, then each member's
        first (the elite's come from its episodes as a candidate)."""
        self.token += 1
        g, members = self.generation, len(self.generation.members)
        owed = self._owed()
        rounds = max(0, int(owed[members:].max(initial=0)))
        trials = [
            members + c
            for r in range(rounds)
            for c in range(len(g.candidates))
            if owed[members + c] > r
        ]
        firsts = [m for m in range(members) if owed[m] > 0]
        self.pending = deque(trials + firsts)

    def _next_job(self) -> int:
        """The next job to hand out: one not handed out yet, else another episode of the job
        furthest behind what it needs (an environment would otherwise wait for the generation's
        last episodes), the first of equals; with remote actors, of equals the one with the
        fewest episodes in (one a slow board holds). Such an episode counts only if every
        member's of that place is in when the generation ends (members are ranked over as many
        episodes each), so a member's first episode that a slow board holds is waited for, as
        the paper's generations wait for all of theirs; a lost board's are handed out again
        (:meth:`release`)."""
        if self.pending:
            return self.pending.popleft()
        owed = self._owed()
        for token, playing, _ in self.playing.values():
            if token == self.token:
                owed[playing] -= 1
        if not self.remote:  # here every episode under way ends at the same pace
            return int(np.argmax(owed))
        g = self.generation
        return int(np.lexsort((np.arange(len(owed)), g.finished(), -owed))[0])

    def _hand_out(self, env: int) -> None:
        """Give environment ``env`` (here) its next job."""
        self.playing.pop(env, None)  # its last job is done: not under way
        job = self._next_job()
        self.playing[env] = (self.token, job, self._place(job))
        self.population.assign(env, self.genomes.weights(self._genome(job)))

    def _hand_out_all(self) -> None:
        """Every environment here takes a job (none where remote actors play them all)."""
        for env in range(0 if self.remote else self.num_envs):
            self._hand_out(env)

    def _credit(self, job: int, place: int, score: float) -> None:
        g, members = self.generation, len(self.generation.members)
        if job < members:
            g.scores[job][place] = score
        elif g.choosing:
            g.trials[job - members][place] = score
            if all(first_in(t) >= self.cfg.elite_episodes for t in g.trials):
                self._choose_elite()
        if not g.choosing and all(first_in(r) >= 1 for r in g.scores):
            self._next_generation()

    def _ranked(self, episodes: int) -> list[int]:
        """The compared members (:attr:`Generation.compared`), best first by the mean of
        their first ``episodes`` episodes (ties: the lower index, so a seeded run is
        repeatable)."""
        g = self.generation
        return sorted(g.compared, key=lambda m: (-g.fitness(m, episodes), m))

    def _choose_elite(self) -> None:
        """The candidate of the best mean over its first ``ga.elite_episodes`` episodes (every
        candidate over as many) becomes the elite: member 0 and the policy."""
        g, n = self.generation, self.cfg.elite_episodes
        means = [float(np.mean(t[:n])) for t in g.trials]
        best = int(np.argmax(means))  # the first of equals: the better single episode
        self._make_elite(g.candidates[best], list(g.trials[best][:n]))

    def _make_elite(self, elite: Genome, episodes: list[float]) -> None:
        g = self.generation
        g.members[0], g.scores[0] = elite, episodes
        self.elite = elite
        self.scores["elite"] = float(np.mean(episodes))
        load_flat(self.q, self.genomes.weights(elite))

    def _next_generation(self) -> None:
        """Every member scored: the elite and the best children parent the next generation
        (Such et al.'s Algorithm 1 keeps the elite first among the parents, whatever the
        children's single episodes scored), whose candidates for the elite are the best few
        children and the elite. Children are ranked over as many episodes each."""
        g = self.generation
        episodes = g.common_episodes()
        ranked = self._ranked(episodes)
        fitness = np.array([g.fitness(m, episodes) for m in ranked])
        self.scores["best"], self.scores["mean"] = float(fitness.max()), float(fitness.mean())
        members = [m for m in g.members if m is not None]
        elite = [] if self.elite is None else [self.elite]
        best = [members[m] for m in ranked if members[m] not in elite]
        parents = [*elite, *best][: self.cfg.truncation]
        candidates = best[: self.cfg.elite_candidates] + elite
        children = [
            (*parents[int(self.rng.integers(len(parents)))], self._seed())
            for _ in range(self.cfg.population - 1)
        ]
        self.genomes.keep([*parents, *candidates])
        self.updates += 1
        self.steps_per_unit = max(1, self.steps_seen - self.steps_at_generation)
        self.steps_at_generation = self.steps_seen
        if self.cfg.elite_episodes == 0:  # the elite: the best single episode, played again
            self.generation = Generation(
                self.updates, [None, *children], [[] for _ in range(len(children) + 1)]
            )
            self._make_elite(members[ranked[0]], [])
        else:
            n = len(children) + 1
            self.generation = Generation(
                self.updates,
                [None, *children],
                [[] for _ in range(n)],
                candidates,
                [[] for _ in candidates],
            )
        self._start_phase()

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        g = self.generation
        return {
            POLICY_KEY: self.q.state_dict(),
            "ga": {
                "generation": g.number,
                "members": [[] if m is None else list(m) for m in g.members],
                "scores": g.scores,
                "candidates": [list(c) for c in g.candidates],
                "trials": g.trials,
                "elite": None if self.elite is None else list(self.elite),
                "figures": dict(self.scores),
                "rng": self.rng.bit_generator.state,
                "counts": [self.episodes, self.wasted_steps, self.steps_seen],
                "steps_at_generation": self.steps_at_generation,
                "steps_per_unit": self.steps_per_unit,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where ``state`` was taken: the episodes credited are kept, those under way
        then are played again."""
        s = state["ga"]
        self.q.load_state_dict(state[POLICY_KEY])
        g = Generation(
            int(s["generation"]),
            [tuple(m) if m else None for m in s["members"]],
            [[float(v) for v in r] for r in s["scores"]],
            [tuple(c) for c in s["candidates"]],
            [[float(v) for v in t] for t in s["trials"]],
        )
        elite = None if s["elite"] is None else tuple(s["elite"])
        free = int(psutil.virtual_memory().available)
        check_saved(g, elite, SEED_LIMIT, 4 * self.genomes.size, free)  # float32 weights
        self.generation, self.updates, self.elite = g, g.number, elite
        self.scores = {k: float(v) for k, v in s["figures"].items()}
        self.rng.bit_generator.state = s["rng"]
        self.episodes, self.wasted_steps, self.steps_seen = (int(v) for v in s["counts"])
        self.steps_at_generation = int(s["steps_at_generation"])
        self.steps_per_unit = int(s["steps_per_unit"])
        # The weights rebuilt from the seeds: the children's parents, then the candidates and
        # the elite (each from the longest beginning kept).
        parents = [m[:-1] for m in g.members[1:] if m is not None and len(m) > 1]
        self.genomes.keep(parents)
        known = [m for m in (g.members[0], self.elite) if m is not None]
        self.genomes.keep([*parents, *g.candidates, *known])
        if self.elite is not None and not torch.equal(
            self.genomes.weights(self.elite), flat_parameters(self.q)
        ):
            # The same seeds drew other numbers: torch's CPU draws differ between CPU kinds
            # (x86's vectorised ones against ARM's) and may between versions.
            log.warning(
                "the elite rebuilt from its seeds differs from the saved one: this machine or "
                "torch draws other random numbers than the one that saved the run, so the search "
                "goes on from other members than it had (the policy is the saved elite)"
            )
        self._start_phase()
        self.playing = {}
        if self._population is not None:  # the environments here start new episodes
            self._hand_out_all()


class GAKind(Basics):
    """The genetic algorithm's kind (its registry line's ``KIND``): a Q-network's shape for
    every member, the game's own rewards (a member's fitness is its score), a member per
    episode, measured alone by handing out members."""

    switches_per_episode = True

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> GeneticAlgorithm:
        """Around ``net`` (whose code every member runs)."""
        return GeneticAlgorithm(net, cfg, device)

    def learning_rewards(self, spec: EnvSpec, rewards: np.ndarray) -> np.ndarray:
        """The game's own: a genetic algorithm's fitness is the score."""
        return rewards

    def measure_alone(
        self, cfg: Config, spec: EnvSpec, device: torch.device, seconds: float
    ) -> dict[str, Any]:
        """Its learning is handing out members (a child's weights from its kept parent onto
        the device), its compute the members' forward passes, which bound the env steps/s;
        measured at ``env.num_envs`` rows, batched and one member at a time."""
        net = self.network(spec, cfg.agent.hidden).to(device)
        genomes = Genomes(net, cfg.ga.sigma)
        parent = (1,)
        genomes.keep([parent])
        population = Population(net, 1, device)
        wait = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        handed, start = 0, time.perf_counter()
        while handed < 3 or time.perf_counter() - start < seconds / 4:
            population.assign(0, genomes.weights((*parent, handed + 2)))
            handed += 1
        wait()
        hand_s = (time.perf_counter() - start) / handed
        forward = forward_rates(net, spec, cfg.env.num_envs, device, seconds / 4)
        return {
            "updates_per_s": 1 / hand_s,
            "steps_per_s": forward["batched_rows_per_s"],
            "updates_per_launch": 1,
            "host_us_per_update": 1e6 * hand_s,
            # A unit here is a member handed out (its weights from a kept parent onto the
            # device, wall time), not a generation; the limit is the members' batched passes.
            "describe": f"a unit is a member handed out; {forward['rows']} members' forward passes",
            "population_forward": {k: round(v, 1) for k, v in forward.items()},
        }

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """One forward pass per env step (the member's action); no targets, no gradients."""
        return {"act": 1.0, "values": 0.0, "targets": 0.0, "gradients": 0.0}

    def forwards_per_update(self, cfg: Config) -> float:
        """A generation's learning is bookkeeping: no forward passes beyond acting."""
        return 0.0


KIND = GAKind()
