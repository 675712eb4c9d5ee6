"""A learner's runs over several Atari games, as ``edgerl results`` sums them up after each
game's own figures (:mod:`edgerl.display.seeds`): the IQM of the human-normalised final scores
over the games, stratified by game, and for a learner with runs of all five Atari-5 games the
57-game median their final scores predict (Aitchison et al.'s regression), seed by seed and over
the seeds. Both take the seeds every game has exactly one run of (:func:`by_seed`) and name the
rest: a seed some game has two runs of is left out rather than one of them chosen.
"""

from __future__ import annotations

import numpy as np

from edgerl.display.seed_runs import SeedRun
from edgerl.display.seeds import REPS, Group, iqm_estimate
from edgerl.envs.scores import atari5_median, atari5_weights, human_normalised, reference
from edgerl.words import plural


def by_seed(
    runs_of: dict[str, list[SeedRun]],
) -> tuple[dict[int, dict[str, SeedRun]], list[str]]:
    """The seeds every game of ``runs_of`` (game -> its runs) has exactly one run of, each as
    {game: run}, and each seed left out, in words: one some game has no run of, or two runs of
    (two hours of one seed: choosing the better would be a best-of, and which ran first, the
    one docs/results.md's rule counts, is not in a run's files)."""
    seeds: dict[int, dict[str, SeedRun]] = {}
    left_out = []
    for seed in sorted({r.seed for runs in runs_of.values() for r in runs}):
        found = {g: [r for r in runs if r.seed == seed] for g, runs in runs_of.items()}
        if missing := sorted(g for g, runs in found.items() if not runs):
            left_out.append(f"seed {seed} left out (no run of {', '.join(missing)})")
        elif doubled := sorted(g for g, runs in found.items() if len(runs) > 1):
            twice = ", ".join(f"{g} has {len(found[g])} runs of it" for g in doubled)
            left_out.append(f"seed {seed} left out ({twice})")
        else:
            seeds[seed] = {g: runs[0] for g, runs in found.items()}
    return seeds, left_out


def across_games(
    groups: dict[Group, list[SeedRun]], last: int, reps: int, within_s: float | None = None
) -> list[str]:
    """For each learner with runs of two Atari games or more: the IQM of the human-normalised
    final scores (within ``within_s`` of training) over games and seeds, stratified by game,
    from the seeds every game has one run of (:func:`by_seed`; the rest named); from fewer than
    :data:`MIN_RUNS` seeds, the range of the seeds' own IQMs over the games instead of an
    interval."""
    lines = []
    for learner in sorted({k[1] for k in groups}):
        runs_of = {
            k[0]: groups[k] for k in groups if k[1] == learner and reference(k[0]) is not None
        }
        if len(runs_of) < 2:
            continue
        seeds, left_out = by_seed(runs_of)
        said = f"{learner.upper()} over {plural(len(runs_of), 'game')}"
        if seeds:
            scores = np.array(
                [
                    [human_normalised(g, run.final(last, within_s)) for g, run in runs.items()]
                    for runs in seeds.values()
                ],
                dtype=float,
            )
            n = plural(len(seeds), "seed")
            estimate = iqm_estimate(scores, reps)
            said += f" x {n}: human-normalised final {estimate.said(2, n + ' a game')}"
        else:
            said += ": no seed has one run of each game"
        lines.append("; ".join([said, *left_out]))
        if (predicted := atari5_line(learner, groups, last, within_s, reps)) is not None:
            lines.append(predicted)
    return lines


def atari5_line(
    learner: str,
    groups: dict[Group, list[SeedRun]],
    last: int,
    within_s: float | None = None,
    reps: int = REPS,
) -> str | None:
    """The 57-game median that the learner's final scores (within ``within_s`` of training) on
    the five Atari-5 games predict, seed by seed (a seed's five runs together, for the seeds
    each game has one run of: :func:`by_seed`, the rest named) and over those seeds (their IQM
    and range; from :data:`MIN_RUNS` seeds up its interval); None where a game of the five has
    no run."""
    five = {k[0]: groups[k] for k in groups if k[1] == learner and k[0] in atari5_games()}
    if len(five) < len(atari5_weights()):
        return None
    seeds, left_out = by_seed(five)
    said = f"{learner.upper()} on Atari-5 (Aitchison et al. 2022): "
    if not seeds:
        return "; ".join([said + "no seed has one run of each of the five games", *left_out])
    predicted = {
        seed: atari5_median({g: run.final(last, within_s) for g, run in runs.items()})
        for seed, runs in seeds.items()
    }  # all five games given: never None
    per_seed = ", ".join(f"{p:.2f} (seed {seed})" for seed, p in predicted.items())
    parts = [
        said + f"the final scores predict a 57-game median human-normalised score of {per_seed}"
    ]
    if len(predicted) > 1:
        n = plural(len(predicted), "seed")
        estimate = iqm_estimate(np.array(list(predicted.values()), dtype=float)[:, None], reps)
        parts.append(f"over the {n} {estimate.said(2, n)}")
    return "; ".join([*parts, *left_out, "the regression's own error is about 10%"])


def atari5_games() -> set[str]:
    """The env ids of the Atari-5 games (``ALE/BattleZone-v5``, ...)."""
    return {
        "ALE/" + "".join(w.capitalize() for w in g.split("_")) + "-v5" for g in atari5_weights()
    }
