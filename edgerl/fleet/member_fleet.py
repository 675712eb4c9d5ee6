"""The fleet of a population learner (the genetic algorithm): ``fleet.actors`` Ray actors
(:class:`~edgerl.fleet.members.MemberActor`) that play members' episodes from their seeds.

The learner is the source of jobs (:class:`JobSource`): each call to an actor carries new jobs
(tickets and genomes: as many as the actor's last answer gave back), the generation they were
taken in and, when the parents changed, the genomes whose weights to keep; it comes back once
a quarter of the actor's environments (:meth:`MemberFleet.spare`) ended an episode, or after
:data:`ANSWER_EVERY_S`. With ``fleet.max_inflight`` calls in flight (an instance's first brings
a job for each environment and that quarter more, its other first ones the quarter each) every
call starts with a job waiting for each episode it waits to end: no environment waits for a
member, the actor never waits for the learner, and few jobs are taken ahead of the generation
(:mod:`edgerl.fleet.members`). The episodes are settled with the learner before the actor is
asked again, so the next jobs are the new generation's when an answer ended the last.
Actors are started, lost, named and started again as the step fleet's are
(:class:`~edgerl.fleet.transport.RayFleet`), but get jobs only once they run (an instance
waiting for a node with room would hold its members' first episodes, and the generation with
them); a lost actor's jobs, played or queued, go back to the learner, which hands them to the
next taker: no member goes without its episode.

The bytes each call carries (as pickled for Ray) are counted both ways: ``status()`` gives them
per member evaluated.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Protocol

import numpy as np

from edgerl.config.learners import RemoteActors
from edgerl.envs import longest_episode
from edgerl.fleet.members import MemberActor, Played, pack_genomes
from edgerl.fleet.transport import DamagedBatchError, RayFleet, Slot
from edgerl.words import plural

log = logging.getLogger(__name__)

ANSWER_EVERY_S = 1.0  # an actor answers at least this often (Atari episodes run for minutes)


class JobSource(Protocol):
    """What the fleet asks of the learner (:class:`~edgerl.learners.ga.GeneticAlgorithm`)."""

    token: int  # the generation under way's token: jobs taken under another no longer count

    def take(self) -> tuple[int, tuple[int, ...]]: ...

    def settle(self, ticket: int, score: float, length: int) -> None: ...

    def release(self, ticket: int) -> None: ...

    def kept_genomes(self) -> tuple[int, list[tuple[int, ...]]]: ...


class MemberFleet(RayFleet):
    """Remote actors playing a population's members; see the module docstring."""

    plays = RemoteActors.MEMBERS
    actor_type = MemberActor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source: JobSource | None = None
        self.outstanding: dict[int, set[int]] = {s.index: set() for s in self.slots}
        self.kept_sent: dict[int, int] = {}  # each slot's instance: the parents' version sent
        self.refill: dict[int, int] = {}  # each slot's instance: jobs its last answer gave back
        self.vector_steps: dict[int, int] = {}  # each slot's instance: its vector steps so far
        self.bytes_out = 0
        self.bytes_back = 0
        self.members_played = 0
        self.longest = longest_episode(self.cfg.env)  # the game's cap on an episode's steps

    def start_members(self, source: JobSource, seed: int) -> None:
        """Start every actor, asking it to play ``source``'s jobs."""
        self.source, self.seed = source, seed
        for slot in self.slots:
            self._launch(slot)
        log.info(
            "fleet: %s of %s each play the population's members from their seeds",
            plural(len(self.slots), "remote actor"),
            plural(self.per_actor, "environment"),
        )

    def receive_members(self, timeout_s: float) -> list[Played]:
        """The episodes that ended, settled with the learner (each answer's environments the
        learner's ids), after waiting up to ``timeout_s`` for the first answer; asks each actor
        that answered for more."""
        source = self.source
        assert source is not None
        self._ask_started()
        answers = []
        for slot, played in self._arrivals(timeout_s):
            i = slot.index
            steps_so_far = self.vector_steps.get(i, 0) * self.per_actor
            problem = played_problem(
                played, self.outstanding[i], self.per_actor, steps_so_far, self.longest
            )
            if problem is not None:
                self._lose(slot, DamagedBatchError(problem))
                continue
            self.vector_steps[i] = self.vector_steps.get(i, 0) + played.steps // self.per_actor
            self.bytes_back += len(pickle.dumps(played, protocol=5))
            self.outstanding[i] -= set(played.tickets.tolist()) | set(played.dropped.tolist())
            self.members_played += len(played.tickets)
            episodes = (played.tickets.tolist(), played.scores.tolist(), played.lengths.tolist())
            for ticket, score, length in zip(*episodes, strict=True):
                source.settle(ticket, score, length)
            for ticket in played.dropped.tolist():
                source.release(ticket)
            self._delivered(slot, played.steps)
            answers.append(played._replace(envs=slot.envs[played.envs]))
            self.refill[i] = len(played.tickets) + len(played.dropped)
            self._ask(slot)
        return answers

    def status(self) -> dict[str, Any]:
        out = super().status()
        played = max(self.members_played, 1)
        out["members"] = self.members_played
        out["bytes_per_member"] = {
            "out": round(self.bytes_out / played, 1),
            "back": round(self.bytes_back / played, 1),
        }
        return out

    # -- the actors -----------------------------------------------------------------------

    def spare(self) -> int:
        """Episodes an actor's call waits to end (a quarter of its environments, at least one),
        and the jobs waiting for them: small, so that few of a generation's jobs are taken
        ahead of it, but calls not so many that each costs more than its episodes."""
        return max(1, -(-self.per_actor // 4))

    def _launch(self, slot: Slot) -> None:
        for held in (self.kept_sent, self.vector_steps):
            held.pop(slot.index, None)  # a new instance: nothing kept or played yet
        super()._launch(slot)

    def _first_asks(self, slot: Slot) -> None:
        """None yet: jobs handed to an instance that never starts (no node has room for it)
        would hold their generation, which waits for every member's first episode. The
        instance gets its first calls once it runs (:meth:`_ask_started`)."""

    def _ask_started(self) -> None:
        """The first calls of each instance that started since the last look (its ``where()``
        answered, or failed: then so do the calls, and the actor is lost with that reason)."""
        for slot in self.slots:
            waiting = slot.state in ("starting", "restarting") and not slot.inflight
            if waiting and slot.where_ref is not None:
                ready, _ = self.ray.wait([slot.where_ref], timeout=0)
                if ready:
                    super()._first_asks(slot)

    def _ask(self, slot: Slot) -> None:
        """More jobs for ``slot``'s actor: as many as its last answer gave back (at an
        instance's first calls, one per environment and :meth:`spare` more, then :meth:`spare`
        for each other call in flight), and the parents if newer."""
        source = self.source
        assert source is not None
        start = self.per_actor + self.spare() if not slot.inflight else self.spare()
        count = self.refill.pop(slot.index, start)
        jobs = [source.take() for _ in range(count)]
        tickets = np.array([t for t, _ in jobs], dtype=np.int64)
        seeds, lengths = pack_genomes([g for _, g in jobs])
        kept = None
        version, parents = source.kept_genomes()
        if self.kept_sent.get(slot.index, -1) < version:
            kept = (version, *pack_genomes(parents))
            self.kept_sent[slot.index] = version
        args = (tickets, seeds, lengths, source.token, self.spare(), kept, ANSWER_EVERY_S)
        self.bytes_out += len(pickle.dumps(args, protocol=5))
        self.outstanding[slot.index] |= set(tickets.tolist())
        ref = slot.handle.play.remote(*args)
        slot.inflight.append(ref)
        self._owner[ref] = slot

    def _lose(self, slot: Slot, error: BaseException) -> None:
        """``slot``'s actor is gone: the jobs it held go back to the learner first."""
        if self.source is not None:
            for ticket in sorted(self.outstanding[slot.index]):
                self.source.release(ticket)
        self.outstanding[slot.index] = set()
        super()._lose(slot, error)


# No game scores this much in an episode (Atari's highest are millions): a larger score is a lie,
# and a few of 1e308 would make the generation's mean infinite.
MAX_SCORE = 1e12


def played_problem(
    played: Any,
    outstanding: set[int],
    num_envs: int,
    steps_before: int,
    longest: int | None = None,
) -> str | None:
    """Why an actor's answer must not be used (None: it may): every field of the type and shape
    asked (plain arrays, not masked ones), each ticket one the actor was given and not answered
    yet, environments it has, finite scores no game reaches beyond, a step count of whole
    vector steps no more than its jobs' episodes could take (each at most ``longest`` steps,
    the game's cap), and episode lengths of at least one step, at most the game's cap and the
    vector steps its instance has taken (``steps_before`` env steps before this answer)."""
    if not isinstance(played, Played):
        return f"it answered a {type(played).__name__}, not the episodes it played"
    arrays = (played.tickets, played.scores, played.lengths, played.envs, played.dropped)
    if not all(type(a) is np.ndarray and a.ndim == 1 for a in arrays):
        return "its answer's fields are not one-dimensional arrays"
    n = len(played.tickets)
    if len(played.scores) != n or len(played.lengths) != n or len(played.envs) != n:
        return "its answer has a score, a length and an environment for some episodes only"
    if any(a.dtype.kind != "i" for a in (played.tickets, played.dropped, played.envs)):
        return "its tickets or environments are not integers"
    if ((played.envs < 0) | (played.envs >= num_envs)).any():
        return "it names environments it does not have"
    given = np.concatenate([played.tickets, played.dropped]).tolist()
    if len(set(given)) != len(given) or not set(given) <= outstanding:
        return "it answered for episodes it was not given"
    if played.scores.dtype.kind != "f" or not np.isfinite(played.scores).all():
        return "its scores are not finite numbers"
    if (np.abs(played.scores) > MAX_SCORE).any():
        return f"its scores are beyond any game's (more than {MAX_SCORE:g} in an episode)"
    steps = played.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0 or steps % num_envs:
        return f"its step count is not a whole number of steps of its {num_envs} environments"
    # Each environment plays its jobs one after another, the one it had under way first.
    if longest is not None and steps // num_envs > longest * (len(outstanding) + 1):
        return "its step count is more than the episodes it was given could take"
    if played.lengths.dtype.kind != "i" or (played.lengths < 1).any():
        return "its episode lengths are not whole numbers of steps"
    if longest is not None and (played.lengths > longest).any():
        return f"it played episodes longer than the game allows ({longest:,} steps)"
    if (played.lengths > (steps_before + steps) // num_envs).any():
        return "it played episodes longer than all its steps"
    return None
