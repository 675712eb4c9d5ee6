"""Several runs of one recipe, summed up as the field does (``edgerl results``): how many seeds
reached the target and when, the final score beside the best, and the interquartile mean (IQM)
with its 95% stratified-bootstrap interval (Agarwal et al. 2021, "Deep RL at the edge of the
statistical precipice"), computed by their library, ``rliable`` (the ``results`` extra).

A run is read from its own files only (:mod:`edgerl.display.seed_runs`): ``eval.csv`` (the
greedy evaluations) and ``config.toml`` (the game, the learner, the seed and the protocol). Runs
are grouped by game and learner; a folder that is not a run but holds runs (``edgerl train
--seeds N`` writes ``seed-K`` folders) stands for those runs.

- **Reached**: the first evaluation whose mean return is at the target or above, within
  ``within_s`` of training time when given (k of n).
- **Final score**: the mean of a run's last ``last`` evaluations, whatever came before; the
  **best** is its best evaluation, shown beside it, never instead of it.
- **IQM** of the final scores over the seeds (one game: a bootstrap over the seeds; several
  games of one learner: over human-normalised scores, stratified by game).
- **Against the field**: OpenAI ES's score after an hour on 720 CPUs where the game has one,
  and, for a learner with runs of all five Atari-5 games, the 57-game median their final scores
  predict (Aitchison et al.'s regression), seed by seed.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.display.seed_runs import LAST, Evaluation, SeedRun
from edgerl.display.seed_runs import find_runs as find_runs  # where results and tests find it
from edgerl.display.seed_runs import read_run as read_run
from edgerl.envs.scores import atari5_median, atari5_weights, es_hour, human_normalised, reference
from edgerl.errors import MissingDependencyError
from edgerl.words import duration, plural

log = logging.getLogger(__name__)

REPS = 10_000  # bootstrap resamples; rliable's default is 50,000 (use --reps for a paper)
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


def _rliable() -> tuple[Any, Any]:
    try:
        from rliable import library, metrics
    except ImportError:
        raise MissingDependencyError("rliable", "results", "edgerl results") from None
    logging.getLogger("absl").setLevel(logging.WARNING)  # "Calculating estimates for ..."
    return library, metrics


def _estimates(library: Any, scores: np.ndarray, func: Any, reps: int) -> tuple[Any, Any]:
    """rliable's point estimates and 95% intervals of ``func`` over ``scores`` (runs x tasks
    [x points]), seeded: the same figures every time."""
    with warnings.catch_warnings():  # arch's notice that it will take a Generator one day
        warnings.simplefilter("ignore", FutureWarning)
        point, interval = library.get_interval_estimates(
            {"r": scores}, func, reps=reps, random_state=np.random.RandomState(0)
        )
    return point["r"], interval["r"]


def iqm_interval(scores: np.ndarray, reps: int = REPS) -> tuple[float, float, float]:
    """The IQM of ``scores`` (runs x tasks) and its 95% stratified-bootstrap interval, by
    rliable (seeded: the same figures every time)."""
    library, metrics = _rliable()
    func = lambda x: np.array([metrics.aggregate_iqm(x)])  # noqa: E731
    point, interval = _estimates(library, scores, func, reps)
    return float(point[0]), float(interval[0, 0]), float(interval[1, 0])


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
    finals: list[float]
    iqm: tuple[float, float, float]
    human: tuple[float, float, float] | None  # the IQM of human-normalised finals

    @property
    def k(self) -> int:
        return sum(r is not None for r in self.reached)

    def to_dict(self) -> dict[str, Any]:
        times = [r.wall_s for r in self.reached if r is not None]
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
                    "reached_wall_s": None if hit is None else hit.wall_s,
                    "final": final,
                    "best": run.best,
                    "last_step": run.evaluations[-1].step,
                }
                for run, hit, final in zip(self.runs, self.reached, self.finals, strict=True)
            ],
            "reached": self.k,
            "median_wall_s_to_target": float(np.median(times)) if times else None,
            "final_iqm": {"point": self.iqm[0], "ci95": list(self.iqm[1:])},
            "human_normalised_final_iqm": None
            if self.human is None
            else {"point": self.human[0], "ci95": list(self.human[1:])},
            "es_hour": es_hour(self.game),
            "protocol": protocol(self.runs[0]),
        }


def figures(
    runs: Sequence[SeedRun],
    target: float | None = None,
    within_s: float | None = None,
    last: int = LAST,
    reps: int = REPS,
) -> Figures:
    """The figures of ``runs`` (one game and learner)."""
    game = runs[0].game
    target_is = "the given target"
    if target is None and (found := default_target(game)) is not None:
        target, target_is = found
    reached = [None if target is None else r.first_at(target, within_s) for r in runs]
    finals = [r.final(last) for r in runs]
    iqm = iqm_interval(np.array(finals)[:, None], reps)
    human = None
    normalised = [human_normalised(game, f) for f in finals]
    if all(h is not None for h in normalised):
        human = iqm_interval(np.array(normalised, dtype=float)[:, None], reps)
    return Figures(
        game, runs[0].learner, list(runs), target, target_is, within_s, reached, finals, iqm, human
    )


Group = tuple[str, str]  # game, learner


def grouped(runs: Iterable[SeedRun]) -> dict[Group, list[SeedRun]]:
    """Runs by game and learner (the runs given are the ones to compare: a run made before
    recipes were recorded joins the seeds of its recipe), each group by seed."""
    groups: dict[Group, list[SeedRun]] = {}
    for run in runs:
        groups.setdefault((run.game, run.learner), []).append(run)
    return {k: sorted(v, key=lambda r: (r.seed, str(r.path))) for k, v in groups.items()}


def across_games(groups: dict[Group, list[SeedRun]], last: int, reps: int) -> list[str]:
    """For each learner with runs of two Atari games or more: the IQM of the human-normalised
    final scores over games and seeds, stratified by game (as many seeds of each: the lowest)."""
    lines = []
    for learner in sorted({k[1] for k in groups}):
        games = [k for k in groups if k[1] == learner and reference(k[0]) is not None]
        if len({k[0] for k in games}) < 2:
            continue
        n = min(len(groups[k]) for k in games)
        scores = np.array(
            [[human_normalised(k[0], groups[k][i].final(last)) for k in games] for i in range(n)],
            dtype=float,
        )
        point, low, high = iqm_interval(scores, reps)
        lines.append(
            f"{learner.upper()} over {plural(len(games), 'game')} x {plural(n, 'seed')}: "
            f"human-normalised final IQM {point:.2f} [95% CI {low:.2f}, {high:.2f}]"
        )
        if (predicted := atari5_line(learner, groups, last)) is not None:
            lines.append(predicted)
    return lines


def atari5_line(learner: str, groups: dict[Group, list[SeedRun]], last: int) -> str | None:
    """The 57-game median that the learner's final scores on the five Atari-5 games predict,
    seed by seed (the i-th seed of each game together, as many as the game with fewest), or
    None where a game of the five has no run."""
    five = {k[0]: groups[k] for k in groups if k[1] == learner and k[0] in atari5_games()}
    if len(five) < len(atari5_weights()):
        return None
    n = min(len(runs) for runs in five.values())
    predicted = [
        atari5_median({g: runs[i].final(last) for g, runs in five.items()}) for i in range(n)
    ]
    per_seed = ", ".join(f"{p:.2f}" for p in predicted if p is not None)  # None: not five
    return (
        f"{learner.upper()} on Atari-5 (Aitchison et al. 2022): the final scores predict a "
        f"57-game median human-normalised score of {per_seed} ({plural(n, 'seed')}; the "
        "regression's own error is about 10%)"
    )


def atari5_games() -> set[str]:
    """The env ids of the Atari-5 games (``ALE/BattleZone-v5``, ...)."""
    return {
        "ALE/" + "".join(w.capitalize() for w in g.split("_")) + "-v5" for g in atari5_weights()
    }


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


def describe(f: Figures, last: int = LAST) -> str:
    """The figures of one game and learner, a few lines."""
    seeds = ("seeds " if len(f.runs) > 1 else "seed ") + ", ".join(str(r.seed) for r in f.runs)
    named = sorted({r.recipe for r in f.runs if r.recipe})
    recipe = "".join(f", {n}" for n in named)
    lines = [f"{f.game}, {f.learner.upper()}{recipe}: {plural(len(f.runs), 'run')} ({seeds})"]
    if f.target is None:
        lines.append("  no target: give one with --target")
    else:
        within = "" if f.within_s is None else f" within {duration(f.within_s)}"
        hits = [r for r in f.reached if r is not None]
        line = f"  reached {f.target:g} ({f.target_is}){within}: {f.k} of {len(f.runs)}"
        if hits:
            times = sorted(h.wall_s for h in hits)
            line += f"; median time to it {duration(float(np.median(times)))}"
            line += " (" + ", ".join(f"step {h.step:,} at {duration(h.wall_s)}" for h in hits) + ")"
        lines.append(line)
    per_seed = ", ".join(f"{v:.1f}" for v in f.finals)
    point, low, high = f.iqm
    lines.append(
        f"  final score (mean of the last {plural(last, 'evaluation')}): IQM {point:.1f} "
        f"[95% CI {low:.1f}, {high:.1f}]; per seed {per_seed}"
    )
    lines.append("  best evaluation, per seed: " + ", ".join(f"{r.best:.1f}" for r in f.runs))
    if f.human is not None:
        point, low, high = f.human
        lines.append(f"  human-normalised final: IQM {point:.2f} [95% CI {low:.2f}, {high:.2f}]")
    if (es := es_hour(f.game)) is not None:
        above = sum(final > es for final in f.finals)
        lines.append(
            f"  OpenAI ES after an hour on 720 CPUs (Salimans et al. 2017): {es:g}; "
            f"final scores above it: {above} of {len(f.finals)}"
        )
    lines.append(f"  protocol: {protocol(f.runs[0])}")
    return "\n".join(lines)


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


def save_picture(groups: dict[Group, list[SeedRun]], path: Path, by: str, reps: int) -> None:
    """The sample-efficiency curves: each group's IQM over its seeds at every evaluation up to
    the shortest seed's last, the 95% stratified-bootstrap band around it (rliable), and each
    seed's own curve whole, thin."""
    from edgerl.display.plot import pyplot, save_figure

    library, metrics = _rliable()
    plt = pyplot("edgerl results' picture")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for (game, learner), runs in groups.items():
        grid, values = curve(runs, by)
        keep = ~np.isnan(values).any(axis=0)
        grid, values = grid[keep], values[:, keep]
        x = grid / 60 if by == "time" else grid
        label = f"{game} {learner.upper()} ({plural(len(runs), 'seed')})"
        if len(grid):
            point, interval = _estimates(
                library,
                values[:, None, :],
                lambda s: np.array([metrics.aggregate_iqm(s[..., j]) for j in range(s.shape[-1])]),
                max(200, reps // 10),  # one estimate per evaluation: fewer resamples each
            )
            (line,) = ax.plot(x, point, lw=2, label=f"{label}: IQM, 95% CI")
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
