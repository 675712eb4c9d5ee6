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
500,000 steps (each row's ``eval_every``), so each run's step is at most that much late: the
figure says the grid beside it.

A run speaks only for the pipeline and the precision it trained with (each row's ``pipeline``:
sync, or async with the learner on a thread of its own, PQN's a rollout behind; ``precision``:
fp32, bf16 or fp16 as ``perf.amp`` resolved on its device): a lagged learner learns from older
weights, and bf16's updates are not fp32's, so a CPU run in one loop at fp32 says nothing of a
GPU run learning beside the actor in bf16. A figure is therefore asked for with the pipeline and
precision the config will train with, and only the runs that trained so count. The calibration
and the learning balance act on a figure only where at least :data:`MIN_REACHING` of those runs
reached the target.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

from edgerl.config.learners import learner_info
from edgerl.files.packaged import finite, read_table
from edgerl.words import duration

if TYPE_CHECKING:
    from edgerl.config import Config

COMMON_KEYS = ("env.repeat_action_probability",)  # every learner's samples depend on these
# The runs that must have reached the target, with a config's settings, pipeline and precision,
# before a choice rests on their figure (the calibration's recipe, the learning balance's
# values). One or two is a seed's luck: the one-epoch recipe was chosen on a 2-core EPYC from
# 1 of 2 seeds at 18, and its run there did not reach it; three is the fewest that give a
# median that is not one run's step.
MIN_REACHING = 3


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
    pipeline: str  # what ran: "sync" (one loop) or "async" (the learner on a thread of its own)
    precision: str  # "fp32", "bf16" or "fp16": perf.amp as resolved on its device
    eval_every: int  # eval.every_steps: its step at the target is late by up to this
    run: str  # its folder under docs/runs/
    reached_at: int  # the env step of its first evaluation at the target; 0: never
    evaluated_to: int  # the env step of its last evaluation
    # Its loop's env steps/s outside its evaluations, up to the evaluation above (reached_at,
    # else its last); 0 where its metrics.csv had no window outside one.
    loop_sps: float = 0.0
    # The training time each evaluation before that one added, on average (start-up shared
    # among them; at most one period each: they never overlap; -1: there was none), and the
    # time that last one took, both counted in env steps of that loop (an evaluation slows the
    # loop it runs beside; counted in its steps, the figure carries from one machine to a faster
    # or slower one of the same kind).
    eval_cost_steps: int = 0
    eval_tail_steps: int = 0
    # The loop's env steps/s the calibration predicted for it before it ran (its config's
    # recipe line); 0 where it was not calibrated.
    predicted_loop_sps: int = 0


def _step(text: str) -> int:
    return int(text) if text else 0


@functools.cache
def sample_runs() -> tuple[SampleRun, ...]:
    """The runs on record, with what each needed (``edgerl/data/samples_to_target.csv``)."""
    columns: dict[str, Any] = {name: str for name in SampleRun._fields}
    columns.update(target=finite, eval_every=int, reached_at=_step, evaluated_to=int)
    columns.update(loop_sps=finite, eval_cost_steps=int, eval_tail_steps=int)
    columns.update(predicted_loop_sps=int)
    return tuple(SampleRun(**row) for row in read_table("samples_to_target.csv", columns))


@dataclass(frozen=True)
class SamplesToTarget:
    """What the runs on record with one config's settings, pipeline and precision needed to
    reach a target."""

    env_id: str
    target: float
    steps: int  # the Kaplan-Meier median of the first evaluation at the target
    reached: int
    runs: tuple[SampleRun, ...]
    pipeline: str
    precision: str

    @property
    def enough(self) -> bool:
        """Whether enough of the runs reached the target for a choice to rest on the figure
        (:data:`MIN_REACHING`)."""
        return self.reached >= MIN_REACHING

    @property
    def eval_cost_steps(self) -> int:
        """The training time an evaluation before the last adds, in env steps of the loop:
        the median over the runs whose loop was measured and that made one (0: none did)."""
        return upper_median(
            [r.eval_cost_steps for r in self.runs if r.loop_sps > 0 and r.eval_cost_steps >= 0]
        )

    @property
    def eval_tail_steps(self) -> int:
        """The time the evaluation that reaches the target takes, in env steps of the loop:
        the median over the runs whose loop was measured (0: none was)."""
        return upper_median([r.eval_tail_steps for r in self.runs if r.loop_sps > 0])

    def evaluations(self, eval_every: int) -> int:
        """How many evaluations a run evaluated every ``eval_every`` env steps makes up to
        and including the one at the target (0: it does not evaluate)."""
        return evaluations_to(self.steps, eval_every)

    def training_s(self, loop_sps: float, eval_every: int, steps: int | None = None) -> float:
        """The training time to the target (to the end of the evaluation that reaches it) of a
        loop of ``loop_sps`` env steps/s evaluated every ``eval_every``: its ``steps`` (the
        median's by default), each evaluation before the last at its cost on record, and the
        last one's length on record."""
        steps = self.steps if steps is None else steps
        evaluations = evaluations_to(steps, eval_every)
        if evaluations:
            steps += (evaluations - 1) * self.eval_cost_steps + self.eval_tail_steps
        return steps / loop_sps

    def error(self, loop_sps: float, eval_every: int) -> str:
        """How far :meth:`training_s` may be off from its samples, from the runs on record:
        the training time at this speed of the fewest and the most steps that reached the
        target."""
        reached = sorted(r.reached_at for r in self.runs if r.reached_at)
        if not reached:
            return "no run on record reached it"
        low, high = (self.training_s(loop_sps, eval_every, s) for s in (reached[0], reached[-1]))
        return (
            f"the {len(reached)} run{'s' if len(reached) != 1 else ''} on record that reached "
            f"it took {reached[0]:,}"
            + (f" to {reached[-1]:,}" if high != low else "")
            + f" env steps: {duration(low)}"
            + (f" to {duration(high)}" if high != low else "")
            + " at this speed"
        )

    def describe(self) -> str:
        n = len(self.runs)
        return (
            f"{self.steps:,} env steps to {self.target:g} (the Kaplan-Meier median of the {n} "
            f"run{'s' if n != 1 else ''} on record with these settings, the {self.pipeline} "
            f"pipeline and {self.precision}, {self.reached} of which reached it; evaluated "
            f"every {grid(self.runs)} env steps)"
        )


def loops_on_record(pipeline: str) -> list[float]:
    """How the loop of each run on record in ``pipeline`` went against the speed its
    calibration predicted for it before it ran (its loop outside evaluations over that
    prediction), smallest first; of every recipe, since the halves' prediction is the
    machine's and the pipeline's, not the settings'. The halves leave host work out (the
    rollout's writes; in the async pipeline the learner thread's share of the CPU beside the
    actor): these ratios carry it."""
    return sorted(
        r.loop_sps / r.predicted_loop_sps
        for r in sample_runs()
        if r.pipeline == pipeline and r.predicted_loop_sps > 0 and r.loop_sps > 0
    )


def upper_median(values: list[Any], empty: Any = 0) -> Any:
    """The middle value (the upper of the two middle ones), ``empty`` of none."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else empty


def evaluations_to(steps: int, eval_every: int) -> int:
    """The evaluations of a run evaluated every ``eval_every`` env steps up to and including
    the one at ``steps`` (0: it does not evaluate)."""
    return max(1, round(steps / eval_every)) if eval_every > 0 else 0


def grid(runs: tuple[SampleRun, ...]) -> str:
    """The runs' evaluation periods in words (``100,000``, ``250,000-500,000``): how late each
    run's step at the target may be."""
    periods = sorted({r.eval_every for r in runs})
    if not periods:
        return "–"
    low, high = periods[0], periods[-1]
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def tally(runs: tuple[SampleRun, ...]) -> str:
    """How many of ``runs`` reached the target: ``2 of 4``."""
    return f"{sum(1 for r in runs if r.reached_at)} of {len(runs)}"


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


def matching_runs(cfg: Config, pipeline: str, precision: str | None) -> tuple[SampleRun, ...]:
    """The runs on record that speak for ``cfg`` trained in ``pipeline`` ("sync", "async") at
    ``precision`` ("fp32", "bf16", "fp16"; None: one this machine cannot train in, which no run
    speaks for): its game, learner and settings, that pipeline and that precision."""
    mine = settings_of(cfg)
    return tuple(
        r
        for r in sample_runs()
        if r.env_id == cfg.env.id
        and r.algo == cfg.agent.algo
        and r.settings == mine
        and r.pipeline == pipeline
        and r.precision == precision
    )


def samples_to_target(cfg: Config, pipeline: str, precision: str | None) -> SamplesToTarget | None:
    """What the runs on record say ``cfg`` needs to reach its game's target in ``pipeline`` at
    ``precision`` (:func:`matching_runs`); None where too few of them reached it for a median
    (:func:`median_steps`). Whether enough did for a choice is the answer's ``enough``."""
    runs = matching_runs(cfg, pipeline, precision)
    reached = [r.reached_at for r in runs if r.reached_at]
    steps = median_steps(reached, [r.evaluated_to for r in runs if not r.reached_at])
    if steps is None or precision is None:
        return None
    return SamplesToTarget(
        cfg.env.id, runs[0].target, steps, len(reached), runs, pipeline, precision
    )


def ratio_points(cfg: Config, pipeline: str, precision: str | None) -> dict[Any, SamplesToTarget]:
    """What the runs on record needed at each value of ``cfg``'s learner's ``ratio_key`` (how
    much it learns from each env step: PQN's epochs) with every other setting of ``cfg``, in
    ``pipeline`` at ``precision``: the values at which at least :data:`MIN_REACHING` such runs
    reached the target (:func:`samples_to_target`'s ``enough``), each with its samples to
    target. Empty for a learner without a ratio key; one value where only ``cfg``'s own (or
    another single one) is so backed. The learning balance moves the ratio among these values
    only, and the calibration weighs these values only."""
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
    points = {
        v: samples_to_target(with_values(cfg, {key: v}), pipeline, precision)
        for v in sorted(values)
    }
    return {v: found for v, found in points.items() if found is not None and found.enough}


def _without(settings: str, key: str) -> str:
    return " ".join(w for w in settings.split() if not w.startswith(key + "="))


def _setting(settings: str, key: str) -> str:
    """The value ``settings`` gives ``key``, as written ("" where it gives none)."""
    return next((w.split("=", 1)[1] for w in settings.split() if w.startswith(key + "=")), "")
