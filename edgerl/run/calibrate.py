"""The machine measures itself and picks its recipe: ``--preset board`` and the service.

For its class of machine (:func:`edgerl.hw.recipe.board_recipe`: no GPU, a GPU of its own, an
integrated one) edgerl has a few recipes whose samples to target are on record
(:mod:`edgerl.config.targets`: PQN's 1.2M env steps to Pong 18 on two CPU cores, DQN's 0.5M
with batches of 32 every 4 steps from one run). What each costs here is measured, as ``edgerl
bench`` measures it, for a few seconds per recipe:

* **the actor**: env steps/s of the recipe's environments stepping with one batched forward pass
  of its network per step (:func:`edgerl.run.autotune.measure_actor`);
* **the learner alone**: the env steps/s its learning allows (the learner-bound limit,
  :func:`edgerl.run.learner_alone.learner_limit`, updates per env step included).

The loop's speed follows from the two as the balance predicts it (the slower of the two where the
learner has a thread of its own, their harmonic sum where they take turns), and the predicted
training time is the samples to target over that speed (times what the loops of the runs on
record in its pipeline made of their prediction: the host work the halves leave out), with the
time the recipe's evaluations add on the way (each one's cost on record, in steps of the loop it
ran beside), its error said from the same runs
(:class:`~edgerl.run.recipe_choice.Measured`). The samples to target are those of
the runs on record that trained with the recipe's settings in the pipeline and at the precision
it would train with here (:func:`edgerl.config.targets.samples_to_target`): a CPU run in one
loop at fp32 says nothing of a GPU learning beside the actor in bf16. The recipe with the least
time wins among those backed by at least :data:`~edgerl.config.targets.MIN_REACHING` runs that
reached the target so; a recipe with fewer (no run at its settings, one or two lucky seeds, too
few for a median: a recipe that learns fast one time in three is not a fast recipe) is measured
and shown, never chosen. Where the class's own recipe is not so backed, nothing is weighed
against it: it is trained, and the log says why in one line. The figures are remembered per
machine, PyTorch, edgerl and recipe (``calibration.json`` in the cache directory
:mod:`edgerl.learners.decisions` uses), so only the first start measures. Figures taken while
other work kept the CPUs busy are remembered with that load: used while the machine is still
busy at a later start, measured again at a quiet one.

The measuring runs in a process of its own (:mod:`edgerl.run.recipe_speed`), so that a stop
(SIGTERM, Ctrl-C) ends it at once (:class:`~edgerl.run.signals.StoppedDuringSetup`, said in the
log). What it measures is said as it goes (the service's ``STATUS=``, with
``EXTEND_TIMEOUT_USEC`` so a slow board's first start is not cut by ``TimeoutStartSec=``). The
runs on record are Pong's: a game they do not cover is never measured as Pong
(:mod:`edgerl.run.families`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgerl.config import Config, Layer
from edgerl.config.learners import learner_info
from edgerl.config.targets import ratio_points
from edgerl.hw.cpus import mark_and_look, usable_cpus
from edgerl.hw.recipe import Recipe, board_recipe
from edgerl.learners.decisions import CompileDecisions
from edgerl.run.recipe_choice import Measured, choose, trained_here, weighed
from edgerl.run.recipe_speed import (
    Figures,
    candidate_config,
    figures_of,
    measure_apart,
    measure_once,
)
from edgerl.run.signals import StoppedDuringSetup
from edgerl.words import duration, plural

log = logging.getLogger(__name__)

# The recipes each class's own may be traded for: those whose learning the runs on record
# measured on such a machine or whose speed the calibration can measure there.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "pong-cpu": ("pong-cpu", "pong-cpu-dqn"),
    "pong-gpu": ("pong-gpu", "pong-gpu-dqn"),
    "pong-jetson": ("pong-jetson", "pong-gpu-dqn"),
}
MEASURE_S = 3.0  # each half of each recipe: enough for steady figures on a quiet machine
FILE_NAME = "calibration.json"
# A recipe's measurement with its set-up (its environments built, its network made): 80-110 s
# for three on a 2-core Xeon; what the start says it will take.
TYPICAL_S = 35.0
# What systemd is asked to allow for each recipe still to measure (EXTEND_TIMEOUT_USEC): a
# slow board's set-up takes several times the typical.
ALLOW_S = 180.0
QUIET_PROBE_S = 1.0  # how long the load is looked at before remembered busy figures are used

Stop = Callable[[], "str | None"]  # the reason a stop was requested (a signal's name), or None
Progress = Callable[[str, float], None]  # (what is being done, the seconds it may still take)


def candidates(class_recipe: Recipe) -> list[Recipe]:
    """The class's own recipe and the others it may be traded for, the machine's changes (a
    small board's environments) kept on the class's own."""
    names = CANDIDATES.get(class_recipe.preset, (class_recipe.preset,))
    recipes = [
        class_recipe if name == class_recipe.preset else Recipe(name, class_recipe.why, {})
        for name in names
    ]
    return [variant for recipe in recipes for variant in (recipe, *ratio_variants(recipe))]


def ratio_variants(recipe: Recipe) -> list[Recipe]:
    """``recipe`` at the other values of its learner's ratio (PQN's epochs) that enough runs
    on record with its other settings, in the pipeline and precision it would train with here,
    back (:func:`edgerl.config.targets.ratio_points`): how much to learn from each env step is
    part of the choice."""
    cfg = candidate_config(recipe)
    key = learner_info(cfg.agent.algo).ratio_key
    own = cfg.get(key) if key else None
    return [
        dataclasses.replace(recipe, changes={**recipe.changes, key: value})
        for value in ratio_points(cfg, *trained_here(cfg))
        if value != own
    ]


# How figures are measured, in the key: 2 since the measuring process judges its thread count by
# the CPUs as it begins; 1's judged it by the load average, which right after a run took one
# thread where training would take two, so its figures are measured again. 3 since a CPU's
# update gathers by index_select, steps RAdam per list of tensors and keeps freed memory
# (docs/performance.md, "Gathering and reordering frames, and page faults"): 2's figures are
# those of slower code. 4 since RAdam's rectified CPU steps are one fused pass
# (docs/performance.md, "One pass for RAdam's step").
MEASURING = 4


def machine_key() -> dict[str, Any]:
    """What the figures depend on besides the recipe: the processor, how many CPUs this
    process may use, the GPU, PyTorch, edgerl and how figures are measured."""
    import torch

    from edgerl import __version__

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return {
        "processor": _processor(),
        "cpus": usable_cpus(),
        "gpu": gpu,
        "torch": torch.__version__,
        "edgerl": __version__,
        "measuring": MEASURING,
    }


def _processor() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what Python knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _key(recipe: Recipe, cfg: Config, machine: dict[str, Any]) -> str:
    settings = cfg.to_dict()
    settings["train"].pop("recipe", None)  # the words, not the recipe
    text = json.dumps({"machine": machine, "config": settings}, sort_keys=True, default=str)
    return f"calibration {recipe.name} " + hashlib.sha256(text.encode()).hexdigest()[:32]


def calibrate(
    class_recipe: Recipe,
    store: CompileDecisions | None = None,
    seconds: float = MEASURE_S,
    measure_fn: Any = None,
    remembered_only: bool = False,
    stop: Stop | None = None,
    progress: Progress | None = None,
) -> list[Measured]:
    """Each candidate recipe of the class measured here (or remembered from an earlier
    measurement with the same machine, software and settings; ``remembered_only``: those
    alone, nothing measured). ``measure_fn(cfg, seconds)`` measures in this process (None:
    :func:`measure` in a process of its own). ``stop`` is looked at while measuring: a reason
    it returns ends the measuring with StoppedDuringSetup; ``progress`` hears what is measured
    and how long it may take."""
    store = store or CompileDecisions(file_name=FILE_NAME, what="the calibration")
    machine = machine_key()
    known: dict[str, Figures] = {}
    order: list[tuple[Recipe, Config]] = []
    todo: list[tuple[Recipe, Config, str]] = []
    quiet: bool | None = None  # whether other work leaves the CPUs alone now, once asked
    for recipe in candidates(class_recipe):
        cfg = candidate_config(recipe)
        key = _key(recipe, cfg, machine)
        remembered = _remembered(store.get(key))
        if remembered is not None:
            figures, busy = remembered
            if busy > BUSY_TO_REMEMBER and not remembered_only:
                quiet = _quiet_now() if quiet is None else quiet
                if quiet:
                    log.info(
                        "calibration: %s was measured while other work kept %.1f CPUs busy; "
                        "quiet now: measured again",
                        recipe.name,
                        busy,
                    )
                    todo.append((recipe, cfg, key))
                    order.append((recipe, cfg))
                    continue
                log.info(
                    "calibration: %s remembered from %s, measured while other work kept %.1f "
                    "CPUs busy, as it does now (a quiet start measures it again)",
                    recipe.name,
                    store.path,
                    busy,
                )
            else:
                log.info("calibration: %s remembered from %s", recipe.name, store.path)
            known[recipe.name] = figures
        elif remembered_only:
            continue
        else:
            todo.append((recipe, cfg, key))
        order.append((recipe, cfg))
    for (recipe, _, key), result in zip(
        todo, _measure_all(todo, seconds, measure_fn, stop, progress), strict=True
    ):
        if result is None:
            continue
        figures, busy = result
        known[recipe.name] = figures
        actor, learner, pipeline = figures
        store.put(key, {"actor": actor, "learner": learner, "pipeline": pipeline, "busy": busy})
        if busy > BUSY_TO_REMEMBER:
            log.warning(
                "calibration: other work kept %.1f CPUs busy while %s was measured: its figures "
                "are used, and kept with that load until a quiet start measures it again",
                busy,
                recipe.name,
            )
    return [
        weighed(recipe, cfg, known[recipe.name]) for recipe, cfg in order if recipe.name in known
    ]


def _quiet_now(seconds: float = QUIET_PROBE_S) -> bool:
    """Whether other work leaves the CPUs alone now (looked at for ``seconds``)."""
    import time

    from edgerl.hw.cpus import CpuSample, others_busy

    before = CpuSample.now()
    time.sleep(seconds)
    busy = others_busy(before, CpuSample.now())
    return busy is not None and busy <= BUSY_TO_REMEMBER


BUSY_TO_REMEMBER = 0.5  # CPUs other work may keep busy while figures worth remembering are taken


def _remembered(entry: dict[str, Any] | None) -> tuple[Figures, float] | None:
    """A remembered entry's figures and the CPUs other work kept busy while they were taken
    (none said: 0, as an older edgerl kept only quiet ones; a damaged figure: busy)."""
    figures = figures_of(entry)
    if figures is None or entry is None:
        return None
    busy = entry.get("busy", 0.0)
    if isinstance(busy, bool) or not isinstance(busy, (int, float)) or not math.isfinite(busy):
        return figures, math.inf
    return figures, max(0.0, float(busy))


def _measure_all(
    todo: list[tuple[Recipe, Config, str]],
    seconds: float,
    measure_fn: Any,
    stop: Stop | None,
    progress: Progress | None,
) -> Iterator[tuple[Figures, float] | None]:
    """For each of ``todo`` in order: (its figures, CPUs other work kept busy meanwhile), or
    None where it could not be measured (said). Raises StoppedDuringSetup when ``stop`` says."""
    if not todo:
        return
    log.info(
        "calibration: measuring %s here before training, about %s (remembered after): %s",
        plural(len(todo), "recipe"),
        duration(TYPICAL_S * len(todo)),
        ", ".join(recipe.name for recipe, _, _ in todo),
    )
    asked = stop or (lambda: None)

    def announce(i: int) -> None:
        name, left = todo[i][0].name, len(todo) - i
        log.info("calibration: measuring %s (%d of %d)", name, i + 1, len(todo))
        if progress is not None:
            progress(
                f"calibrating before training: measuring {name} ({i + 1} of {len(todo)}), "
                f"about {duration(TYPICAL_S * left)} left",
                ALLOW_S * left,
            )

    if measure_fn is None:
        recipes = [recipe for recipe, _, _ in todo]
        check = functools.partial(_check_stop, asked, todo)
        yield from measure_apart(recipes, seconds, check, announce)
        # This process counted the measuring process's CPU time as other programs' work: start
        # its window again, so that training's thread count is not judged by it. (Reached
        # once the last figures are taken: calibrate's strict zip asks for one more.)
        mark_and_look()
        return
    for i, (recipe, cfg, _) in enumerate(todo):
        _check_stop(asked, todo, i)
        announce(i)
        measured = _measure_here(recipe, cfg, seconds, measure_fn)
        _check_stop(asked, todo, i)
        yield measured


def _check_stop(stop: Stop, todo: list[tuple[Recipe, Config, str]], i: int) -> None:
    """Raise StoppedDuringSetup (said in the log) where a stop was requested while the
    ``i``-th of ``todo`` was measured."""
    reason = stop()
    if reason is not None:
        log.info(
            "calibration: stopped by %s while measuring %s (%d of %d); nothing of it is remembered",
            reason,
            todo[i][0].name,
            i + 1,
            len(todo),
        )
        raise StoppedDuringSetup(reason)


def _measure_here(
    recipe: Recipe, cfg: Config, seconds: float, measure_fn: Any
) -> tuple[Figures, float] | None:
    """(the figures, CPUs other work kept busy meanwhile), or None where measuring failed
    (said; the recipe is then left out, never a reason to stop)."""
    try:
        return measure_once(cfg, seconds, measure_fn)
    except Exception as e:  # out of memory on a small board, a driver's error: not this one
        log.warning("calibration: %s could not be measured here (%s): left out", recipe.name, e)
        log.debug("calibration failure", exc_info=True)
        return None


def calibrated_recipe(
    calibrated: bool = True,
    measure_now: bool = True,
    store: CompileDecisions | None = None,
    run_dir: Path | None = None,
    stop: Stop | None = None,
    progress: Progress | None = None,
) -> Recipe:
    """This machine's recipe, chosen by measuring (``--preset board``, the service): the
    class's own, unmeasured, where not ``calibrated`` (``hw.calibrate = false``); from the
    remembered figures alone without ``measure_now`` (a reload while training runs). A run
    already in ``run_dir`` keeps the recipe it trained with: measured again after an upgrade
    or on other CPUs, the choice could name another learner, which its checkpoints refuse.
    ``stop`` and ``progress`` as :func:`calibrate` takes them (StoppedDuringSetup raised)."""
    class_recipe = board_recipe()
    if run_dir is not None and (kept := recipe_of_run(run_dir, class_recipe)) is not None:
        log.info(
            "calibration: the run in %s goes on with its recipe as it began (nothing measured "
            "now), %s",
            run_dir,
            kept.name,
        )
        return kept
    if not calibrated:
        return class_recipe
    measured = calibrate(
        class_recipe, store, remembered_only=not measure_now, stop=stop, progress=progress
    )
    if not measured:  # nothing remembered, and no measuring now
        return class_recipe
    for m in measured:
        log.info("calibration: %s", m.describe())
    chosen = choose(measured, class_recipe)
    log.info("calibration: training %s", chosen.name)
    return chosen


def recipe_of_run(run_dir: Path, class_recipe: Recipe) -> Recipe | None:
    """The recipe the run kept in ``run_dir`` trained with (its config.toml's ``train.recipe``
    names a preset first), the class's own with this machine's changes where it is that one;
    None for no run there, or one trained without a named recipe. Where the name is the one
    the run began with, so is the reason: a resume writes back the ``train.recipe`` it found
    (with the time the calibration predicted before the run: what the run is compared with);
    a name this machine changes (another board's environment count) takes a reason of its own."""
    from edgerl.config.presets import NAMED_PRESETS
    from edgerl.report.rundir import run_section

    saved = run_section(run_dir, "train")
    said = str((saved or {}).get("recipe") or "")
    named, _, why = said.partition(" (")
    preset, *words = named.split() or [""]
    if preset not in NAMED_PRESETS:
        return None
    ratio = _ratio_change(preset, dict(word.split("=", 1) for word in words if "=" in word))
    if preset == class_recipe.preset:
        kept = dataclasses.replace(class_recipe, changes={**class_recipe.changes, **ratio})
    else:
        kept = Recipe(preset, "the recipe the run in its run directory trained with", ratio)
    if kept.name == named.strip() and why.endswith(")"):
        kept = dataclasses.replace(kept, why=why.removesuffix(")"))
    return kept


def _ratio_change(preset: str, words: dict[str, str]) -> dict[str, Any]:
    """The ratio value a recipe's name changes (``pqn.epochs=1``), typed as the preset's; the
    other words a machine's changes (on the class's own: measured again here)."""
    cfg = candidate_config(Recipe(preset, "", {}))
    key = learner_info(cfg.agent.algo).ratio_key
    if not key or key not in words:
        return {}
    try:
        return {key: type(cfg.get(key))(words[key])}
    except ValueError:  # a hand-edited name: the preset's own value
        return {}


def calibrated_layer(
    calibrated: bool = True, run_dir: Path | None = None, stop: Stop | None = None
) -> Layer:
    """``--preset board`` as a config layer (Pong's: :func:`board_layer` for a game named)."""
    return calibrated_recipe(calibrated, run_dir=run_dir, stop=stop).layer()
