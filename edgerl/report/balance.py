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

**The learning balance.** Threads and the lead move the speed; they never change what the
learner does with each env step. :class:`LearningRatio` does: it moves the learner's ratio
setting (its registry line's ``ratio_key``: PQN's epochs over each rollout) among the values
at which the runs on record give samples to target (:func:`edgerl.config.targets.ratio_points`:
a Kaplan-Meier median), never outside them: the runs with the run's other settings, in its
pipeline and at its precision, at least :data:`~edgerl.config.targets.MIN_REACHING` of them at
the target for each value, as the calibration asks of a recipe. From a minute of quiet windows
it takes the measured seconds per env step of each side, predicts the loop's speed at every such
value (the learner's time scaled by its cost model, :meth:`ratio_cost`) and the time to target that
buys (the samples to target on record at that value over that speed), and moves to the
neighbouring value where that is at least :data:`KEEP_GAIN` less than staying. Where the
learner is the limit (two CPU cores) a value that costs less per step can win even though it
needs more steps; where the learner waits (a big GPU), a value that learns more from each step
costs nothing. The value is the learner's state: its checkpoints keep it and a
resume goes on with it; ``metrics.csv`` has it in every row (the learner's figures).
``perf.balance = off`` and ``perf.deterministic`` hold it still too.
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
from edgerl.words import duration

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


def predict(actor_sps: float, learner_sps: float, mode: str) -> float:
    """The loop's env steps/s from each side's alone: the slower of the two where the learner
    has a thread of its own (``mode`` "async"), their harmonic sum where they take turns."""
    if mode == "async":
        return min(actor_sps, learner_sps)
    return 1.0 / (1.0 / actor_sps + 1.0 / learner_sps)


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


RATIO_MEASURE_S = 60.0  # seconds of quiet windows each learning-balance decision is measured on
RATIO_QUIET = 0.5  # CPUs other programs may keep busy in a window the learning balance counts


class LearningRatio:
    """The learning balance (see the module's docstring): the learner's ``key`` setting, now
    ``value``, moved among the values of ``samples`` (each with its env steps to the target on
    record) by :meth:`window`, through ``apply``; ``cost`` gives the learner's work per env
    step at a value (any unit: only its ratios count), ``mode`` is the pipeline's ("sync" or
    "async").

    A decision is taken on :data:`RATIO_MEASURE_S` seconds of windows (PQN learns once a
    rollout: a 20-second window holds two or three of its updates on two cores, and one more
    or less would swing the learner's time by a tenth), and moves one value, to the
    neighbouring value with the least predicted time, only where that is at least
    :data:`KEEP_GAIN` less than staying."""

    def __init__(
        self,
        key: str,
        value: Any,
        samples: dict[Any, int],
        mode: str,
        apply: Callable[[Any], None],
        cost: Callable[[Any], float],
    ) -> None:
        if value not in samples:
            raise ValueError(f"{key} = {value} has no run on record to move from")
        self.key, self.value, self.samples, self.mode = key, value, samples, mode
        self.values = sorted(samples)
        self.apply, self.cost = apply, cost
        self._measured = (0, 0.0, 0.0, 0.0)  # env steps, wall, actor and learner seconds

    def predicted(self, actor_s: float, learner_s: float) -> dict[Any, tuple[float, float]]:
        """(loop env steps/s, seconds from the start to the target at that speed) at each
        value, from the seconds per env step each side took at the present value."""
        here = self.cost(self.value)
        out = {}
        for v in self.values:
            sps = predict(1 / actor_s, 1 / (learner_s * self.cost(v) / here), self.mode)
            out[v] = (sps, self.samples[v] / sps)
        return out

    def window(self, steps: int, wall: float, actor_s: float, learner_s: float) -> Move | None:
        """Count a window of ``wall`` seconds and ``steps`` env steps in which the environments'
        side took ``actor_s`` seconds and the learner ``learner_s`` (NaN: not known, as on a
        GPU in one loop); once :data:`RATIO_MEASURE_S` are counted, decide. Returns the move
        made, if any."""
        if steps <= 0 or not (actor_s > 0 and learner_s > 0):  # NaN fails both
            return None
        n, w, a, b = self._measured
        n, w, a, b = n + steps, w + wall, a + actor_s, b + learner_s
        if w < RATIO_MEASURE_S:
            self._measured = (n, w, a, b)
            return None
        self._measured = (0, 0.0, 0.0, 0.0)
        predicted = self.predicted(a / n, b / n)
        i = self.values.index(self.value)
        new = min(self.values[max(0, i - 1) : i + 2], key=lambda v: predicted[v][1])
        (sps, seconds), (sps_here, here) = predicted[new], predicted[self.value]
        if new == self.value or seconds * (1 + KEEP_GAIN) > here:
            return None
        reason = (
            f"{self.samples[new]:,} env steps to target on record at {new}, {sps:,.0f} env "
            f"steps/s predicted from the last {duration(w)}: {duration(seconds)} of training "
            f"to target against {duration(here)} at {self.value} ({sps_here:,.0f} env steps/s)"
        )
        move = Move(self.key, self.value, new, reason)
        self.apply(new)
        self.value = new
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
        ratio: LearningRatio | None = None,
    ) -> None:
        self.sample, self.walk, self.gpu, self.every_s = sample, walk, gpu, every_s
        self.ratio = ratio
        self.moves: deque[Move] = deque(maxlen=MOVES_SHOWN)  # the walk's and the ratio's
        self._row = sample()
        self._window = (self._row, step, _cpu_sample())

    def row(self, stats: TrainStats, step: int) -> None:
        """Fill the row's ratio and sentence; walk once a window of ``every_s`` is over, and
        count the window for the learning balance."""
        now = self.sample()
        ratio = cpu_gpu_ratio(self._row, now)
        if stats.filling or not math.isnan(ratio):
            stats.cpu_gpu_ratio = ratio
            stats.who_waits = who_waits(ratio, self.gpu)
            self._row = now
        # else a window without an update since learning began (PQN learns once a rollout, a
        # row's window may fall between two): the row keeps the ratio measured up to the update
        # before, and the next one spans both windows
        if self.walk is None and self.ratio is None:
            return
        start, step0, cpu0 = self._window
        wall = now.wall - start.wall
        if wall < self.every_s:
            return
        cpu1 = _cpu_sample()
        others = others_busy(cpu0, cpu1) if cpu0 is not None and cpu1 is not None else None
        move = None if self.walk is None else self.walk.window((step - step0) / wall, others)
        # The learning balance counts a window that says what each side costs: none in which
        # the walk moved (a trial started or judged: steps/s must compare like with like),
        # other programs took CPUs, or an evaluation shared them.
        quiet = (others or 0.0) <= RATIO_QUIET and stats.evaluating is None
        if self.ratio is not None and move is None and quiet:
            actor = wall - (now.actor_wait_s - start.actor_wait_s)
            learner = now.learner_busy_s - start.learner_busy_s
            move = self.ratio.window(step - step0, wall, actor, learner)
        if move is not None:
            self.moves.append(move)
        stats.balance_moves = [m.describe() for m in self.moves]
        self._window = (now, step, cpu1)


def _cpu_sample() -> CpuSample | None:
    try:
        return CpuSample.now()
    except OSError:  # no /proc: other programs' load is not known
        return None


def watch(cfg: Config, learning: Any, gpu: bool, step: int, *, precision: str) -> BalanceWatch:
    """The balance of a run's pipeline ``learning`` (its ``balance_sample``, ``knobs``,
    ``mode`` and ``learner``), training at ``precision`` ("fp32", "bf16", "fp16"): walked, and
    its learning ratio moved, where ``perf.balance`` is auto, the run is not deterministic and
    something may move."""
    held = cfg.perf.balance == "off" or cfg.perf.deterministic
    knobs = learning.knobs()
    walk = None if held or not knobs else Balancer(knobs, cpu_load().cpus, seed=cfg.env.seed)
    ratio = None
    if not held:
        timed = not (gpu and learning.mode == "sync")  # one loop on a GPU: the update's time
        # is not known
        ratio = learning_ratio(cfg, learning.learner, learning.mode, precision, timed)
    every = cfg.perf.balance_every_s
    return BalanceWatch(learning.balance_sample, walk, gpu, every, step, ratio)


def learning_ratio(
    cfg: Config, learner: Any, mode: str, precision: str, timed: bool = True
) -> LearningRatio | None:
    """The learning balance of ``learner`` (training ``cfg`` in a pipeline of ``mode`` at
    ``precision``; its ratio now ``learner.ratio``: a resumed run's may differ from the
    config's), or None, said, where its learner has no ratio key, fewer than two values of it
    (its own among them) are backed by runs on record with ``cfg``'s other settings, pipeline
    and precision (:func:`edgerl.config.targets.ratio_points`), or its time is not measured
    (not ``timed``)."""
    from edgerl.config.learners import learner_info
    from edgerl.config.targets import MIN_REACHING, ratio_points

    key = learner_info(cfg.agent.algo).ratio_key
    if not key:
        return None
    points = {v: found.steps for v, found in ratio_points(cfg, mode, precision).items()}
    own = learner.ratio
    why = ""
    if len(points) < 2 or own not in points:
        why = (
            f"no other value has {MIN_REACHING} runs on record reaching the target with this "
            f"run's other settings, the {mode} pipeline and {precision}"
        )
    elif not timed:
        why = "the learner's time is not measured in one loop on a GPU"
    if why:
        log.info("learning balance: %s stays at %s (%s)", key, own, why)
        return None
    log.info(
        "learning balance: %s may move among %s (the values on record with these settings, the "
        "%s pipeline and %s)",
        key,
        ", ".join(f"{v} ({steps:,} env steps to target)" for v, steps in sorted(points.items())),
        mode,
        precision,
    )
    reused = mode == "sync"  # the actor's greedy values are the learner's own: reused

    def cost(value: Any) -> float:
        return learner.ratio_cost(value, values_reused=reused)

    return LearningRatio(key, own, points, mode, learner.set_ratio, cost)
