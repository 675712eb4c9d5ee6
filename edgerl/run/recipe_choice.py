"""What decides the calibration's choice (:mod:`edgerl.run.calibrate`): each recipe's speeds
measured here beside the runs on record that speak for it (its settings, in the pipeline and at
the precision it would train with here), and the choice among them.

A recipe is chosen on its predicted time only where at least
:data:`~edgerl.config.targets.MIN_REACHING` of those runs reached the target: one or two are a
seed's luck. Where the class's own recipe has fewer, nothing is weighed against it: it is
trained, and the log says why in one line.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from edgerl.config import Config
from edgerl.config.learners import pipeline_mode
from edgerl.config.targets import (
    MIN_REACHING,
    SampleRun,
    SamplesToTarget,
    grid,
    loops_on_record,
    matching_runs,
    samples_to_target,
    tally,
    upper_median,
)
from edgerl.hw.recipe import Recipe
from edgerl.report.balance import predict
from edgerl.run.recipe_speed import Figures
from edgerl.words import duration, plural

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measured:
    """One recipe on this machine: its halves' speeds, the loop they predict and the time to
    its target that predicts."""

    recipe: Recipe
    actor_steps_per_s: float
    learner_steps_per_s: float  # the learner-bound limit
    pipeline: str  # "sync" or "async", as the recipe would train here
    samples: SamplesToTarget | None  # at that pipeline and precision
    precision: str | None = "fp32"  # as it would train here (None: none this machine can do)
    runs: tuple[SampleRun, ...] = ()  # the runs on record at its settings, pipeline, precision
    eval_every: int = 0  # env steps between its evaluations (0: none): each one's cost is added

    @property
    def backed(self) -> bool:
        """Whether its samples to target may decide: at least MIN_REACHING runs on record
        reached the target with its settings, pipeline and precision."""
        return self.samples is not None and self.samples.enough

    @property
    def loop_steps_per_s(self) -> float:
        """The loop's speed as the balance predicts it from the two halves (0: one stalled)."""
        a, b = self.actor_steps_per_s, self.learner_steps_per_s
        return predict(a, b, self.pipeline) if a > 0 and b > 0 else 0.0

    @property
    def host_share(self) -> float:
        """What the loop is expected to keep of the halves' prediction: the median of how the
        loops of the runs on record in its pipeline went against theirs (the host work the two
        halves leave out, :func:`~edgerl.config.targets.loops_on_record`); 1 where no run in
        its pipeline kept its prediction."""
        return float(upper_median(loops_on_record(self.pipeline), empty=1.0))

    @property
    def predicted_s(self) -> float | None:
        """Training time to the end of the evaluation that reaches the target: the samples on
        record at the loop's expected speed (the halves' prediction times :attr:`host_share`),
        with the time its evaluations add (their cost on record); None without samples on
        record (or a stalled measurement)."""
        if self.samples is None or self.loop_steps_per_s <= 0:
            return None
        return self.samples.training_s(self.loop_steps_per_s * self.host_share, self.eval_every)

    def host_note(self) -> str:
        """The host work in words: how the loops on record in its pipeline went."""
        ratios = loops_on_record(self.pipeline)
        if not ratios:
            return (
                f"no run on record in the {self.pipeline} pipeline kept its prediction, so the "
                "host work the halves leave out is not in it"
            )
        n, spread = (
            len(ratios),
            f"{ratios[0]:.2f}" + (f"-{ratios[-1]:.2f}" if len(ratios) > 1 else ""),
        )
        kept = "theirs" if n > 1 else "its"
        return (
            f"the loop at {self.host_share:.2f} of the halves' prediction, as the "
            f"{plural(n, 'run')} on record in the {self.pipeline} pipeline that kept {kept} "
            f"went ({spread}): the host work the halves leave out"
        )

    def describe(self) -> str:
        limit = (
            "the emulator" if self.actor_steps_per_s < self.learner_steps_per_s else "the learner"
        )
        speed = (
            f"actor {self.actor_steps_per_s:,.0f} and learner {self.learner_steps_per_s:,.0f} "
            f"env steps/s, {self.pipeline}: {self.loop_steps_per_s:,.0f} predicted ({limit} the "
            "limit)"
        )
        samples, predicted = self.samples, self.predicted_s
        trained = f"{self.pipeline}, {self.precision or 'no precision it can train in here'}"
        if samples is None or predicted is None:
            return (
                f"{self.recipe.name}: {speed}; no samples to target on record at its settings "
                f"({trained}: {tally(self.runs)} runs reached the target)"
            )
        said = (
            f"{self.recipe.name}: {speed}; {samples.steps:,} env steps to {samples.target:g} "
            f"on record ({trained}: {samples.reached} of {len(samples.runs)} runs reached it, "
            f"evaluated every {grid(samples.runs)}): {duration(predicted)}"
        )
        notes = []
        evaluations = samples.evaluations(self.eval_every)
        if evaluations and (samples.eval_cost_steps or samples.eval_tail_steps):
            said += f" with {plural(evaluations, 'evaluation')}"
            notes.append(
                f"each before the last adds the time of {samples.eval_cost_steps:,} loop steps "
                f"and the last takes that of {samples.eval_tail_steps:,}, on record"
            )
        if samples.enough:
            notes.append(self.host_note())
            notes.append(samples.error(self.loop_steps_per_s * self.host_share, self.eval_every))
        if notes:
            said += f" ({'; '.join(notes)})"
        if not samples.enough:
            said += f", not chosen on it (fewer than {MIN_REACHING} runs reached it)"
        return said


def trained_here(cfg: Config) -> tuple[str, str | None]:
    """(pipeline, precision) ``cfg`` would train with on this machine: ``perf.pipeline`` and
    ``perf.amp`` resolved on the device ``perf.device`` gives here, as training resolves them
    (Atari frames: the calibration's recipes are Pong's). The precision is None where this
    machine cannot train in the one asked (bf16 on a CPU without it, a CUDA device missing):
    no run on record speaks for it."""
    from edgerl.errors import EdgerlError
    from edgerl.hw.device import precision_of, resolve_device

    try:
        device = resolve_device(cfg.perf.device)
    except EdgerlError:
        return pipeline_mode(cfg.perf.pipeline, "cpu", cfg.agent.algo), None
    pipeline = pipeline_mode(cfg.perf.pipeline, device.type, cfg.agent.algo)
    try:
        return pipeline, precision_of(cfg.perf.amp, device, frames=True)
    except EdgerlError:
        return pipeline, None


def weighed(recipe: Recipe, cfg: Config, figures: Figures) -> Measured:
    """The recipe's figures with the runs on record that speak for it: its settings, in the
    pipeline it was measured in, at the precision it would train in here."""
    from edgerl.report.evaluate import eval_period

    actor, learner, pipeline = figures
    precision = trained_here(cfg)[1]
    return Measured(
        recipe,
        actor,
        learner,
        pipeline,
        samples=samples_to_target(cfg, pipeline, precision),
        precision=precision,
        runs=matching_runs(cfg, pipeline, precision),
        eval_every=eval_period(cfg),
    )


def choose(measured: list[Measured], class_recipe: Recipe) -> Recipe:
    """The recipe with the least predicted time to its target among those whose samples to
    target enough runs on record back (:attr:`Measured.backed`), naming the figures in its
    ``why``; the class's own where it has no prediction or is not so backed (then said in the
    log, in one line: why)."""
    figures = "; ".join(m.describe() for m in measured)
    own = next((m for m in measured if m.recipe == class_recipe), None)
    if own is None or own.loop_steps_per_s <= 0:  # not measured here, or stalled
        return dataclasses.replace(
            class_recipe,
            why=f"{class_recipe.why}; calibrated, kept: no time predicted for it here ({figures})",
        )
    if not own.backed:
        # nothing to weigh the class's own against (a small board's 64 environments: no run
        # on record trained with them; one or two lucky runs): it is kept, never traded for a
        # recipe whose time alone is known
        reason = unbacked(measured, class_recipe)
        log.info("calibration: %s", reason)
        return dataclasses.replace(
            class_recipe, why=f"{class_recipe.why}; calibrated, kept: {reason} ({figures})"
        )
    timed = [m for m in measured if m.backed and m.predicted_s is not None]
    best = min(timed, key=lambda m: m.predicted_s)  # type: ignore[arg-type, return-value]
    machine = class_recipe.why.split(":", 1)[0]  # the class's words name its own learner too
    why = (
        f"{machine}: calibrated here, the least time predicted among the recipes with "
        f"{MIN_REACHING} runs or more on record reaching the target: {figures}"
    )
    return dataclasses.replace(best.recipe, why=why)


def unbacked(measured: list[Measured], class_recipe: Recipe) -> str:
    """Why the class's own recipe is trained though others were measured, in one line: how
    many runs on record reached the target with each recipe's settings, pipeline and
    precision, fewer than MIN_REACHING for the class's own (and for every one, where none has
    as many)."""
    ways = {(m.pipeline, m.precision) for m in measured}

    def way(pipeline: str, precision: str | None) -> str:
        return f"the {pipeline} pipeline and {precision or 'no precision it can train in here'}"

    if len(ways) == 1:
        (pipeline, precision), *_ = ways
        counts = ", ".join(f"{m.recipe.name} {tally(m.runs)}" for m in measured)
        with_what = f"with {way(pipeline, precision)} ({counts})"
    else:
        with_what = (
            "with the pipeline and precision each would train with here ("
            + ", ".join(
                f"{m.recipe.name} {tally(m.runs)} with {way(m.pipeline, m.precision)}"
                for m in measured
            )
            + ")"
        )
    own = class_recipe.name
    if any(m.backed for m in measured):
        said = (
            f"{own} has fewer than {MIN_REACHING} runs on record reaching the target, so no "
            f"time of its own to weigh the others against, {with_what}"
        )
    else:
        said = f"no recipe has {MIN_REACHING} runs on record reaching the target {with_what}"
    return f"{said}: training {own}, this machine class's recipe"
