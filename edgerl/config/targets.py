"""Samples to target: how many env steps a recipe needed to reach a game's target score, from the
runs on record (``edgerl/data/samples_to_target.csv``, kept equal to the runs under docs/runs/ by
a test).

How long a recipe takes on a machine is its samples to target over the env steps per second the
machine gives it: the first is the recipe's (the learner and the settings that decide how much
it learns from each step, its registry line's ``sample_keys``), the second the machine's
(``edgerl bench`` measures it). A run speaks for a config only where the game, the learner, the
sticky actions and every one of those settings agree: a DQN run with batches of 128 every 16
steps says nothing of batches of 32 every 4.

The figure is the median first evaluation at the target over the runs that reached it, beside how
many did (k of n): a run stopped by the clock before reaching the target (the GPU runs of 150 s)
counts in n with the step it was evaluated to. Evaluations come every 50,000 to 250,000 steps, so
each run's step is at most that much late.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
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
    steps: int  # the median first evaluation at the target, over the runs that reached it
    reached: int
    runs: tuple[SampleRun, ...]

    def describe(self) -> str:
        n = len(self.runs)
        return (
            f"{self.steps:,} env steps to {self.target:g} (the median of the {self.reached} of "
            f"{n} run{'s' if n != 1 else ''} on record with these settings that reached it)"
        )


def samples_to_target(cfg: Config) -> SamplesToTarget | None:
    """What the runs on record say ``cfg`` needs to reach its game's target; None where no run
    with its settings reached one."""
    mine = settings_of(cfg)
    runs = tuple(
        r
        for r in sample_runs()
        if r.env_id == cfg.env.id and r.algo == cfg.agent.algo and r.settings == mine
    )
    reached = [r.reached_at for r in runs if r.reached_at]
    if not reached:
        return None
    return SamplesToTarget(
        cfg.env.id, runs[0].target, int(statistics.median(reached)), len(reached), runs
    )


def ratio_points(cfg: Config) -> dict[Any, SamplesToTarget]:
    """What the runs on record needed at each value of ``cfg``'s learner's ``ratio_key`` (how
    much it learns from each env step: PQN's epochs) with every other setting of ``cfg``: the
    values some run reached the target at, each with its samples to target. Empty for a learner
    without a ratio key; one value where only ``cfg``'s own (or another single one) is on
    record. The learning balance moves the ratio among these values only."""
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
