"""What the service and ``--preset board`` train for a game: the calibrated recipe
(:mod:`edgerl.run.calibrate`) for a game the runs on record trained, its family's for another,
each said in the log; evaluations that fit the run's length.

The runs on record are Pong's, so a game they do not cover is never measured as Pong: another
Atari game trains the class's recipe as it is (its settings are made for any Atari game,
``atari-cpu``), a game of another family (frames that are not Atari's, vector observations,
continuous actions) the defaults for its kind, as ``edgerl train --env`` gives them.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from edgerl.config import Config, Layer, with_values
from edgerl.hw.recipe import Recipe, board_recipe
from edgerl.learners.decisions import CompileDecisions
from edgerl.run.calibrate import Progress, Stop, calibrated_recipe

log = logging.getLogger(__name__)


def recorded_games() -> set[str]:
    """The games the runs on record trained (the calibration's evidence is theirs)."""
    from edgerl.config.targets import sample_runs

    return {run.env_id for run in sample_runs()}


def board_layer(
    calibrated: bool = True,
    measure_now: bool = True,
    *,
    game: str | None = None,
    run_dir: Path | None = None,
    store: CompileDecisions | None = None,
    stop: Stop | None = None,
    progress: Progress | None = None,
) -> Layer:
    """This machine's recipe for ``game`` (None: the recipe's own, Pong) as a config layer
    that leaves a named game to its config: the calibrated one (:func:`calibrated_recipe`)
    for a game the runs on record trained; for another, what its family trains, unmeasured
    and said so (:func:`family_layer`). Raises EnvError for a game that cannot be made."""
    if game is not None and game not in recorded_games():
        return family_layer(game, board_recipe())
    chosen = calibrated_recipe(calibrated, measure_now, store, run_dir, stop, progress)
    return chosen.layer(keep_game=game is not None)


def family_layer(game: str, class_recipe: Recipe) -> Layer:
    """What ``game``, which no run on record trained, trains on this machine (said in the
    log): an Atari game the class's recipe as it is (the recipes are measured on Pong, and
    Pong's samples to target say nothing of it); a game of another family the defaults for its
    kind of observations and actions (a learner named in the config wins over both)."""
    from edgerl.envs import ale_game, probe

    records = ", ".join(sorted(recorded_games())) or "none"
    if ale_game(game) is not None:
        kept = dataclasses.replace(
            class_recipe,
            why=f"{class_recipe.why}; this machine's recipe for Atari games as it is, not "
            f"measured: no run of {game} on record (the runs on record: {records})",
        )
        log.info("calibration: %s: %s", game, kept.why)
        return kept.layer(keep_game=True)
    spec = probe(game)
    if spec.continuous:
        family = "games of continuous actions"
    elif spec.has_frames:
        family = "games of frames that are not Atari's"
    else:
        family = "games of vector observations"
    why = (
        f"the defaults for {family}, not measured: no recipe of this machine's is on record "
        f"for {game} (the runs on record: {records})"
    )
    log.info("calibration: %s: %s", game, why)
    return Layer(f"the defaults for {game}'s family", {"train.recipe": why})


MIN_EVALUATIONS = 10  # a run of the service's recipe is evaluated at least this many times


def fit_evaluations(cfg: Config, said: set[str]) -> Config:
    """``cfg`` with evaluations that fit its run (``eval.every_steps``, unless ``said``, the
    keys the user set, names it): a recipe's period, made for its own length, shortened to a
    tenth of a shorter run (rounded down to thousands where that leaves some), so that a run
    is evaluated and has a best policy; the automatic period's where it gives one that fits."""
    from edgerl.report.evaluate import eval_period

    if "eval.every_steps" in said:
        return cfg
    steps = cfg.train.steps
    fit = steps // MIN_EVALUATIONS
    fit = fit // 1000 * 1000 if fit >= 1000 else max(fit, 1)
    every = eval_period(cfg)
    if every and every <= fit:
        return cfg
    before = (
        f"every {every:,} would leave it fewer than {MIN_EVALUATIONS}"
        if every
        else "the automatic period evaluates no run this short"
    )
    log.info(
        "evaluations every %s env steps, to fit a run of %s (%s)", f"{fit:,}", f"{steps:,}", before
    )
    return with_values(cfg, {"eval.every_steps": fit})
