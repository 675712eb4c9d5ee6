"""Where a generation of the genetic algorithm (:mod:`edgerl.learners.ga`) stands: its members,
the candidates for its elite, and what each one's episodes scored, in the order they were handed
out. A job's episode still under way holds its place (:data:`PLAYING`); only the episodes before
the first one under way count, so which episodes count never depends on how long they were."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgerl.learners.population import Genome

PLAYING = float("nan")  # an episode's place in a job's scores while it is under way


def finished(episodes: list[float]) -> int:
    """How many of a job's episodes are in (a place still :data:`PLAYING` is not)."""
    return sum(1 for score in episodes if score == score)


def first_in(episodes: list[float]) -> int:
    """How many of a job's episodes are in before the first one still under way: only those
    count, so that which episodes count does not depend on how long they were (a short one
    handed out later ends first)."""
    return next((i for i, score in enumerate(episodes) if score != score), len(episodes))


@dataclass
class Generation:
    """Where the search stands: this generation's members and, while the elite is being chosen,
    the previous generation's best (the candidates), and what each one's episodes scored, in
    the order they were handed out (:data:`PLAYING` where one is still under way)."""

    number: int
    members: list[Genome | None]  # member 0: the elite, None until the candidates chose it
    scores: list[list[float]]  # each member's episodes (the elite's: its candidate episodes)
    candidates: list[Genome] = field(default_factory=list)  # playing for the elite
    trials: list[list[float]] = field(default_factory=list)  # each candidate's episodes

    @property
    def choosing(self) -> bool:
        """Whether the candidates still play for the elite (member 0)."""
        return self.members[0] is None

    @property
    def compared(self) -> range:
        """The members ranked against each other, each over as many episodes: every one, or,
        where member 0 is an elite chosen over its candidate episodes, the children."""
        return range(1 if self.candidates else 0, len(self.members))

    def fitness(self, member: int, episodes: int) -> float:
        """A member's fitness: the mean score of its first ``episodes`` episodes."""
        return float(np.mean(self.scores[member][:episodes]))

    def finished(self) -> np.ndarray:
        """The episodes in of every job: each member's, then each candidate's."""
        return np.array([finished(r) for r in self.scores + self.trials], dtype=np.int64)

    def common_episodes(self) -> int:
        """The episodes every compared member has in, from its first: what each one's fitness
        is the mean of (one, unless spare environments played them all again)."""
        return min(first_in(self.scores[m]) for m in self.compared)


def check_saved(g: Generation, elite: Genome | None, seeds: int, cost: int, free: int) -> None:
    """Raises ValueError when ``g`` and ``elite``, read from a checkpoint, are no search's: a
    seed outside ``range(seeds)``, a genome empty or longer than its generation, scores that
    are not one list per job, or more weights to rebuild (``cost`` bytes a genome) than the
    ``free`` bytes of memory hold (a few megabytes of seeds can name millions of parents)."""
    genomes = [m for m in g.members if m is not None] + g.candidates
    genomes += [elite] if elite is not None else []
    for genome in genomes:
        if not 1 <= len(genome) <= g.number + 1 or not all(
            type(seed) is int and 0 <= seed < seeds for seed in genome
        ):
            raise ValueError(f"a genome that generation {g.number:,} cannot have")
    if len(g.scores) != len(g.members) or len(g.trials) != len(g.candidates):
        raise ValueError("scores that are not one list per member and candidate")
    kept = {m[:-1] for m in g.members[1:] if m is not None and len(m) > 1}
    kept |= set(g.candidates) | ({elite} if elite is not None else set())
    if len(kept) * cost > free:
        raise ValueError(
            f"{len(kept):,} parents and candidates to rebuild, {len(kept) * cost / 2**30:,.1f} "
            f"GiB of weights where {free / 2**30:,.1f} GiB of memory is free"
        )
