"""The best-evaluated policy of a run, kept beside its checkpoints, and which policy ``play`` and
``export`` take.

Like Stable-Baselines3's ``EvalCallback`` best model: every evaluation
(:mod:`edgerl.report.evaluate`) whose mean return is at least the best so far writes the weights it
evaluated to ``<run_dir>/checkpoints/best.ckpt`` (ties go to the newer weights, trained longer), in
the checkpoint file format (magic, SHA-256, written atomically), with the evaluation's figures. A
policy often gets worse late in a run (a CartPole run evaluated at 500 collapsed to 95 by its end),
so ``play`` and ``export`` take the best policy of a run by default and the newest checkpoint with
``--last``, and say which one they took.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgerl.errors import CheckpointError
from edgerl.files.atomic import write_atomic
from edgerl.files.checkpoint import Checkpoint, CheckpointStore, load
from edgerl.files.private import ensure_own_dir
from edgerl.report.rundir import holds_run, seed_runs_in

log = logging.getLogger(__name__)

BEST_NAME = "best.ckpt"  # not a ckpt-<seq>-step<step>.ckpt: never pruned, never resumed from


def best_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / BEST_NAME


def save_best(run_dir: Path, snapshot: Checkpoint, evaluation: dict[str, Any]) -> Path:
    """Write ``snapshot`` (a policy snapshot, as evaluations take them) with its ``evaluation``
    (step, return_mean, episodes, ...) as the run's best policy; returns the path. Raises
    OSError with the previous best policy untouched."""
    path = best_path(run_dir)
    best = replace(snapshot, best=dict(evaluation), saved_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    ensure_own_dir(path.parent)  # never into a link, or another's folder
    write_atomic(path, best.to_bytes())
    return path


def best_evaluation(run_dir: Path) -> dict[str, Any] | None:
    """The evaluation figures of the run's best policy, or None when there is none; a damaged
    file is said in the log and counts as none (the next evaluation replaces it)."""
    path = best_path(run_dir)
    if not path.exists():
        return None
    try:
        best = load(path).best
    except CheckpointError as e:
        log.warning("%s; the next evaluation replaces it", e)
        return None
    if best is None or not isinstance(best.get("return_mean"), (int, float)):
        log.warning("%s holds no evaluation; the next evaluation replaces it", path)
        return None
    return best


@dataclass(frozen=True)
class Choice:
    """The policy file a command takes from a run, and the sentence that says which and why."""

    path: Path
    sentence: str


def choose(run_dir: Path, last: bool = False) -> Choice:
    """The run's best-evaluated policy, or its newest valid checkpoint with ``last`` or when no
    evaluation kept a best one; raises CheckpointError when ``run_dir`` is not a run, or the
    run has neither (or only damaged checkpoints), in a sentence that names what play and
    export take instead."""
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    if seeds := seed_runs_in(run_dir):
        raise CheckpointError(
            f"{run_dir} holds the runs of `edgerl train --seeds` ({', '.join(seeds)}), not a "
            f"run: give one of them with --run-dir, e.g. {run_dir / seeds[0]}"
        )
    if not holds_run(run_dir) and not _empty(run_dir):  # an empty one: a run to come
        raise CheckpointError(
            f"{run_dir} is not a run directory (no config.toml, checkpoints or status.json in "
            "it): give a run's with --run-dir, or a policy file with --checkpoint or --model"
        )
    store = CheckpointStore(run_dir / "checkpoints", keep=1 << 30)
    instead = (
        "give another run with --run-dir, a checkpoint with --checkpoint or a policy file "
        "with --model"
    )
    best = None if last else best_evaluation(run_dir)
    if best is not None:
        try:  # the best is taken whatever the checkpoints are: only the hint needs the newest
            found = store.newest_valid(fix=instead)
        except CheckpointError:
            found = None
        later = (
            f"; --last takes the newest checkpoint (step {found[0].step:,})"
            if found is not None
            else ""
        )
        return Choice(
            best_path(run_dir),
            f"the best-evaluated policy of {run_dir}: {BEST_NAME}, step "
            f"{int(best.get('step', 0)):,}, mean return {float(best['return_mean']):.1f} over "
            f"{int(best.get('episodes', 0))} evaluation episodes{later}",
        )
    found = store.newest_valid(fix=instead)
    newest = found[0] if found is not None else None
    if newest is None:
        raise CheckpointError(f"run directory {run_dir} has no checkpoint yet")
    why = "(--last)" if last else "(no evaluation has kept a best policy in this run)"
    return Choice(newest.path, f"the newest checkpoint of {run_dir}: {newest.path.name} {why}")


def _empty(folder: Path) -> bool:
    """Whether ``folder`` holds nothing (one that cannot be read is taken as not empty)."""
    try:
        return next(iter(folder.iterdir()), None) is None
    except OSError:
        return False
