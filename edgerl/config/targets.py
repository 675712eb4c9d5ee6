"""Samples to target: how many env steps a recipe needed to reach a game's target score, from the
runs on record (``edgerl/data/samples_to_target.csv``, kept equal to the runs under docs/runs/ by
a test).

How long a recipe takes on a machine is its samples to target over the env steps per second the
machine gives it: the first is the recipe's (the learner and the settings that decide how much
it learns from each step, its registry line's ``sample_keys``), the second the machine's
(``edgerl bench`` measures it). A run speaks for a config only where the game, the learner, the
sticky actions and every one of those settings agree: a DQN run with batches of 128 every 16
steps says nothing of batches of 32 every 4.

The figure is the Kaplan-Meier median of the env steps to the target, beside how many runs reached
it (k of n): a run that did not (stopped by the clock, like the GPU runs of 150 s, or by its
steps) counts as one that had not reached it by its last evaluation, and says nothing of later
steps. The median over the runs that reached the target alone would forget the others: a recipe
whose runs reached it one time in three would look as good as one that always does. Where fewer
than half the runs are known to reach it by any step on record, there is no median, and the
recipe has no figure (the calibration then never chooses it). Evaluations come every 50,000 to
250,000 steps, so each run's step is at most that much late.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

from edgerl.config.learners import learner_info
from edgerl.files.packaged import finite, read_table

if TYPE_CHECKING:
    from edgerl.config import Config

COMMON_KEYS = ("env.repeat_action_probability",)  # every learner's samples depend on these


def text_of(value: Any) -> str:
    """A setting's value as the table writes it (floats as Python writes them: 0.00025)."""
    return repr(value) if isinstance(value, float) else str(value)


def settings_of(cfg: Config) -> str:
    """The settings of ``cfg`` that decide its samples to target, as ``key=value`` words."""
    keys = COMMON_KEYS + learner_info(cfg.agent.algo).sample_keys
    return " ".join(f"{key}={text_of(cfg.get(key))}" for key in keys)


class SampleRun(NamedTuple):
    env_id: str
    algo: str
    target: float
    settings: str
    run: str  # its folder under docs/runs/
    reached_at: int  # the env step of its first evaluation at the target; 0: never
    evaluated_to: int  # the env step of its last evaluation


def _step(text: str) -> int:
    return int(text) if text else 0


@functools.cache
def sample_runs() -> tuple[SampleRun, ...]:
    """The runs on record, with what each needed (``edgerl/data/samples_to_target.csv``)."""
    columns: dict[str, Any] = {name: str for name in SampleRun._fields}
    columns.update(target=finite, reached_at=_step, evaluated_to=int)
    return tuple(SampleRun(**row) for row in read_table("samples_to_target.csv", columns))


@dataclass(frozen=True)
class SamplesToTarget:
    """What the runs on record with one config's settings needed to reach a target."""

    env_id: str
    target: float
    steps: int  # the Kaplan-Meier median of the first evaluation at the target
    reached: int
    runs: tuple[SampleRun, ...]

    def describe(self) -> str:
        n = len(self.runs)
        return (
            f"{self.steps:,} env steps to {self.target:g} (the Kaplan-Meier median of the {n} "
            f"run{'s' if n != 1 else ''} on record with these settings, {self.reached} of which "
            "reached it)"
        )


def median_steps(reached: list[int], stopped: list[int]) -> int | None:
    """The Kaplan-Meier median of the env steps to a target: the first step by which half the
    runs are estimated to have reached it, where ``reached`` holds the steps of the runs that
    reached it and ``stopped`` the last evaluations of those that did not (each still counted as
    not there at a step equal to its own, as the estimate does). None where the estimate never
    falls to a half within the steps on record."""
    not_yet = Fraction(1)
    for step in sorted(set(reached)):
        at_risk = sum(s >= step for s in reached) + sum(s >= step for s in stopped)
        not_yet *= 1 - Fraction(reached.count(step), at_risk)
        if not_yet <= Fraction(1, 2):
            return step
    return None


def samples_to_target(cfg: Config) -> SamplesToTarget | None:
    """What the runs on record say ``cfg`` needs to reach its game's target; None where too few
    runs with its settings reached it for a median (:func:`median_steps`)."""
    mine = settings_of(cfg)
    runs = tuple(
        r
        for r in sample_runs()
        if r.env_id == cfg.env.id and r.algo == cfg.agent.algo and r.settings == mine
    )
    reached = [r.reached_at for r in runs if r.reached_at]
    steps = median_steps(reached, [r.evaluated_to for r in runs if not r.reached_at])
    if steps is None:
        return None
    return SamplesToTarget(cfg.env.id, runs[0].target, steps, len(reached), runs)


def ratio_points(cfg: Config) -> dict[Any, SamplesToTarget]:
    """What the runs on record needed at each value of ``cfg``'s learner's ``ratio_key`` (how
    much it learns from each env step: PQN's epochs) with every other setting of ``cfg``: the
    values whose runs reached the target often enough for a median (:func:`samples_to_target`),
    each with its samples to target. Empty for a learner without a ratio key; one value where
    only ``cfg``'s own (or another single one) is on record. The learning balance moves the
    ratio among these values only."""
    from edgerl.config import with_values

    key = learner_info(cfg.agent.algo).ratio_key
    if not key:
        return {}
    own = cfg.get(key)
    others = _without(settings_of(cfg), key)
    values = {
        type(own)(float(text))
        for r in sample_runs()
        if r.env_id == cfg.env.id
        and r.algo == cfg.agent.algo
        and _without(r.settings, key) == others
        and (text := _setting(r.settings, key))
    }
    points = {v: samples_to_target(with_values(cfg, {key: v})) for v in sorted(values)}
    return {v: found for v, found in points.items() if found is not None}


def _without(settings: str, key: str) -> str:
    return " ".join(w for w in settings.split() if not w.startswith(key + "="))


def _setting(settings: str, key: str) -> str:
    """The value ``settings`` gives ``key``, as written ("" where it gives none)."""
    return next((w.split("=", 1)[1] for w in settings.split() if w.startswith(key + "=")), "")
