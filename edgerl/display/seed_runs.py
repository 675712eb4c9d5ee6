"""The runs ``edgerl results`` sums up, read from their own files only: ``eval.csv`` (the
greedy evaluations) and ``config.toml`` (the game, the learner, the seed, the protocol and the
recipe it trained). A folder that is not a run but holds runs stands for them: what ``edgerl
train --seeds`` writes (``seed-K``), or ``runs/`` with its games and its folders of seeds.
:mod:`edgerl.display.seeds` makes the figures."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.errors import ConfigError, RunDirError
from edgerl.files.csvread import CsvReader, number
from edgerl.report.finding import runs_below
from edgerl.report.rundir import run_section
from edgerl.words import duration, plural

log = logging.getLogger(__name__)

LAST = 3  # evaluations in a final score, as docs/results.md reports them


@dataclass(frozen=True)
class Evaluation:
    step: int
    wall_s: float  # training time when it began (the weights of ``step``)
    mean: float
    eval_s: float = 0.0  # how long it played (0 where eval.csv does not say)

    @property
    def ended_s(self) -> float:
        """Training time when its result came: training goes on while an evaluation plays."""
        return self.wall_s + self.eval_s


@dataclass
class SeedRun:
    """One run's evaluations and what its config says of it."""

    path: Path
    game: str
    learner: str
    seed: int
    evaluations: list[Evaluation]
    recipe: str = ""  # train.recipe: the named recipe it came from, if any
    env: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)

    def within(self, within_s: float | None = None) -> list[Evaluation]:
        """Its evaluations whose result came within ``within_s`` of training time (all for
        None); raises RunDirError, in one sentence, where none did."""
        if within_s is None:
            return self.evaluations
        inside = [e for e in self.evaluations if e.ended_s <= within_s]
        if not inside:
            first = self.evaluations[0].ended_s
            raise RunDirError(
                f"{self.path} has no evaluation that ended within {duration(within_s)} of "
                f"training (its first ended at {duration(first)}): give a longer --within"
            )
        return inside

    def first_at(self, target: float, within_s: float | None = None) -> Evaluation | None:
        """The first evaluation at ``target`` or above whose result came within ``within_s``
        of training; raises RunDirError where no evaluation ended within it."""
        return next((e for e in self.within(within_s) if e.mean >= target), None)

    def final(self, last: int = LAST, within_s: float | None = None) -> float:
        """The mean of the last ``last`` evaluations whose result came within ``within_s`` of
        training (of its last ones for None); raises RunDirError where none did."""
        return float(np.mean([e.mean for e in self.within(within_s)[-last:]]))

    def best_within(self, within_s: float | None = None) -> float:
        """Its best evaluation among those whose result came within ``within_s`` of training;
        raises RunDirError where none did."""
        return max(e.mean for e in self.within(within_s))

    @property
    def best(self) -> float:
        return self.best_within()


class NotEvaluatedYet(RunDirError):
    """A run whose eval.csv holds no evaluation yet (a young run, or one that evaluates never)."""


def read_run(path: Path) -> SeedRun:
    """The run in ``path``; raises RunDirError when it is not a run, NotEvaluatedYet when it
    is one without evaluations. A damaged
    line of eval.csv is skipped and said in the log, as every reader of run files does; where
    a session resumed from a checkpoint older than the newest rows, its rows replace the ones
    they overlap."""
    config = {s: run_section(path, s) for s in ("env", "agent", "eval", "train")}
    if config["env"] is None:
        raise RunDirError(f"{path} holds no run (no readable config.toml): give run directories")
    reader = CsvReader(path / "eval.csv")
    evaluations = []
    try:
        for cells in reader.rows():
            row = dict(zip(reader.header or [], cells, strict=False))
            step, wall, mean = (number(row.get(k, "")) for k in ("step", "wall_s", "return_mean"))
            if step is None or wall is None or mean is None:
                continue
            while evaluations and evaluations[-1].step >= step:  # a resume from before them
                evaluations.pop()
            played = number(row.get("eval_s", ""))  # a file from before the column: 0
            evaluations.append(Evaluation(int(step), wall, mean, max(played or 0.0, 0.0)))
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            raise RunDirError(f"{path / 'eval.csv'} cannot be read: {e.strerror or e}") from None
    if (damage := reader.damage()) is not None:
        log.warning("%s: %s skipped", path / "eval.csv", damage)
    if not evaluations:
        raise NotEvaluatedYet(
            f"{path} has no greedy evaluation yet (eval.csv): results need them; train with "
            "eval.every_steps above 0"
        )
    env, agent = config["env"] or {}, config["agent"] or {}
    seed = env.get("seed", 0)
    return SeedRun(
        path,
        str(env.get("id", "?")),
        str(agent.get("algo", "?")),
        seed if isinstance(seed, int) else 0,
        evaluations,
        recipe=recipe_name(path, config),
        env=env,
        eval=config["eval"] or {},
    )


def recipe_name(path: Path, config: dict[str, dict[str, Any] | None]) -> str:
    """The named recipe a run trained, as results name it: ``train.recipe``'s name (a
    calibration's with the ratio it chose: ``pong-cpu pqn.epochs=1``) without the why after it,
    then the learner and each sample setting the run changed from that recipe
    (``agent.algo=ppo``, ``--set pqn.epochs=1``): runs whose learning differs are not named
    alike. "" for none. ``config``: the sections of config.toml read already."""
    from edgerl.config.presets import NAMED_PRESETS
    from edgerl.config.targets import text_of

    sections = {name: section or {} for name, section in config.items()}
    said = str(sections.get("train", {}).get("recipe", ""))
    name = said.split(" (", 1)[0].strip()
    preset, *words = name.split() or [""]
    if preset not in NAMED_PRESETS:
        return name
    named = {word.split("=", 1)[0] for word in words}
    algo = str(sections.get("agent", {}).get("algo", ""))
    own, theirs = _preset_values(preset, ""), _preset_values(preset, algo)
    if own is None or theirs is None:  # a learner edgerl does not know
        return name
    changed = [] if algo == own["agent.algo"] else [f"agent.algo={algo}"]
    for key, value_there in theirs.items():
        if key == "agent.algo" or key in named:
            continue
        section, field_name = key.split(".", 1)
        if section not in sections:
            sections[section] = run_section(path, section) or {}
        value = sections[section].get(field_name)
        if value is None:
            continue
        with contextlib.suppress(TypeError, ValueError):  # an int for a float is no change
            value = type(value_there)(value)
        if text_of(value) != text_of(value_there):
            changed.append(f"{key}={text_of(value)}")
    return " ".join([name, *changed])


@functools.cache
def _preset_values(preset: str, algo: str) -> dict[str, Any] | None:
    """The values of the settings a learner's samples depend on (and ``agent.algo``) that
    ``--preset preset`` trains with, with ``agent.algo`` set to ``algo`` where given; None for
    a learner edgerl does not know."""
    from edgerl.config import Layer, build_layers, resolve
    from edgerl.config.learners import learner_info
    from edgerl.config.presets import NAMED_PRESETS, named_preset_layer
    from edgerl.config.targets import COMMON_KEYS

    layers = [*build_layers(None, [], use_system=False), named_preset_layer(preset)]
    if algo:
        layers.append(Layer("the run's learner", {"agent.algo": algo}))
    try:
        cfg = NAMED_PRESETS[preset].config(resolve(layers))
        keys = ("agent.algo", *COMMON_KEYS, *learner_info(cfg.agent.algo).sample_keys)
    except (ConfigError, KeyError):  # a learner edgerl does not know
        return None
    return {key: cfg.get(key) for key in keys}


def find_runs(paths: Iterable[Path]) -> list[SeedRun]:
    """The runs at ``paths``: each a run directory, or a folder of them (``seed-K``, or a
    ``runs`` folder of games); raises RunDirError, naming the path, for one that is neither, a
    run directory given without evaluations, or a folder none of whose runs has one yet. A run
    in a folder that has no evaluation yet (one still filling its replay) is left out, and said
    in the log: the others are summed up."""
    runs = []
    for path in paths:
        if not path.is_dir():
            raise RunDirError(f"{path} is not a directory; give run directories")
        if (path / "config.toml").exists():
            runs.append(read_run(path))
            continue
        inside = runs_below(path, "config.toml")
        if not inside:
            raise RunDirError(f"{path} is neither a run directory nor a folder of them")
        young = []
        for run in inside:
            try:
                runs.append(read_run(run))
            except NotEvaluatedYet:
                young.append(str(run.relative_to(path)))
        if len(young) == len(inside):
            raise NotEvaluatedYet(
                f"none of the {plural(len(inside), 'run')} in {path} has a greedy evaluation "
                "yet (eval.csv): results need them; train with eval.every_steps above 0"
            )
        if young:
            log.warning(
                "%s: left out %s, with no greedy evaluation yet: %s",
                path,
                plural(len(young), "run"),
                ", ".join(young),
            )
    return runs
