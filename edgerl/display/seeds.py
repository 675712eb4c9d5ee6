"""Several runs of one recipe, summed up as the field does (``edgerl results``): how many seeds
reached the target and when, how many held it, the final score beside the best, and the
interquartile mean (IQM) with its 95% stratified-bootstrap interval (Agarwal et al. 2021, "Deep
RL at the edge of the statistical precipice"), computed by their library, ``rliable`` (the
``results`` extra), from 5 runs up; from fewer, the range of the runs instead.

A run is read from its own files only (:mod:`edgerl.display.seed_runs`): ``eval.csv`` (the
greedy evaluations) and ``config.toml`` (the game, the learner, the seed and the protocol). Runs
are grouped by game and learner; a folder that is not a run but holds runs (``edgerl train
--seeds N`` writes ``seed-K`` folders) stands for those runs.

- **Within** ``within_s`` of training time, when given: only the evaluations whose result came
  within it (began and ended: training goes on while one plays) count, for every figure below.
- **Reached**: the first evaluation whose mean return is at the target or above (k of n); its
  time is when that evaluation ended, the time it began said beside it.
- **Held**: the run's final score is at the target or above.
- **Final score**: the mean of a run's last ``last`` evaluations, whatever came before; the
  **best** is its best evaluation, shown beside it, never instead of it.
- **IQM** of the final scores over the seeds (one game: a bootstrap over the seeds; several
  games of one learner: over human-normalised scores, stratified by game). From fewer than
  :data:`MIN_RUNS` runs no interval is given: a percentile bootstrap of 3 runs' IQM is their
  [min, max], of 4 the middle two's range, an interval in name only; the range is said instead.
- **Against the field**: OpenAI ES's score after an hour on 720 CPUs where the game has one;
  over several games of one learner, :mod:`edgerl.display.across_games`.
- **One run a seed**: a seed given two runs or more (an hour rerun beside its first) is left
  out and its runs named (:func:`one_run_a_seed`): docs/results.md's rule counts the first
  started, which a run's files do not say, and taking both or the better would be a best-of.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.display.seed_runs import LAST, Evaluation, SeedRun
from edgerl.display.seed_runs import find_runs as find_runs  # where results and tests find it
from edgerl.display.seed_runs import read_run as read_run
from edgerl.envs.scores import es_hour, human_normalised, reference
from edgerl.errors import MissingDependencyError, RunDirError
from edgerl.words import duration, plural

log = logging.getLogger(__name__)

REPS = 50_000  # bootstrap resamples: rliable's default
MIN_RUNS = 5  # fewer runs than this: no interval, the range of the runs instead
HUMAN_FRAMES = 18_000  # the human reference: 5 minutes of play at 60 frames a second


def default_target(game: str) -> tuple[float, str] | None:
    """The target a game's runs are judged by when none is given: the human reference score
    of an Atari game, gymnasium's reward threshold of another (CartPole-v1: 475)."""
    ref = reference(game)
    if ref is not None:
        return ref.human, "the human reference"
    try:
        import gymnasium

        threshold = gymnasium.spec(game).reward_threshold
    except Exception:  # not registered here: no default
        return None
    return (float(threshold), "gymnasium's reward threshold") if threshold is not None else None


def _rliable() -> Any:
    try:
        from rliable import library
    except ImportError:
        raise MissingDependencyError("rliable", "results", "edgerl results") from None
    logging.getLogger("absl").setLevel(logging.WARNING)  # "Calculating estimates for ..."
    return library


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of all of ``scores``: rliable's ``aggregate_iqm`` (SciPy's
    ``trim_mean(scores, 0.25, axis=None)``) step for step, the same float, without SciPy's
    checks, which cost most of a bootstrap of 50,000 resamples."""
    a = np.ravel(np.asarray(scores, dtype=float))
    low = int(0.25 * a.size)
    high = a.size - low
    return float(np.mean(np.partition(a, (low, high - 1))[low:high]))


def _estimates(library: Any, scores: np.ndarray, func: Any, reps: int) -> tuple[Any, Any]:
    """rliable's point estimates and 95% intervals of ``func`` over ``scores`` (runs x tasks
    [x points]), seeded: the same figures every time. rliable's stratified bootstrap draws its
    resamples from NumPy's global generator (``np.random.choice``), not from the
    ``random_state`` it is given, so that generator is seeded for the call and given back its
    state after: without it two calls printed intervals a resample apart (20.1 and 20.2)."""
    state = np.random.get_state()
    try:
        np.random.seed(0)
        with warnings.catch_warnings():  # arch's notice that it will take a Generator one day
            warnings.simplefilter("ignore", FutureWarning)
            point, interval = library.get_interval_estimates(
                {"r": scores}, func, reps=reps, random_state=np.random.RandomState(0)
            )
    finally:
        np.random.set_state(state)
    return point["r"], interval["r"]


@dataclass(frozen=True)
class Estimate:
    """An IQM over runs and how far to trust it: rliable's 95% interval from :data:`MIN_RUNS`
    runs up (``ci95``), and always the range of the runs' own IQMs (``spread``)."""

    point: float
    runs: int
    spread: tuple[float, float]
    ci95: tuple[float, float] | None

    def said(self, digits: int, runs: str = "") -> str:
        """``IQM 19.7 [95% CI 19.2, 20.9]``, or from fewer runs ``IQM 19.2, range 17.5-20.9
        (4 runs: no interval from fewer than 5)``; ``runs`` names them (``2 seeds a game``)."""
        said = f"IQM {self.point:.{digits}f}"
        if self.ci95 is not None:
            low, high = self.ci95
            return said + f" [95% CI {low:.{digits}f}, {high:.{digits}f}]"
        if self.runs > 1:
            said += f", range {span(*self.spread, digits)}"
        return (
            said + f" ({runs or plural(self.runs, 'run')}: no interval from fewer than {MIN_RUNS})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "point": self.point,
            "runs": self.runs,
            "ci95": None if self.ci95 is None else list(self.ci95),
            "range": list(self.spread),
        }


def span(low: float, high: float, digits: int) -> str:
    """``17.5-20.9``, or ``-5.4 to 17.7`` where a minus sign would read as the dash."""
    sep = " to " if min(low, high) < 0 else "-"
    return f"{low:.{digits}f}{sep}{high:.{digits}f}"


def iqm_estimate(scores: np.ndarray, reps: int = REPS) -> Estimate:
    """The IQM of ``scores`` (runs x tasks), the range of each run's own IQM over the tasks,
    and from :data:`MIN_RUNS` runs up its 95% stratified-bootstrap interval, by rliable
    (seeded: the same figures every time). Raises MissingDependencyError without rliable."""
    library = _rliable()
    per_run = [iqm(row) for row in scores]
    estimate = Estimate(iqm(scores), len(scores), (min(per_run), max(per_run)), None)
    if len(scores) < MIN_RUNS:
        return estimate
    _, interval = _estimates(library, scores, lambda x: np.array([iqm(x)]), reps)
    return Estimate(
        estimate.point,
        estimate.runs,
        estimate.spread,
        (float(interval[0, 0]), float(interval[1, 0])),
    )


@dataclass
class Figures:
    """What ``edgerl results`` says of one game and learner."""

    game: str
    learner: str
    runs: list[SeedRun]
    target: float | None
    target_is: str
    within_s: float | None
    reached: list[Evaluation | None]
    finals: list[float]  # each run's, from its evaluations within within_s
    bests: list[float]  # each run's best evaluation within within_s
    iqm: Estimate
    human: Estimate | None  # the IQM of human-normalised finals
    left_out: list[str] = field(default_factory=list)  # seeds given more than one run, in words

    @property
    def k(self) -> int:
        """Runs that reached the target: one evaluation at it or above."""
        return sum(r is not None for r in self.reached)

    @property
    def held(self) -> list[bool]:
        """Whether each run held the target: its final score at it or above."""
        return [self.target is not None and f >= self.target for f in self.finals]

    @property
    def median_s_to_target(self) -> float | None:
        """The median training time, over the runs that reached the target, at which the
        evaluation that reached it ended (its result known); None where none did."""
        times = [r.ended_s for r in self.reached if r is not None]
        return float(np.median(times)) if times else None

    @property
    def median_s_over_runs(self) -> float | None:
        """The median over every run, a run that did not reach the target counted as later
        than all that did (it was not there when its window ended); None where that median
        falls on such a run: half or more did not reach it."""
        times = [math.inf if r is None else r.ended_s for r in self.reached]
        median = float(np.median(times)) if times else math.inf
        return median if math.isfinite(median) else None

    def to_dict(self) -> dict[str, Any]:
        rows = zip(self.runs, self.reached, self.finals, self.held, self.bests, strict=True)
        return {
            "game": self.game,
            "learner": self.learner,
            "target": self.target,
            "within_s": self.within_s,
            "runs": [
                {
                    "path": str(run.path),
                    "seed": run.seed,
                    "reached_step": None if hit is None else hit.step,
                    "reached_wall_s": None if hit is None else hit.wall_s,  # when it began
                    "reached_ended_s": None if hit is None else hit.ended_s,
                    "final": final,
                    "held": held,
                    "best": best,
                    "last_step": run.within(self.within_s)[-1].step,
                }
                for run, hit, final, held, best in rows
            ],
            "reached": self.k,
            "held": sum(self.held),
            # when the evaluation that reached the target ended (the result known)
            "median_wall_s_to_target": self.median_s_to_target,  # of the runs that reached it
            "median_wall_s_to_target_all_runs": self.median_s_over_runs,
            "final_iqm": self.iqm.to_dict(),
            "human_normalised_final_iqm": None if self.human is None else self.human.to_dict(),
            "es_hour": es_hour(self.game),
            "protocol": protocol(self.runs[0]),
            "left_out": self.left_out,
        }


def figures(
    runs: Sequence[SeedRun],
    target: float | None = None,
    within_s: float | None = None,
    last: int = LAST,
    reps: int = REPS,
) -> Figures:
    """The figures of ``runs`` (one game and learner), each from the evaluations whose result
    came within ``within_s`` of training (all for None), one run a seed (:func:`one_run_a_seed`).
    Raises RunDirError for a run none of whose evaluations ended within it or where every seed
    has two runs, MissingDependencyError without rliable."""
    game = runs[0].game
    given, (runs, left_out) = runs, one_run_a_seed(runs)
    if not runs:
        raise RunDirError(
            f"{game}, {given[0].learner.upper()}: every seed given has more than one run "
            f"({'; '.join(left_out)}): give the first run of each seed"
        )
    target_is = "the given target"
    if target is None and (found := default_target(game)) is not None:
        target, target_is = found
    reached = [None if target is None else r.first_at(target, within_s) for r in runs]
    finals = [r.final(last, within_s) for r in runs]
    bests = [r.best_within(within_s) for r in runs]
    estimate = iqm_estimate(np.array(finals)[:, None], reps)
    human = None
    normalised = [human_normalised(game, f) for f in finals]
    if all(h is not None for h in normalised):
        human = iqm_estimate(np.array(normalised, dtype=float)[:, None], reps)
    return Figures(
        game,
        runs[0].learner,
        list(runs),
        target,
        target_is,
        within_s,
        reached,
        finals,
        bests,
        estimate,
        human,
        left_out,
    )


def one_run_a_seed(runs: Sequence[SeedRun]) -> tuple[list[SeedRun], list[str]]:
    """The runs of ``runs`` (one game and learner) whose seed no other of them has, and each
    seed left out, in words: two runs of one seed are a rerun beside its first, and the first
    started, the one docs/results.md's rule counts, is not in a run's files."""
    of_seed: dict[int, list[SeedRun]] = {}
    for run in runs:
        of_seed.setdefault(run.seed, []).append(run)
    kept = [run for run in runs if len(of_seed[run.seed]) == 1]
    left_out = [
        f"seed {seed} left out: {len(twice)} runs of it given "
        f"({', '.join(str(r.path) for r in twice)}), and only its first counts"
        for seed, twice in of_seed.items()
        if len(twice) > 1
    ]
    return kept, left_out


Group = tuple[str, str]  # game, learner


def grouped(runs: Iterable[SeedRun]) -> dict[Group, list[SeedRun]]:
    """Runs by game and learner (the runs given are the ones to compare: a run made before
    recipes were recorded joins the seeds of its recipe), each group by seed."""
    groups: dict[Group, list[SeedRun]] = {}
    for run in runs:
        groups.setdefault((run.game, run.learner), []).append(run)
    return {k: sorted(v, key=lambda r: (r.seed, str(r.path))) for k, v in groups.items()}


def protocol(run: SeedRun) -> str:
    """How the run's evaluations were played, in words (from its config.toml)."""
    ev = run.eval
    said = [
        f"{ev.get('episodes', '?')} greedy episodes an evaluation at epsilon "
        f"{ev.get('epsilon', '?')}"
    ]
    if run.game.startswith("ALE/"):
        env = run.env
        sticky = env.get("repeat_action_probability", 0.25)
        said.append(
            "sticky actions off" if sticky == 0 else f"sticky actions at {sticky} (Machado 2018)"
        )
        said.append(f"up to {env.get('noop_max', 30)} no-op starts")
        frames = env.get("max_episode_frames", 108_000)
        cap = f"episodes cut at {frames:,} frames" if isinstance(frames, int) else "episodes cut"
        if isinstance(frames, int) and frames > HUMAN_FRAMES:
            cap += f" (the human reference played {HUMAN_FRAMES:,}: 5 minutes)"
        said.append(cap)
        said.append("the full game, not one life")
    return "; ".join(said)


def final_evaluations(f: Figures, last: int) -> str:
    """Which evaluations each final score is the mean of, in words: the last ``last``, or as
    many as a run has where it has fewer."""
    counts = sorted({min(last, len(r.within(f.within_s))) for r in f.runs})
    if counts == [last]:
        return f"the last {plural(last, 'evaluation')}"
    if len(counts) == 1:
        return f"its {plural(counts[0], 'evaluation')}, fewer than {last}"
    fewer = ", ".join(str(c) for c in counts if c < last)
    return f"the last {last} evaluations, all of a run's where it has fewer ({fewer})"


def median_words(f: Figures, median: float) -> str:
    """The median time to the target in words: over every run, where some did not reach it
    beside the median of those that did (which alone would forget the others)."""
    n = len(f.runs)
    if f.k == n:
        return f"median time to it {duration(median)}"
    missed = n - f.k
    theirs = f"{duration(median)} of the {f.k} that reached it"
    if (everyone := f.median_s_over_runs) is None:
        return f"no median time to it over all {n} runs ({missed} did not reach it); {theirs}"
    return (
        f"median time to it {duration(everyone)} over all {n} runs (the {missed} that did not "
        f"reach it counted as later), {theirs}"
    )


def describe(f: Figures, last: int = LAST) -> str:
    """The figures of one game and learner, a few lines."""
    seeds = ("seeds " if len(f.runs) > 1 else "seed ") + ", ".join(str(r.seed) for r in f.runs)
    named = sorted({r.recipe for r in f.runs if r.recipe})
    recipe = "".join(f", {n}" for n in named)
    lines = [f"{f.game}, {f.learner.upper()}{recipe}: {plural(len(f.runs), 'run')} ({seeds})"]
    lines += [f"  {words}" for words in f.left_out]
    n = len(f.runs)
    within = "" if f.within_s is None else f" within {duration(f.within_s)}"
    if f.target is None:
        lines.append("  no target: give one with --target")
    else:
        hits = [r for r in f.reached if r is not None]
        line = (
            f"  target {f.target:g} ({f.target_is}){within}: {f.k} of {n} reached it (one "
            f"evaluation at it or above), {sum(f.held)} of {n} held it (final score at it or above)"
        )
        if (median := f.median_s_to_target) is not None:
            line += f"; {median_words(f, median)}, when the evaluation that "
            steps = ", ".join(f"step {h.step:,}: {began_ended(h)}" for h in hits)
            line += f"reached it ended ({steps})"
        lines.append(line)
    per_seed = ", ".join(f"{v:.1f}" for v in f.finals)
    ended = "" if f.within_s is None else f" that ended{within}"
    lines.append(
        f"  final score (mean of {final_evaluations(f, last)}{ended}): "
        f"{f.iqm.said(1)}; per seed {per_seed}"
    )
    lines.append(f"  best evaluation{within}, per seed: " + ", ".join(f"{b:.1f}" for b in f.bests))
    if f.human is not None:
        lines.append(f"  human-normalised final: {f.human.said(2)}")
    if (es := es_hour(f.game)) is not None:
        above = sum(final > es for final in f.finals)
        lines.append(
            f"  OpenAI ES after an hour on 720 CPUs (Salimans et al. 2017): {es:g}; "
            f"final scores above it: {above} of {len(f.finals)}"
        )
    lines.append(f"  protocol: {protocol(f.runs[0])}")
    return "\n".join(lines)


def began_ended(e: Evaluation) -> str:
    """``40 min 35 s to 41 min 7 s``: when an evaluation began and ended, in training time."""
    return f"{duration(e.wall_s)} to {duration(e.ended_s)}"


def curve(runs: Sequence[SeedRun], by: str) -> tuple[np.ndarray, np.ndarray]:
    """The runs' evaluations on one grid (``by`` "steps" or "time"): every evaluation's x up
    to the shortest run's last, each run's value there its last evaluation at or before it
    (NaN before its first). Returns (x, values of shape runs x points)."""
    xs = [
        np.array([e.step if by == "steps" else e.wall_s for e in r.evaluations], dtype=float)
        for r in runs
    ]
    end = min(x[-1] for x in xs)
    grid = np.unique(np.concatenate([x[x <= end] for x in xs]))
    values = np.full((len(runs), len(grid)), math.nan)
    for i, (x, run) in enumerate(zip(xs, runs, strict=True)):
        means = np.array([e.mean for e in run.evaluations])
        at = np.searchsorted(x, grid, side="right") - 1
        values[i, at >= 0] = means[at[at >= 0]]
    return grid, values


def curve_band(library: Any, values: np.ndarray, reps: int) -> tuple[Any, Any, str]:
    """The IQM over seeds (rows of ``values``) at each evaluation (columns), the band around
    it (low and high rows) and what the band is: rliable's 95% stratified-bootstrap interval
    from :data:`MIN_RUNS` seeds up, else the seeds' own range (a bootstrap of a few seeds' IQM
    gives little more than that range, and would be called an interval)."""
    if len(values) < MIN_RUNS:
        point = np.array([iqm(values[:, j]) for j in range(values.shape[1])])
        band = np.stack([values.min(axis=0), values.max(axis=0)])
        return point, band, f"range (no interval from fewer than {MIN_RUNS} seeds)"
    point, interval = _estimates(
        library,
        values[:, None, :],
        lambda s: np.array([iqm(s[..., j]) for j in range(s.shape[-1])]),
        max(200, reps // 10),  # one estimate per evaluation: fewer resamples each
    )
    return point, interval, "95% CI"


def save_picture(groups: dict[Group, list[SeedRun]], path: Path, by: str, reps: int) -> None:
    """The sample-efficiency curves: each group's IQM over its seeds at every evaluation up to
    the shortest seed's last, the band around it (rliable's 95% stratified-bootstrap interval
    from :data:`MIN_RUNS` seeds up; from fewer, the seeds' own range, and the legend says
    which), and each seed's own curve whole, thin."""
    from edgerl.display.plot import pyplot, save_figure

    library = _rliable()
    plt = pyplot("edgerl results' picture")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for (game, learner), runs in groups.items():
        grid, values = curve(runs, by)
        keep = ~np.isnan(values).any(axis=0)
        grid, values = grid[keep], values[:, keep]
        x = grid / 60 if by == "time" else grid
        label = f"{game} {learner.upper()} ({plural(len(runs), 'seed')})"
        if len(grid):
            point, interval, band = curve_band(library, values, reps)
            (line,) = ax.plot(x, point, lw=2, label=f"{label}: IQM, {band}")
            ax.fill_between(x, interval[0], interval[1], alpha=0.2, color=line.get_color())
            for run in runs:  # each seed whole, beyond the shortest one too
                seed_x = [e.step if by == "steps" else e.wall_s / 60 for e in run.evaluations]
                seed_y = [e.mean for e in run.evaluations]
                ax.plot(seed_x, seed_y, lw=0.6, alpha=0.5, color=line.get_color())
    ax.set_xlabel("training time (minutes)" if by == "time" else "env steps")
    ax.set_ylabel("greedy evaluation return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    try:
        save_figure(fig, path)
    finally:
        plt.close(fig)
