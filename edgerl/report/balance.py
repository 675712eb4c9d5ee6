"""The balance of the two sides of training, measured while it runs, and a walk over what can
change live, kept only where it pays.

**The CPU/GPU ratio.** One side of training steps the environments and acts (ALE's threads and
the loop: the CPU), the other learns (the learner: the GPU, or the CPU's cores in the plain
loop). Over a window, the ratio is the env steps/s the environment side could supply (steps
over the time it was not waiting for the learner) over those the learner could use (steps over
the time it was busy), that is the learner's busy time over the actor's. Above 1 the
environments wait for the learner; below 1 the learner waits for the environments (a GPU that
idles). Each pipeline says how long each side waited (:meth:`Pipeline.balance_sample`);
``metrics.csv`` has the ratio in every row, ``edgerl status`` and ``edgerl serve`` the sentence
of :func:`who_waits`. The CPU/GPU-ratio study (arXiv 2012.04210) made this the measure of an RL
system's balance.

**The walk.** GA3C re-balanced its agents, predictors and trainers while it trained: every 20 s
one count moved up or down by one, kept only when trainings per second improved. edgerl walks
what can change without breaking the replay ratio or a checkpoint: PyTorch's CPU threads where
the learner runs on the CPU, and the async actor's lead over the learner (``perf.max_ahead``).
Every ``perf.balance_every_s`` it measures steps/s; a trial move is kept when the next window is
at least :data:`KEEP_GAIN` faster, else undone and not tried again for twice as long as before.
Threads follow the load instead of chance: when other programs keep CPUs busy that PyTorch's
threads counted on, threads are given up at once (a parallel region waits for its slowest
thread, and a preempted thread makes every region wait: training would slow tenfold instead of
in proportion), and tried back up once the CPUs are free. Every move is logged
with its reason and shown by ``edgerl status``; ``perf.balance = off`` or ``perf.deterministic``
hold everything still. The environments' count and ALE's threads are fixed when the
environments are built: the ratio's sentence says when more would help a next run.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgerl.hw.cpus import CpuSample, cpu_load, others_busy

if TYPE_CHECKING:
    from edgerl.config import Config
    from edgerl.report.metrics import TrainStats

log = logging.getLogger(__name__)

BAND = 0.15  # a ratio within this of 1 is balanced (both sides busy)
KEEP_GAIN = 0.03  # a trial move is kept when steps/s rose at least this much
EXPLORE_EVERY = 3  # quiet windows between trial moves
MOVES_SHOWN = 5  # moves status.json keeps


@dataclass(frozen=True)
class BalanceSample:
    """Cumulative clocks of a pipeline at one moment (seconds)."""

    wall: float  # time.monotonic()
    actor_wait_s: float  # the environment side waiting for the learner
    learner_busy_s: float  # the learner at work (its device's time included)


def cpu_gpu_ratio(before: BalanceSample, after: BalanceSample) -> float:
    """The learner's busy time over the actor's between two samples (NaN when the window is
    empty, or one side did nothing: the actor, or the learner while the replay fills, which
    says nothing about which side is faster)."""
    wall = after.wall - before.wall
    actor = wall - (after.actor_wait_s - before.actor_wait_s)
    learner = after.learner_busy_s - before.learner_busy_s
    if wall <= 0 or actor <= 0.01 * wall or math.isnan(learner) or learner <= 0:
        return math.nan
    return max(0.0, learner) / actor


def who_waits(ratio: float, gpu: bool) -> str:
    """One sentence: which side waits for which at ``ratio`` (empty when not measured)."""
    if math.isnan(ratio):
        return ""
    learner = "the GPU" if gpu else "the learner"
    # Without a GPU both sides share the CPU: the ratio is the learner's time over the actor's.
    named = f"CPU/GPU ratio {ratio:.2f}" if gpu else f"learner/actor time ratio {ratio:.2f}"
    if ratio < 1 - BAND:
        return (
            f"{learner} waits for the environments ({named}): more "
            "environments or ALE threads would help"
        )
    if ratio > 1 + BAND:
        what = (
            "bigger batches at the same samples per env step, or a faster update"
            if gpu
            else "a faster update (the learner has the CPU's cores)"
        )
        return f"the environments wait for {learner} ({named}): {what} would help"
    return f"both sides busy ({named})"


@dataclass
class Knob:
    """Something the walk may move: its value now, its bounds, how a step changes it (``+1``
    or doubling) and how a new value is applied."""

    name: str
    value: int
    low: int
    high: int
    apply: Callable[[int], None]
    doubling: bool = False

    def step(self, direction: int) -> int:
        """The value one step up (1) or down (-1), within the bounds."""
        if self.doubling:
            new = self.value * 2 if direction > 0 else self.value // 2
        else:
            new = self.value + direction
        return min(self.high, max(self.low, new))


@dataclass(frozen=True)
class Move:
    """One step of the walk, as logged and shown."""

    knob: str
    old: int
    new: int
    reason: str

    def describe(self) -> str:
        return f"{self.knob} {self.old} -> {self.new}: {self.reason}"


@dataclass
class _Trial:
    knob: Knob
    old: int
    sps_before: float
    direction: int


class Balancer:
    """The walk over ``knobs``; :meth:`window` is called with each window's steps/s.

    PyTorch's threads (the knob named ``threads_knob``) follow the load rather than chance: as
    many as the CPUs other programs leave free, cut at once when they take some, tried back up
    (kept only if faster) when they leave. A random step on them costs a whole window at the
    wrong count (on 2 cores, one thread runs the update at about 0.6 of two), so they are never
    explored. The other knobs are: one step every :data:`EXPLORE_EVERY` quiet windows, and a
    step that was undone waits twice as long before it is tried again."""

    def __init__(
        self, knobs: list[Knob], cpus: int, seed: int = 0, threads_knob: str = "threads"
    ) -> None:
        self.knobs = {k.name: k for k in knobs}
        self.cpus = cpus
        self.threads_knob = threads_knob
        self.rng = random.Random(seed)
        self.moves: deque[Move] = deque(maxlen=MOVES_SHOWN)
        self._trial: _Trial | None = None
        self._quiet = 0
        self._wait: dict[tuple[str, int], int] = {}  # (knob, direction) -> windows to wait
        self._backoff: dict[tuple[str, int], int] = {}

    def window(self, sps: float, others_busy: float | None) -> Move | None:
        """Decide after a window of ``sps`` env steps/s, with other programs keeping
        ``others_busy`` CPUs busy (None: not measured). Returns the move made, if any."""
        for key in list(self._wait):
            self._wait[key] -= 1
            if self._wait[key] <= 0:
                del self._wait[key]
        threads = self.knobs.get(self.threads_knob)
        free = None if others_busy is None else max(1, round(self.cpus - others_busy))
        if threads is not None and free is not None and threads.value > free:
            # before anything else: never wait for a preempted thread
            self._trial = None
            return self._move(
                threads, free, f"other programs kept {others_busy:.1f} of {self.cpus} CPUs busy"
            )
        if self._trial is not None:
            return self._judge(self._trial, sps)
        more = threads is not None and free is not None and threads.value < min(free, threads.high)
        if more and (self.threads_knob, 1) not in self._wait:  # CPUs are free: one more thread
            assert threads is not None
            return self._try(threads, 1, sps, f"{free} CPUs are free of other programs")
        explorable = sorted(
            (k for k in self.knobs.values() if k.name != self.threads_knob), key=lambda k: k.name
        )
        self._quiet += 1
        if self._quiet < EXPLORE_EVERY or not explorable:
            return None
        self._quiet = 0
        knob = self.rng.choice(explorable)
        for direction in self.rng.sample((-1, 1), 2):
            if knob.step(direction) != knob.value and (knob.name, direction) not in self._wait:
                return self._try(knob, direction, sps, "trying a step")
        return None

    def _try(self, knob: Knob, direction: int, sps: float, why: str) -> Move:
        self._trial = _Trial(knob, knob.value, sps, direction)
        new = knob.step(direction)
        return self._move(knob, new, f"{why} (kept if steps/s rise from {sps:,.0f})")

    def _judge(self, trial: _Trial, sps: float) -> Move | None:
        self._trial = None
        key = (trial.knob.name, trial.direction)
        if sps >= trial.sps_before * (1 + KEEP_GAIN):
            self._backoff.pop(key, None)
            move = Move(
                trial.knob.name,
                trial.old,
                trial.knob.value,
                f"kept: {sps:,.0f} steps/s against {trial.sps_before:,.0f}",
            )
            self.moves.append(move)
            log.info("balance: %s", move.describe())
            return move
        self._backoff[key] = wait = 2 * self._backoff.get(key, EXPLORE_EVERY)
        self._wait[key] = wait
        return self._move(
            trial.knob,
            trial.old,
            f"undone: {sps:,.0f} steps/s against {trial.sps_before:,.0f} before (not tried "
            f"again for {wait} windows)",
        )

    def _move(self, knob: Knob, new: int, reason: str) -> Move:
        move = Move(knob.name, knob.value, new, reason)
        knob.apply(new)
        knob.value = new
        self.moves.append(move)
        log.info("balance: %s", move.describe())
        return move


class BalanceWatch:
    """The trainer's side of the balance: at each metrics row, the ratio over the row's window
    and its sentence in ``stats``; every ``every_s``, one window of the walk (``walk`` None:
    measured, never moved)."""

    def __init__(
        self,
        sample: Callable[[], BalanceSample],
        walk: Balancer | None,
        gpu: bool,
        every_s: float,
        step: int,
    ) -> None:
        self.sample, self.walk, self.gpu, self.every_s = sample, walk, gpu, every_s
        self._row = sample()
        self._window = (self._row.wall, step, _cpu_sample())

    def row(self, stats: TrainStats, step: int) -> None:
        """Fill the row's ratio and sentence; walk once a window of ``every_s`` is over."""
        now = self.sample()
        stats.cpu_gpu_ratio = cpu_gpu_ratio(self._row, now)
        stats.who_waits = who_waits(stats.cpu_gpu_ratio, self.gpu)
        self._row = now
        if self.walk is None:
            return
        t0, step0, cpu0 = self._window
        if now.wall - t0 < self.every_s:
            return
        cpu1 = _cpu_sample()
        others = others_busy(cpu0, cpu1) if cpu0 is not None and cpu1 is not None else None
        self.walk.window((step - step0) / (now.wall - t0), others)
        stats.balance_moves = [m.describe() for m in self.walk.moves]
        self._window = (now.wall, step, cpu1)


def _cpu_sample() -> CpuSample | None:
    try:
        return CpuSample.now()
    except OSError:  # no /proc: other programs' load is not known
        return None


def watch(cfg: Config, learning: Any, gpu: bool, step: int) -> BalanceWatch:
    """The balance of a run's pipeline ``learning`` (its ``balance_sample`` and ``knobs``):
    walked where ``perf.balance`` is auto, the run is not deterministic and something may
    move."""
    knobs = learning.knobs()
    still = cfg.perf.balance == "off" or cfg.perf.deterministic or not knobs
    walk = None if still else Balancer(knobs, cpu_load().cpus, seed=cfg.env.seed)
    return BalanceWatch(learning.balance_sample, walk, gpu, cfg.perf.balance_every_s, step)
