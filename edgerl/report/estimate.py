"""What a run can expect: what the runs on record gave for its game on this class of machine
(said at its start), and how long its steps take at the pace measured here (said once, after
its first minute of learning).

A figure from another machine is no estimate for this one (the 2-core Intel Xeon that trained
Pong with PQN in 41 minutes runs the same update about twice as fast as a 2-core AMD EPYC), so
the time left is only said once this machine's own pace is measured, and says it was measured
here; the records say where each was made.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import NamedTuple

from edgerl.config.fleet import fleet_envs
from edgerl.envs.scores import human_normalised
from edgerl.files.packaged import finite, read_table
from edgerl.hw.cpus import cpu_load
from edgerl.report.hooks import Hook, Run
from edgerl.report.metrics import TrainStats
from edgerl.report.quick import LONG_RUN_S, hours
from edgerl.words import duration

log = logging.getLogger(__name__)

MEASURE_S = 60.0  # the pace is measured over the first minute of learning
REFERENCE_GAME = "ALE/Pong-v5"  # the game every class of machine has on record


class Record(NamedTuple):
    env_id: str
    algo: str
    machine: str  # "cpu" or "gpu"
    where: str
    steps: int
    wall_s: float
    greedy_mean: float
    run: str

    def describe(self) -> str:
        hns = human_normalised(self.env_id, self.greedy_mean)
        normalised = "" if hns is None else f" ({hns:.2f} human-normalised)"
        return (
            f"{self.algo.upper()} reached a greedy {self.greedy_mean:g}{normalised} at step "
            f"{self.steps:,}, {duration(self.wall_s)} into training, on {self.where}"
        )


@functools.cache
def records() -> tuple[Record, ...]:
    """The runs on record (``edgerl/data/records.csv``)."""
    columns = {name: str for name in Record._fields}
    columns.update(steps=int, wall_s=finite, greedy_mean=finite)
    return tuple(Record(**r) for r in read_table("records.csv", columns))


def expectation(env_id: str, algo: str, gpu: bool) -> str | None:
    """What the records say a run of ``env_id`` with ``algo`` can expect on this class of machine
    (a GPU or not): the same game and learner, else the game with another learner, else Pong's
    record for the class; None where nothing is on record for the class."""
    machine = "gpu" if gpu else "cpu"
    mine = [r for r in records() if r.machine == machine]
    game = [r for r in mine if r.env_id == env_id]
    pick = [r for r in game if r.algo == algo] or game
    what = f"{env_id} on a {'GPU' if gpu else 'CPU'}"
    if not pick:
        pick = [r for r in mine if r.env_id == REFERENCE_GAME and r.algo == algo] or [
            r for r in mine if r.env_id == REFERENCE_GAME
        ]
        if not pick:
            return None
        what = f"{env_id} on a {'GPU' if gpu else 'CPU'}: nothing on record; for Pong"
    best = min(pick, key=lambda r: r.wall_s)
    return (
        f"on record for {what}, {best.describe()} (docs/results.md, runs/{best.run}); the time "
        "this run takes follows the pace measured here, said after its first minute of learning"
    )


def record_for(env_id: str, algo: str, gpu: bool) -> Record | None:
    """The run on record of ``env_id`` with ``algo`` on this class of machine that reached its
    score in the fewest steps (steps are what this machine's pace turns into time), if any."""
    machine = "gpu" if gpu else "cpu"
    same = [r for r in records() if (r.env_id, r.algo, r.machine) == (env_id, algo, machine)]
    return min(same, key=lambda r: r.steps, default=None)


def record_sentence(record: Record, seconds: float) -> str:
    """When this run gets to the step a record reached its score at, at the pace measured here
    (the time to the target score, where a run like it is on record)."""
    return (
        f"the run on record reached a greedy {record.greedy_mean:g} at step {record.steps:,} "
        f"(on {record.where}): at this pace this run is at that step in about "
        f"{duration(seconds)}, and there if it learns as that run did"
    )


class PaceEstimate(Hook):
    """Says once, after :data:`MEASURE_S` of learning, the pace measured here and the time the
    steps left take at it (with the quick run and a GPU suggested where an Atari run on a CPU
    takes hours)."""

    def __init__(self, frames: bool, gpu: bool) -> None:
        self.frames, self.gpu = frames, gpu
        self.said: str | None = None
        self._from: tuple[float, int] | None = None

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        if self.said is not None or stats.filling:
            return
        now = time.monotonic()
        if self._from is None:
            self._from = (now, run.step)
            return
        started, first = self._from
        if now - started < MEASURE_S:
            return
        pace = (run.step - first) / (now - started)
        left = max(0, run.cfg.train.steps - run.step)
        self.said = pace_sentence(pace, left, now - started, cpu_load().describe())
        record = record_for(run.cfg.env.id, run.cfg.agent.algo, self.gpu)
        if record is not None and pace > 0 and run.step < record.steps <= run.cfg.train.steps:
            self.said += "; " + record_sentence(record, (record.steps - run.step) / pace)
        if stats.episodes == 0:  # many environments, each in its first game: it looks dead
            envs = fleet_envs(run.cfg)  # a fleet's: every actor's environments
            self.said += (
                f"; no episode has ended yet: each of the {envs} environments plays its first "
                f"game to the end before a return is counted ({run.step // envs:,} steps each "
                "so far)"
            )
        if self.frames and not self.gpu and pace > 0 and left / pace > LONG_RUN_S:
            self.said += (
                "; for a first run that learns in minutes: edgerl train --quick (CartPole-v1 "
                "on a CPU), and train Atari on a GPU"
            )
        log.info("%s", self.said)


def pace_sentence(pace: float, left: int, over_s: float, load: str) -> str:
    """``measured here: 412 env steps/s over the first 60 s of learning (2 CPUs, 0.3 busy with
    other work): the 1,960,000 steps left take about 1 h 19 min``."""
    measured = f"measured here: {pace:,.0f} env steps/s over the first {over_s:.0f} s of learning"
    if pace <= 0:
        return f"{measured} ({load})"
    seconds = left / pace
    takes = hours(seconds) if seconds >= 2 * 3600 else f"about {duration(seconds)}"
    return f"{measured} ({load}): the {left:,} steps left take {takes}"
