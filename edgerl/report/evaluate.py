"""Periodic evaluation while training: ``eval.csv`` and the ``eval`` figure of the progress line.

Training returns include exploration: a CartPole run showed 368 while training and 500 when played
greedily. Every ``eval.every_steps`` env steps the :class:`Evaluator` (a training hook) takes a
copy of the online network's weights and plays ``eval.episodes`` episodes with them as the
learner's policy acts without its exploration (greedy: the action of the largest output; for a
policy that samples its actions as it learns, such as PPO's, each drawn from its distribution,
seeded from the evaluation's seed, since its argmax is a policy it never learned: PPO on Pong at
1.3M steps scored -20.8 greedily and -15.9 sampled), with ``eval.epsilon``'s random actions on
top, on environments of its own (the training game and env settings, one per
episode, all played at once with one batched forward pass per step and one emulator thread), in a
thread of its own: training goes on meanwhile. The forward passes run on the training device: on a
GPU machine the CPU's cores are the emulators' (an H200 with 16 cores, PQN Pong, 2026-11: ten
episodes took 40-68 s on the CPU beside training and 15 s after it, so that evaluations due at
500k, 750k and 1M steps were skipped while the one of 250k ran). Each evaluation appends one row to
``<run_dir>/eval.csv`` (:data:`EVAL_COLUMNS`); one with the best mean return so far keeps its
weights as the run's best policy (:mod:`edgerl.report.best`).

An evaluation still running when the next one is due makes that one skipped (logged): queueing it
would evaluate weights older than its step says, and a slow policy would pile evaluations up.
The one due at the run's last step is the exception: it waits for the running one, since training
is over and the last weights are the ones a user plays.

The thread keeps PyTorch's thread count and the process's priority, measured against the other
choices on 2 shared cores, training and an evaluation thread alternating every 2 s on a real Pong
run (sync, CPU). Training made 76 steps/s alone; beside an evaluation, 42 steps/s with PyTorch's
default threads (2) in the evaluation thread, 18 with ``torch.set_num_threads(1)`` there (a
preempted learner thread makes the learner's parallel regions wait), 56 with the thread at nice 10,
but evaluating at 118 steps/s instead of 335: per evaluation step, training lost 0.10 steps with
the defaults, 0.17 niced or with one thread. On CartPole the two Python loops share the GIL, and
training lost 0.2 steps per evaluation step either way (638 steps/s alone; 74 beside an
evaluation playing 2,866 steps/s, or 454 beside a niced one playing 864).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgerl.config import Config, EnvConfig, EvalConfig
from edgerl.envs import reference_steps, within_reference
from edgerl.envs.scores import human_normalised
from edgerl.errors import EdgerlError
from edgerl.files.checkpoint import Checkpoint
from edgerl.files.csvread import CsvReader, number
from edgerl.files.private import ensure_own_dir
from edgerl.files.sidefiles import AppendFile, SideFiles, csv_line
from edgerl.play import PlayOptions, PlayResult, play, play_together
from edgerl.play.observers import Filming
from edgerl.policies.torch import TorchPolicy
from edgerl.report.hooks import Hook, Run
from edgerl.report.metrics import TrainStats
from edgerl.words import plural

log = logging.getLogger(__name__)

EVAL_FILE = "eval.csv"
RECORDINGS_DIR = "recordings"  # eval.record's GIFs, in the run directory
EVAL_COLUMNS = [
    "step",  # the env step of the weights evaluated
    "wall_s",  # training time at that step, across sessions
    "episodes",
    "return_mean",
    "return_std",
    "return_min",
    "return_max",
    "length_mean",
    "cut",  # episodes cut at a cap: eval.max_episode_steps, or the game's own time limit
    "eval_s",  # how long the evaluation took
    # the mean return over each episode's first 5 minutes (18,000 frames): the length of play of
    # the human reference scores (Atari games; empty for others)
    "return_5min",
]
AUTO_MIN_STEPS = 50_000  # eval.every_steps = -1: shorter runs are not evaluated
AUTO_EVALUATIONS = 20  # ... longer ones about this many times
STOP_WAIT_S = 5.0  # a stop waits at most this long for the evaluation thread to end
# Evaluation episodes are seeded apart from training's (env.seed + step at each session start).
SEED_OFFSET = 1_000_000_000
# An evaluation says how far it is in the log this often (Breakout's first took 4.5 minutes, in
# silence); status.json shows it at every write.
PROGRESS_EVERY_S = 30.0


def eval_period(cfg: Config) -> int:
    """Env steps between evaluations (0: none): ``eval.every_steps``, or for -1 (auto) a
    twentieth of ``train.steps`` rounded down to thousands, none below 50,000 steps."""
    every = cfg.eval.every_steps
    if every >= 0:
        return every
    if cfg.train.steps < AUTO_MIN_STEPS:
        return 0
    return cfg.train.steps // AUTO_EVALUATIONS // 1000 * 1000


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: the episodes played with the weights of env step ``step``."""

    step: int
    wall_s: float
    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    cut: int
    eval_s: float
    returns_within: tuple[float, ...] = ()  # over the first 5 minutes (Atari games only)

    @property
    def return_mean(self) -> float:
        return float(np.mean(self.returns))

    def cells(self) -> dict[str, str]:
        """Its eval.csv cells, by column (:data:`EVAL_COLUMNS`)."""
        r = np.asarray(self.returns, dtype=np.float64)
        within = f"{np.mean(self.returns_within):.6g}" if self.returns_within else ""
        cells = [
            str(self.step),
            f"{self.wall_s:.3f}",
            str(len(r)),
            f"{r.mean():.6g}",
            f"{r.std():.6g}",
            f"{r.min():.6g}",
            f"{r.max():.6g}",
            f"{np.mean(self.lengths):.6g}",
            str(self.cut),
            f"{self.eval_s:.3f}",
            within,
        ]
        return dict(zip(EVAL_COLUMNS, cells, strict=True))

    def row(self, columns: list[str] = EVAL_COLUMNS) -> list[str]:
        """The cells of its eval.csv row in ``columns``' order (an older run's file keeps its
        own columns)."""
        cells = self.cells()
        return [cells[c] for c in columns]

    def describe(self, env_id: str = "") -> str:
        """One log line (with the human-normalised score where ``env_id`` has one)."""
        r = np.asarray(self.returns, dtype=np.float64)
        cut = f", {self.cut} cut at a cap" if self.cut else ""
        hns = human_normalised(env_id, float(r.mean())) if env_id else None
        normalised = "" if hns is None else f", {hns:.2f} human-normalised"
        within = within_reference(self.returns, self.returns_within, 1)
        return (
            f"evaluation at step {self.step:,}: mean return {r.mean():.1f} (std {r.std():.1f}, "
            f"min {r.min():g}, max {r.max():g}{normalised}) over "
            f"{plural(len(r), 'episode')}{cut}{within}, {self.eval_s:.1f} s"
        )


def evaluate(
    snapshot: Checkpoint,
    settings: EvalConfig,
    seed: int,
    stop: Callable[[], bool] | None = None,
    record: Path | None = None,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
    sample: bool = False,
) -> PlayResult:
    """Play ``settings.episodes`` episodes with the weights of ``snapshot`` (as
    :meth:`Run.policy_snapshot` gives them) on ``device``, all at once on as many new
    environments of the training game (:func:`~edgerl.play.play_together`); with ``record``, the
    first episode is played alone first and recorded to that GIF (see
    :mod:`edgerl.play.record`). With ``sample``, each action is drawn from the softmax of the
    policy's outputs (from the episodes' seeded generator), else the greedy one.

    ``progress`` is called as episodes end and steps are played (the recorded episode's are
    counted once it has ended). Fewer episodes come back when ``stop`` ended it early. Raises
    what building the environment or the network raises, and RecordError /
    MissingDependencyError before playing when the recording cannot be made.
    """
    policy = TorchPolicy(snapshot, device)
    within = reference_steps(EnvConfig(id=policy.spec.id)) or 0

    def options(n: int, seed: int, done: int = 0, played: int = 0) -> PlayOptions:
        def after(episodes: int, steps: int) -> None:
            assert progress is not None
            progress(done + episodes, played + steps)

        return PlayOptions(
            episodes=n,
            seed=seed,
            epsilon=settings.epsilon,
            sample=sample,
            max_episode_steps=settings.max_episode_steps,
            within_steps=within,
            stop=stop,
            progress=after if progress is not None else None,  # no call a step for nobody
        )

    if record is None:
        return play_together(policy, options(settings.episodes, seed))
    # The recorded episode on an environment that also draws the screen, the rest as usual.
    first = play(policy, options(1, seed), [Filming(record, policy.spec)])
    if settings.episodes == 1 or not first.returns:
        return first
    rest = play_together(policy, options(settings.episodes - 1, seed + 1, 1, first.steps))
    return replace(
        first,
        returns=first.returns + rest.returns,
        steps=first.steps + rest.steps,
        latencies_ns=first.latencies_ns + rest.latencies_ns,
        lengths=first.lengths + rest.lengths,
        cut=first.cut + rest.cut,
        returns_within=first.returns_within + rest.returns_within,
    )


def _previous(path: Path) -> tuple[int, tuple[int, float] | None, list[str]]:
    """Rows of an existing eval.csv, its newest (step, return_mean) and the columns to write in,
    for a resumed run: the file's own where an older edgerl wrote fewer (its rows stay whole),
    else :data:`EVAL_COLUMNS`.

    A damaged file never stops training: what cannot be read is skipped and named once in the
    log (see :mod:`edgerl.files.csvread`).
    """
    reader = CsvReader(path)
    count, last = 0, None
    try:
        for cells in reader.rows():
            assert reader.header is not None
            if not {"step", "return_mean"} <= set(reader.header):
                break  # no header we know: nothing to count
            row = dict(zip(reader.header, cells, strict=True))
            step, ret = number(row["step"]), number(row["return_mean"])
            if step is None or ret is None or not step.is_integer():
                continue
            last = (int(step), ret)
            count += 1
    except FileNotFoundError:
        return 0, None, EVAL_COLUMNS
    except OSError as e:
        log.warning("cannot read %s (%s); evaluations count from 0", path, e.strerror or e)
        return 0, None, EVAL_COLUMNS
    if (damage := reader.damage()) is not None:
        log.warning("%s has %s: skipped; training goes on", path, damage)
    header = reader.header or []
    older = len(set(header)) == len(header) and {"step", "return_mean"} <= set(header)
    if older and set(header) < set(EVAL_COLUMNS):
        return count, last, header
    return count, last, EVAL_COLUMNS


class Evaluator(Hook):
    """A training hook that evaluates the policy every ``period`` env steps in its own thread,
    its actions sampled from its outputs where ``sample`` (a learner that samples as it learns),
    else greedy.

    ``count`` is the number of evaluations of the run so far (earlier sessions' rows included).
    """

    def __init__(
        self,
        run_dir: Path,
        period: int,
        settings: EvalConfig,
        side: SideFiles | None = None,
        device: str = "cpu",
        sample: bool = False,
    ) -> None:
        from edgerl.report.best import best_evaluation

        self.run_dir = run_dir
        self.device = device  # where the evaluation's forward passes run: the training device
        self.sample = sample
        best = best_evaluation(run_dir)  # a resumed run keeps the best of its earlier sessions
        self.best: float | None = None if best is None else float(best["return_mean"])
        self.period = period
        self.settings = settings
        self.path = run_dir / EVAL_FILE
        self.recordings = run_dir / RECORDINGS_DIR
        self._record = settings.record  # 0 once a recording could not be made
        self.count, self.latest, self.columns = _previous(self.path)
        self.skipped = 0
        self._file = AppendFile(self.path, side or SideFiles(), header=csv_line(self.columns))
        self._next = period
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running_step = -1
        self._closed = False
        self._written = False  # no eval.csv until there is a row for it
        self.env_id = ""  # the run's game (on_start)
        # The evaluation in progress: (the step of its weights, episodes ended, of how many)
        self.progress: tuple[int, int, int] | None = None

    @property
    def running(self) -> bool:
        """An evaluation is in progress."""
        return self._thread is not None and self._thread.is_alive()

    # -- hook --------------------------------------------------------------------------------

    def on_start(self, run: Run) -> None:
        self.env_id = run.cfg.env.id
        self._next = (run.step // self.period + 1) * self.period
        log.info(
            "evaluations: %s every %s env steps, %s actions at epsilon %g, the first at step %s",
            plural(self.settings.episodes, "episode"),
            f"{self.period:,}",
            "sampled" if self.sample else "greedy",
            self.settings.epsilon,
            f"{self._next:,}",
        )

    def on_step(self, run: Run) -> None:
        if run.step >= self._next:
            self._next = (run.step // self.period + 1) * self.period
            if run.step >= run.cfg.train.steps:
                self._wait(run)  # the run's last evaluation is never skipped: training is over
            self._begin(run)

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        latest = self.latest
        if latest is not None:
            stats.eval_step, stats.eval_return = latest
        stats.evaluating = self.progress if self.running else None

    def on_end(self, run: Run) -> None:
        if run.step >= run.cfg.train.steps:
            self._wait(run)
        self.close()
        self.on_tick(run, run.stats)  # the end's progress line and status show the newest

    def _wait(self, run: Run) -> None:
        """Wait for the running evaluation to end, or a stop: a run that has trained all its
        steps keeps its last evaluation (the final score is the mean of the last ones), however
        long it plays on a busy machine; the hooks' on_wait keep the service's watchdog fed,
        and a stop (Ctrl-C, the service's stop) ends it at once."""
        if not self.running:
            return
        log.info(
            "waiting for the evaluation of step %s (a stop ends it)", f"{self._running_step:,}"
        )
        while self.running and not run.stop_requested:
            assert self._thread is not None
            self._thread.join(0.2)
            run.waiting()

    # -- the evaluation thread ---------------------------------------------------------------

    def _begin(self, run: Run) -> None:
        if self._stop.is_set():
            return
        if self.running:
            self.skipped += 1
            log.info(
                "evaluation at step %s skipped: the one of step %s is still running",
                f"{run.step:,}",
                f"{self._running_step:,}",
            )
            return
        snapshot = run.policy_snapshot()
        step, wall_s = run.step, run.wall_s()
        seed = (run.cfg.env.seed + SEED_OFFSET + step) % (1 << 31)
        self._running_step = step
        self._thread = threading.Thread(
            target=self._run,
            args=(snapshot, step, wall_s, seed),
            name="edgerl-eval",
            daemon=True,  # never keeps the process alive; close() ends it first
        )
        self._thread.start()

    def _run(self, snapshot: Checkpoint, step: int, wall_s: float, seed: int) -> None:
        started = time.monotonic()
        self.progress = (step, 0, self.settings.episodes)
        said = started

        def progress(done: int, steps: int) -> None:
            nonlocal said
            self.progress = (step, done, self.settings.episodes)
            now = time.monotonic()
            if now - said >= PROGRESS_EVERY_S:
                said = now
                log.info(
                    "evaluating step %s: %d of %s ended, %s steps played in %.0f s",
                    f"{step:,}",
                    done,
                    plural(self.settings.episodes, "episode"),
                    f"{steps:,}",
                    now - started,
                )

        try:
            result = self._evaluate(snapshot, step, seed, progress)
        except Exception as e:  # an evaluation never ends training
            log.error(
                "evaluation at step %s failed (%s: %s); training goes on",
                f"{step:,}",
                type(e).__name__,
                e,
            )
            log.debug("evaluation failure", exc_info=True)
            return
        if len(result.returns) < self.settings.episodes:
            log.info("evaluation at step %s stopped with training", f"{step:,}")
            return
        ev = Evaluation(
            step,
            wall_s,
            tuple(result.returns),
            tuple(result.lengths),
            result.cut,
            time.monotonic() - started,
            tuple(result.returns_within),
        )
        with self._lock:  # not after close(): a thread that outlived it writes nothing
            if self._closed:
                return
            self._file.append(csv_line(ev.row(self.columns)))
            self._written = True
            self.latest = (step, ev.return_mean)
            self.count += 1
        log.info("%s", ev.describe(self.env_id))
        with self._lock:  # close() waits for the best policy to be on disk
            if not self._closed and (self.best is None or ev.return_mean >= self.best):
                self._keep_best(snapshot, ev)

    def _keep_best(self, snapshot: Checkpoint, ev: Evaluation) -> None:
        """Keep the evaluated weights as the run's best policy (a failed write is logged; the
        previous best stays)."""
        from edgerl.report.best import save_best

        evaluation = {k: float(v) for k, v in ev.cells().items() if v}
        evaluation.update(step=ev.step, episodes=len(ev.returns), cut=ev.cut)
        try:
            path = save_best(self.run_dir, snapshot, evaluation)
        except OSError as e:
            log.warning("cannot keep the best policy of step %s: %s", f"{ev.step:,}", e)
            return
        previous = "" if self.best is None else f" (previous best {self.best:.1f})"
        self.best = ev.return_mean
        log.info("best policy so far%s: step %s, kept in %s", previous, f"{ev.step:,}", path)

    def _evaluate(
        self, snapshot: Checkpoint, step: int, seed: int, progress: Callable[[int, int], None]
    ) -> PlayResult:
        """One evaluation; every ``eval.record``-th of the run records its first episode."""

        def played(record: Path | None) -> PlayResult:
            stop, device, sample = self._stop.is_set, self.device, self.sample
            return evaluate(snapshot, self.settings, seed, stop, record, device, progress, sample)

        if self._record and (self.count + 1) % self._record == 0:
            record = self.recordings / f"eval-step-{step}.gif"
            try:
                ensure_own_dir(record.parent)  # never into a link, or another's folder
                result = played(record)
            except (EdgerlError, OSError) as e:  # raised before anything is played
                self._record = 0
                log.warning("evaluations are not recorded from now on: %s", e)
            else:
                if result.recording is not None:
                    log.info("recorded the evaluation of step %s: %s", f"{step:,}", record)
                return result
        return played(None)

    def close(self) -> None:
        """Stop an evaluation in progress (waits up to :data:`STOP_WAIT_S`) and close eval.csv."""
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)
            if self._thread.is_alive():
                log.warning(
                    "the evaluation of step %s did not stop within %.0f s; leaving it",
                    f"{self._running_step:,}",
                    STOP_WAIT_S,
                )
        with self._lock:
            self._closed = True
            if self._written:
                self._file.close()
