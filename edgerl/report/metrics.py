"""Training metrics: ``metrics.csv``, ``episodes.csv``, optional TensorBoard, the console
progress line and the session's summary."""

from __future__ import annotations

import logging
import math
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from edgerl.errors import MissingDependencyError
from edgerl.files.private import ensure_own_dir
from edgerl.files.regular import open_regular
from edgerl.files.sidefiles import AppendFile, SideFiles, csv_line
from edgerl.words import plural

log = logging.getLogger(__name__)


@dataclass
class TrainStats:
    """A snapshot of a run's progress; one metrics.csv row and one progress line."""

    step: int = 0
    total_steps: int = 0
    wall_s: float = 0.0
    sps: float = 0.0
    episodes: int = 0
    return_mean: float = math.nan  # over the last 100 episodes
    epsilon: float = 1.0
    # Whether the learner explores by epsilon (its registry line's explores_by_epsilon): one whose
    # exploration is its own (a policy's noise, sampled actions, members played greedily)
    # shows none.
    explores: bool = True
    loss: float = math.nan
    updates: int = 0
    load: dict[str, Any] = field(default_factory=dict)  # newest monitor sample, flattened
    learning_starts: int = 0  # the step learning starts at (later after a resume: the refill)
    fill_from: int = 0  # the step the replay began filling at in this session
    eval_return: float = math.nan  # mean return of the newest evaluation (eval.csv)
    eval_step: int = -1  # the step of the weights it evaluated
    evaluating: tuple[int, int, int] | None = None  # in progress: (step, episodes ended, of)
    fleet: dict[str, Any] | None = None  # the remote actors' state (fleet.actors), for status
    # The learner's busy time over the actor's in the row's window (edgerl.report.balance), the
    # sentence saying who waits, and the balancer's newest moves (for status).
    cpu_gpu_ratio: float = math.nan
    who_waits: str = ""
    balance_moves: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)  # the learner's own (Learner.figures)
    # Seconds to train.steps at this session's learning pace so far (NaN until it is known): the
    # progress bar's time left, steady where a 30 s window swung with evaluations and rollouts.
    left_s: float = math.nan

    @property
    def filling(self) -> bool:
        """Still filling the replay: no update has run, and the pace is not the learning one."""
        return self.step < self.learning_starts

    def filling_text(self) -> str:
        """``filling replay 12,000/20,000: learning starts at step 20,000``."""
        needed = max(self.learning_starts - self.fill_from, 1)
        done = min(max(self.step - self.fill_from, 0), needed)
        return (
            f"filling replay {done:,}/{needed:,}: learning starts at step {self.learning_starts:,}"
        )

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("total_steps", "learning_starts", "fill_from", "eval_return", "eval_step",
                    "evaluating", "fleet", "who_waits", "balance_moves", "left_s"):  # fmt: skip
            d.pop(key)
        load = d.pop("load")
        d.update(load)
        figures = d.pop("figures")
        d.update({k: v for k, v in figures.items() if k not in d})  # never a trainer column
        return d


CSV_COLUMNS = [
    "step", "wall_s", "sps", "episodes", "return_mean", "epsilon", "loss", "updates",
    "cpu_gpu_ratio",
]  # fmt: skip


RATE_WINDOW_S = 1.0  # steps/s is measured over at least this long
SMOOTH_S = 30.0  # and over at most about this long: the pace, not a rollout or an update


class Pace:
    """Steps/s as training is judged by: over the last :data:`SMOOTH_S` seconds (PQN on a CPU
    alternates a rollout at 700 steps/s with an update of several seconds at none: a shorter
    window swung between the two), never across the start of learning; and this session's
    steps and seconds split into the replay's filling and learning. The filling pace is no guide
    to the learning one: Breakout's quick run filled its replay at hundreds of steps/s and
    learned at 28-30."""

    def __init__(self, step: int, now: float, learning_starts: int) -> None:
        self.start = (now, step)  # this session's
        self.recent: deque[tuple[float, int]] = deque([(now, step)])  # (time, step) samples
        self.learning_from: tuple[float, int] | None = None  # when learning began, this session
        self.sps = 0.0
        self.follow(step, learning_starts, now)

    def follow(self, step: int, learning_starts: int, now: float) -> None:
        """After each step: once ``step`` reaches ``learning_starts``, learning runs from here
        and the rate forgets the filling."""
        if self.learning_from is None and step >= learning_starts:
            self.learning_from = (now, step)
            self.recent = deque([(now, step)])
            self.sps = 0.0  # the filling pace is no guide: the next rate is the learning one

    def rate(self, step: int, now: float) -> float:
        """The steps/s to show now: over the last SMOOTH_S seconds of samples (each call is
        one), once they span RATE_WINDOW_S (until then the rate before stays)."""
        recent = self.recent
        recent.append((now, step))
        while len(recent) > 2 and recent[1][0] <= now - SMOOTH_S:
            recent.popleft()
        t0, s0 = recent[0]
        if now - t0 >= RATE_WINDOW_S or (self.sps == 0.0 and now > t0):
            self.sps = (step - s0) / (now - t0)
        return self.sps

    def phases(self, step: int, now: float) -> tuple[int, float, int, float]:
        """(filling steps, filling seconds, learning steps, learning seconds) this session."""
        t0, s0 = self.start
        if self.learning_from is None:
            return step - s0, now - t0, 0, 0.0
        tl, sl = self.learning_from
        return sl - s0, tl - t0, step - sl, now - tl


def nothing_to_do(run_dir: Path, step: int, total: int) -> str:
    """The sentence for a run that has already reached ``train.steps``: what to do instead."""
    return (
        f"the run in {run_dir} is already at step {step:,} of {total:,}: nothing to do; to "
        f"train it further give a larger total (--steps {2 * total:,}, or train.steps), or "
        "start over with --fresh (the old run is moved aside)"
    )


@dataclass(frozen=True)
class TrainResult:
    step: int
    total_steps: int
    episodes: int
    return_mean: float
    wall_s: float
    fill_steps: int  # this session's steps while the replay filled, and their seconds
    fill_s: float
    learn_steps: int  # this session's steps while it learned
    learn_s: float
    checkpoint: Path | None
    stopped: bool  # a stop was requested before train.steps was reached

    @property
    def session_steps(self) -> int:
        return self.fill_steps + self.learn_steps

    def pace(self) -> str:
        """``28 steps/s learning (the replay filled at 1,950 steps/s)``: the session's rates."""
        learn = self.learn_steps / self.learn_s if self.learn_s > 0 else 0.0
        fill = self.fill_steps / self.fill_s if self.fill_s > 0 else 0.0
        if self.learn_steps and self.fill_steps:
            return f"{learn:,.0f} steps/s learning (the replay filled at {fill:,.0f} steps/s)"
        if self.fill_steps:
            return f"{fill:,.0f} steps/s filling the replay (learning had not started)"
        return f"{learn:,.0f} steps/s"

    def summary(self) -> str:
        """One line for the end of ``edgerl train``."""
        ret = "n/a" if math.isnan(self.return_mean) else f"{self.return_mean:.2f}"
        return (
            f"step {self.step:,}/{self.total_steps:,}: {plural(self.episodes, 'episode')}, "
            f"mean return (last 100) {ret}, {self.pace()}; "
            f"checkpoint {self.checkpoint or 'unchanged'}"
        )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.6g}"
    return "" if value is None else str(value)


def check_extras(tensorboard: bool) -> None:
    """Raise MissingDependencyError now, before a run directory is made, when an output the
    config asks for needs a package that is not installed."""
    import importlib.util

    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise MissingDependencyError("tensorboard", "tensorboard", "train.tensorboard=true")


class MetricsWriter:
    """Appends rows to ``<run_dir>/metrics.csv`` (and TensorBoard events if asked).

    A resumed run appends to the same file. If an older edgerl wrote other columns, that file is
    kept as ``metrics.<n>.csv`` and a new one started. Neither file stops training when it cannot
    be written: ``side`` records the problem and rows are written once there is room again.
    """

    def __init__(
        self,
        run_dir: Path,
        columns: list[str],
        tensorboard: bool = False,
        side: SideFiles | None = None,
    ) -> None:
        self.path = run_dir / "metrics.csv"
        self.columns = columns
        self.side = side or SideFiles()
        self.side.attempt(self.path.name, self._rotate_if_columns_changed)
        self._file = AppendFile(self.path, self.side, header=csv_line(columns))
        self._file.flush()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise MissingDependencyError(
                    "tensorboard", "tensorboard", "train.tensorboard=true"
                ) from None
            tb_dir = str(run_dir / "tensorboard")

            def open_tb() -> None:
                ensure_own_dir(Path(tb_dir))  # never into a link, or another's folder
                self._tb = SummaryWriter(tb_dir)

            self.side.attempt("tensorboard", open_tb)

    def _rotate_if_columns_changed(self) -> None:
        if not self.path.is_file() or self.path.is_symlink():
            return  # a link: refused when the rows are written (AppendFile never follows one)
        with open_regular(self.path, follow=False) as f:  # bytes: the rest may be damaged
            header = f.readline(4096).strip().decode("utf-8", errors="replace")
        if not header or header == ",".join(self.columns):
            return
        n = 1
        while (aside := self.path.with_name(f"metrics.{n}.csv")).exists():
            n += 1
        self.path.rename(aside)
        log.info("metrics.csv had other columns (or a damaged header); kept it as %s", aside.name)

    def write(self, stats: TrainStats) -> None:
        row = stats.row()
        self._file.append(csv_line([_fmt(row.get(c)) for c in self.columns]))
        if self._tb is not None:
            tb = self._tb

            def add() -> None:
                for key in ("sps", "return_mean", "epsilon", "loss"):
                    value = row.get(key)
                    if isinstance(value, float) and not math.isnan(value):
                        tb.add_scalar(f"train/{key}", value, stats.step)

            self.side.attempt("tensorboard", add)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self.side.attempt("tensorboard", self._tb.close)
            self._tb = None


EPISODE_COLUMNS = ["step", "episode", "env", "return", "length", "wall_s"]


class EpisodeWriter:
    """Appends one row per finished episode to ``<run_dir>/episodes.csv``.

    Like metrics.csv it never stops training (``side`` records a failed write and the rows are
    written once there is room again); a resumed run appends, with the header written once.
    """

    def __init__(self, run_dir: Path, side: SideFiles | None = None) -> None:
        self.path = run_dir / "episodes.csv"
        self.side = side or SideFiles()
        self._file = AppendFile(self.path, self.side, header=csv_line(EPISODE_COLUMNS))
        self._file.flush()

    def write(
        self, step: int, episode: int, env: int, ret: float, length: int, wall_s: float
    ) -> None:
        cells = [str(step), str(episode), str(env), _fmt(float(ret)), str(length), f"{wall_s:.3f}"]
        self._file.append(csv_line(cells))

    def close(self) -> None:
        self._file.close()


def progress_fields(stats: TrainStats) -> str:
    """The one-line summary shared by the progress bar, log lines and the service STATUS."""
    parts = [f"{stats.sps:,.0f} steps/s", f"ep {stats.episodes:,}"]
    if stats.filling:
        parts.insert(0, stats.filling_text())
    if not math.isnan(stats.return_mean):
        parts.append(f"return {stats.return_mean:.1f}")
    if not math.isnan(stats.eval_return):
        parts.append(f"eval {stats.eval_return:.1f}")
    if stats.explores:
        parts.append(f"eps {stats.epsilon:.3f}")
    if not math.isnan(stats.loss):
        parts.append(f"loss {stats.loss:.4f}")
    parts += [f"{name} {value:g}" for name, value in stats.figures.items() if math.isfinite(value)]
    if stats.load.get("load_line"):
        parts.append(str(stats.load["load_line"]))
    return " | ".join(parts)


def _time_left_column() -> Any:
    """The time left (:attr:`TrainStats.left_s`: this session's learning pace so far), blank
    while the replay fills: the filling pace says nothing about the learning pace (estimates
    jumped from 4 h to 109 h when learning began), and rich's own estimate over its last 30 s
    jumped between 0:50 and 2:17 within minutes while the run had an hour left."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class TimeLeftColumn(ProgressColumn):
        def __init__(self) -> None:
            super().__init__()

        def render(self, task: Any) -> Text:
            left = task.fields.get("left_s", math.nan)
            if task.fields.get("filling") or not math.isfinite(left):
                return Text("-:--:--", style="progress.remaining")
            minutes, seconds = divmod(int(left), 60)
            hours, minutes = divmod(minutes, 60)
            return Text(f"{hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")

    return TimeLeftColumn()


class ConsoleProgress:
    """A rich progress bar on a terminal; a log line every few seconds elsewhere (journald, CI).

    The step count and time left come first and the bar is short, so an 80-column terminal keeps
    them; the summary after them is cut with an ellipsis, never wrapped.
    """

    def __init__(
        self, total: int, start: int, stream: TextIO | None = None, quiet: bool = False
    ) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self._progress = None
        self._task = None
        self._reset_speed = False
        if not quiet and self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn
            from rich.table import Column

            self._progress = Progress(
                TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
                _time_left_column(),
                BarColumn(bar_width=16),
                TextColumn(
                    "{task.description}",
                    table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
                ),
                console=Console(file=self.stream),
                transient=False,
                expand=True,
            )
            self._task = self._progress.add_task(
                "starting", total=total, completed=start, filling=True, left_s=math.nan
            )
            self._progress.start()

    def update(self, stats: TrainStats) -> None:
        if self._progress is not None and self._task is not None:
            if not stats.filling and self._reset_speed:
                # Learning has begun: forget the filling pace so the estimate starts afresh.
                self._progress.reset(self._task, completed=stats.step, start=True)
                self._reset_speed = False
            elif stats.filling:
                self._reset_speed = True
            self._progress.update(
                self._task,
                completed=stats.step,
                description=progress_fields(stats),
                filling=stats.filling,
                left_s=stats.left_s,
            )

    def log_line(self, stats: TrainStats) -> None:
        """Called at each metrics row: without a bar, the same summary goes to the log."""
        if self._progress is None and not self.quiet:
            log.info(
                "step %s/%s | %s",
                f"{stats.step:,}",
                f"{stats.total_steps:,}",
                progress_fields(stats),
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
