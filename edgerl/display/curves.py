"""The curves of a run, read from its CSV files in one pass and kept to a bounded number of points.

``edgerl plot`` reads ``episodes.csv`` (one return per episode; else ``metrics.csv``'s
``return_mean``), ``eval.csv`` (the mean return of each evaluation), ``metrics.csv`` (steps/s) and
``load.csv`` (load). A run of months writes hundreds of MB of rows: each curve keeps fewer than
twice :data:`MAX_POINTS` points, each the mean of ``stride`` consecutive rows (the stride doubles
when the curve outgrows that), so time is one pass over the files and memory stays flat. What the
summary line needs (the episode count, the best return, the mean of the last 100) is counted
over every row.

A resumed run keeps appending to the same files and ``wall_s`` counts training time across its
sessions. Lines that cannot be read are skipped (and named once in the log, see
:mod:`edgerl.files.csvread`), and where a session resumed from a checkpoint older than the newest
rows,
its rows replace the ones they overlap.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from edgerl.errors import RunDirError
from edgerl.files.csvread import CsvReader
from edgerl.words import fmt_bytes

log = logging.getLogger(__name__)

MAX_POINTS = 2000  # per curve: more than a PNG's width in pixels or a terminal's in columns
BATCH = 8192  # rows buffered before they are turned into points
WINDOW = 100  # episodes in the moving mean, as metrics.csv's return_mean
# No step, time, return or rate of a run comes near this: a larger number is damage, and one
# of 1e308 would overflow the means and make the axes' ranges infinite.
PLOTTABLE = 1e15


def plottable(x: float) -> bool:
    """Whether ``x`` can be a point of a curve: a number of magnitude below PLOTTABLE."""
    return -PLOTTABLE < x < PLOTTABLE


class Series:
    """One curve: x by steps and by wall time (seconds), and y, in fewer than ``2 * limit``
    points, each the mean of ``stride`` rows. With ``smooth``, :attr:`smooth` holds the moving
    mean of the last :data:`WINDOW` rows at each point.

    Rows are added one by one (a cheap append) and turned into points in batches with numpy;
    :attr:`count`, :attr:`best`, :meth:`mean` and :attr:`recent` (the last :data:`WINDOW` rows)
    are over every row added.
    """

    def __init__(self, limit: int = MAX_POINTS, smooth: bool = False) -> None:
        self.limit = limit
        self.steps: list[float] = []
        self.wall_s: list[float] = []
        self.y: list[float] = []
        self.smooth: list[float] | None = [] if smooth else None
        self.stride = 1
        self._flush_at = BATCH  # buffered rows that make a batch: BATCH, or a stride if longer
        self._n: list[int] = []  # rows in each point
        self._top: list[float] = []  # the largest y of each point
        self._last: list[float] = []  # the step of each point's last row
        self._rows = 0  # rows in points
        self._bs: list[float] = []  # rows not in a point yet: step, wall, y
        self._bw: list[float] = []
        self._by: list[float] = []
        self._tail: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # rows before _bs

    def add(self, step: float, wall: float, y: float) -> None:
        self._bs.append(step)
        self._bw.append(wall)
        self._by.append(y)
        if len(self._by) >= self._flush_at:
            self._flush()

    def _flush(self, final: bool = False) -> None:
        """Turn the buffered rows into points: whole strides, and with ``final`` the rest."""
        stride = self.stride
        groups = len(self._by) // stride
        take = len(self._by) if final else groups * stride
        if take == 0:
            return
        s, w, y = (np.asarray(b[:take], dtype=np.float64) for b in (self._bs, self._bw, self._by))
        moving = self._moving_mean(y) if self.smooth is not None else None
        whole = groups * stride
        for lo, hi, size in ((0, whole, stride), (whole, take, take - whole)):
            if hi <= lo:
                continue
            shape = ((hi - lo) // size, size)
            self.steps += s[lo:hi].reshape(shape).mean(axis=1).tolist()
            self.wall_s += w[lo:hi].reshape(shape).mean(axis=1).tolist()
            self.y += y[lo:hi].reshape(shape).mean(axis=1).tolist()
            self._top += y[lo:hi].reshape(shape).max(axis=1).tolist()
            self._last += s[lo:hi].reshape(shape)[:, -1].tolist()
            self._n += [size] * shape[0]
            if moving is not None and self.smooth is not None:
                self.smooth += moving[lo:hi].reshape(shape).mean(axis=1).tolist()
        self._rows += take
        self._tail.extend(zip(s[-WINDOW:].tolist(), y[-WINDOW:].tolist(), strict=True))
        del self._bs[:take], self._bw[:take], self._by[:take]
        while len(self.y) >= 2 * self.limit:
            self._halve()

    def _moving_mean(self, y: np.ndarray) -> np.ndarray:
        """The mean of each row's y and up to WINDOW - 1 rows before it."""
        before = np.asarray([t[1] for t in self._tail], dtype=np.float64)
        values = np.concatenate([before, y])
        sums = np.concatenate([[0.0], np.cumsum(values)])
        end = np.arange(len(before), len(values)) + 1
        start = np.maximum(end - WINDOW, 0)
        return (sums[end] - sums[start]) / (end - start)

    def _halve(self) -> None:
        """Merge neighbouring points in pairs (weighted by their rows; an odd last point stays
        as it is); the stride doubles."""
        pairs = len(self._n) // 2 * 2
        n = np.asarray(self._n[:pairs], dtype=np.float64).reshape(-1, 2)
        weights = n / n.sum(axis=1, keepdims=True)

        def merge(values: list[float], how: str = "mean") -> list[float]:
            both = np.asarray(values[:pairs], dtype=np.float64).reshape(-1, 2)
            merged = {"mean": (both * weights).sum(axis=1), "max": both.max(axis=1)}.get(
                how, both[:, 1]
            )
            return merged.tolist() + values[pairs:]

        self.steps, self.wall_s, self.y = merge(self.steps), merge(self.wall_s), merge(self.y)
        if self.smooth is not None:
            self.smooth = merge(self.smooth)
        self._top, self._last = merge(self._top, "max"), merge(self._last, "last")
        self._n = n.sum(axis=1).astype(int).tolist() + self._n[pairs:]
        self.stride *= 2
        self._flush_at = max(BATCH, self.stride)

    def rewind(self, step: float) -> None:
        """Forget the rows after ``step`` (a session resumed from an older checkpoint); a point
        that holds rows from both sides goes whole."""
        while self._bs and self._bs[-1] > step:
            self._bs.pop(), self._bw.pop(), self._by.pop()
        if self._bs:
            return  # every earlier row has a smaller step
        lists = [self.steps, self.wall_s, self.y, self._n, self._top, self._last]
        if self.smooth is not None:
            lists.append(self.smooth)
        while self._last and self._last[-1] > step:
            self._rows -= self._n[-1]
            for values in lists:
                values.pop()
        while self._tail and self._tail[-1][0] > step:
            self._tail.pop()

    def finish(self) -> Series:
        """Turn the rows still buffered into points; returns the series."""
        self._flush(final=True)
        return self

    @property
    def count(self) -> int:
        """Rows in the curve."""
        return self._rows + len(self._by)

    @property
    def best(self) -> float:
        """The largest y of every row (-inf without rows)."""
        return max(max(self._top, default=-math.inf), max(self._by, default=-math.inf))

    def mean(self) -> float:
        """The mean y of every row (nan without rows)."""
        total = sum(y * k for y, k in zip(self.y, self._n, strict=True)) + sum(self._by)
        return total / self.count if self.count else math.nan

    @property
    def recent(self) -> list[tuple[float, float]]:
        """(step, y) of the last :data:`WINDOW` rows."""
        return [*self._tail, *zip(self._bs, self._by, strict=True)][-WINDOW:]

    def recent_mean(self) -> float:
        """The mean y of the last :data:`WINDOW` rows (nan without rows)."""
        recent = self.recent
        return sum(y for _, y in recent) / len(recent) if recent else math.nan

    def x(self, by: str) -> list[float]:
        return self.steps if by == "steps" else self.wall_s


class Sink(Protocol):
    """Where :func:`read_curves` puts one column's rows: a :class:`Series`, or more than one."""

    def add(self, step: float, wall: float, y: float) -> None: ...

    def rewind(self, step: float) -> None: ...


@dataclass
class RunCurves:
    """What a run's files say, ready to draw."""

    name: str
    returns: Series
    returns_per_episode: bool  # from episodes.csv (else metrics.csv's mean of the last 100)
    sps: Series
    cpu: Series  # mean over the cores, percent
    gpu: Series  # percent
    evals: Series = field(default_factory=Series)  # eval.csv's mean return per evaluation
    # A genetic algorithm's elite score (metrics.csv's elite_score: the mean of its episodes)
    elite: Series = field(default_factory=Series)
    damage: list[str] = field(default_factory=list)  # "metrics.csv has 2 damaged lines ..."


def read_curves(
    path: Path,
    curves: dict[str, Sink],
    wall: Callable[[float], float] | None = None,
    damage: list[str] | None = None,
    max_bytes: int | None = None,
) -> int:
    """Add the rows of the CSV file at ``path`` to ``curves`` (column name -> series); returns
    the rows read. A row's x is its ``step`` and its ``wall_s`` (or ``wall(step)`` for files
    without one, such as load.csv: a file with neither has no rows); cells that are empty or no
    finite number are left out. ``max_bytes``: of a larger file, only the rows of its last
    ``max_bytes`` (said in ``damage``), so one huge file cannot hold up a reader serving others.

    A missing file has no rows; damage is skipped and logged once (and named in ``damage``, as
    ``"metrics.csv has ..."``, when given). Raises RunDirError when the file cannot be read.
    """
    reader = CsvReader(path)
    rows, last = 0, -math.inf
    wall_of = wall if wall is not None else _no_wall
    try:
        columns: list[tuple[int, Sink]] | None = None
        size = path.stat().st_size if max_bytes is not None else 0
        cut = max_bytes is not None and size > max_bytes
        if cut and damage is not None:
            damage.append(
                f"{path.name} is {fmt_bytes(size)}: its last {fmt_bytes(max_bytes or 0)} shown"
            )
        for cells in reader.tail(max_bytes or 0) if cut else reader.rows():
            if columns is None:
                header = reader.header or []
                if "step" not in header:
                    break
                if "wall_s" not in header and wall is None:
                    break  # no x on a time axis: a damaged header, or no file of ours
                i_step = header.index("step")
                i_wall = header.index("wall_s") if "wall_s" in header else None
                columns = [(header.index(k), s) for k, s in curves.items() if k in header]
            try:
                step = float(cells[i_step])
                w = float(cells[i_wall]) if i_wall is not None else wall_of(step)
            except ValueError:
                continue
            if not (plottable(step) and (plottable(w) or i_wall is None)):
                continue
            if step < last:
                for series in curves.values():
                    series.rewind(step)
            last = step
            rows += 1
            for i, series in columns:
                try:
                    y = float(cells[i])
                except ValueError:
                    continue  # empty: not known at this row
                if plottable(y):
                    series.add(step, w, y)
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise RunDirError(f"cannot read {path}: {e.strerror or e}") from None
    if (found := reader.damage()) is not None:
        log.warning("%s has %s: skipped", path, found)
        if damage is not None:
            damage.append(f"{path.name} has {found}: skipped")
    return rows


def _no_wall(step: float) -> float:
    return math.nan


def wall_at(clock: Series) -> Callable[[float], float]:
    """Wall time at a step, interpolated from ``clock`` (metrics.csv's wall_s by step): load.csv
    keeps dates, not training time."""
    steps, walls = clock.steps, clock.y
    if not steps:
        return lambda step: math.nan

    def at(step: float) -> float:
        i = bisect.bisect_left(steps, step)
        lo, hi = max(i - 1, 0), min(i, len(steps) - 1)
        if steps[hi] <= steps[lo]:
            return walls[hi] if step >= steps[hi] else walls[lo]
        share = min(max((step - steps[lo]) / (steps[hi] - steps[lo]), 0.0), 1.0)
        return walls[lo] + (walls[hi] - walls[lo]) * share

    return at


RUN_FILES = ("config.toml", "metrics.csv", "episodes.csv")  # a run writes them as it starts


def load_run(run_dir: Path, max_bytes: int | None = None) -> RunCurves:
    """The curves of the run in ``run_dir`` (of each file larger than ``max_bytes``, its end);
    raises RunDirError when it is not a run directory, a file cannot be read, or it has no row
    yet."""
    if not run_dir.is_dir() or not any((run_dir / f).exists() for f in RUN_FILES):
        raise RunDirError(
            f"{run_dir} is not a run directory (no config.toml, metrics.csv or episodes.csv in "
            "it); give one with --run-dir"
        )
    mean_returns, sps, clock, elite = Series(), Series(), Series(), Series()
    damage: list[str] = []
    metric_rows = read_curves(
        run_dir / "metrics.csv",
        {"return_mean": mean_returns, "sps": sps, "wall_s": clock, "elite_score": elite},
        damage=damage,
        max_bytes=max_bytes,
    )
    returns = Series(smooth=True)
    episodes = run_dir / "episodes.csv"
    per_episode = read_curves(episodes, {"return": returns}, damage=damage, max_bytes=max_bytes) > 0
    if not per_episode:
        returns = mean_returns
    if not returns.count and not metric_rows:
        raise RunDirError(
            f"{run_dir} has no finished episode and no metrics row yet: plot it once it has "
            "trained a little"
        )
    cpu, gpu, evals = Series(), Series(), Series()
    load = {"cpu_mean": cpu, "gr3d": gpu}
    read_curves(run_dir / "load.csv", load, wall_at(clock.finish()), damage, max_bytes)
    read_curves(run_dir / "eval.csv", {"return_mean": evals}, damage=damage, max_bytes=max_bytes)
    return RunCurves(
        name=run_dir.name,
        returns=returns.finish(),
        returns_per_episode=per_episode,
        sps=sps.finish(),
        cpu=cpu.finish(),
        gpu=gpu.finish(),
        evals=evals.finish(),
        elite=elite.finish(),
        damage=damage,
    )
