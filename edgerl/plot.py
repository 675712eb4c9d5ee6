"""Learning curves of runs: training and evaluation return, steps/s and CPU/GPU load against steps
or wall time.

The figures come from a run directory's CSV files: ``episodes.csv`` (one return per episode; else
``metrics.csv``'s ``return_mean``), ``eval.csv`` (the mean return of each evaluation, when the run
has one), ``metrics.csv`` (steps/s) and ``load.csv`` (load). A PNG needs matplotlib (the ``plot``
extra); the text rendering for a terminal needs nothing more.

A resumed run keeps appending to the same files and ``wall_s`` counts training time across its
sessions. Rows cut short by a kill and a header written again are skipped, and where a session
resumed from a checkpoint older than the newest rows, its rows replace the ones they overlap.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from edgerl.errors import MissingDependencyError, RunDirError

MARKS = "*o+x#@%&"  # one per run in the text rendering
EVAL_MARKS = "EFGHJKLM"  # its evaluations
WINDOW = 100  # episodes in the PNG's moving mean, as metrics.csv's return_mean


def read_rows(path: Path) -> list[dict[str, float]]:
    """The numeric cells of the rows of a CSV file written by a run, in step order of the
    newest session.

    Empty and non-numeric cells are left out of a row; a missing file gives no rows. Raises
    nothing for rows it cannot read: they are skipped.
    """
    rows: list[dict[str, float]] = []
    try:
        with path.open(newline="", encoding="utf-8") as f:
            for raw in csv.DictReader(f):
                if raw.get("step") == "step":  # the header again
                    continue
                if None in raw.values():
                    continue  # a row cut short by a kill
                row = _numbers(raw)
                if "step" not in row:
                    continue
                while rows and rows[-1]["step"] > row["step"]:
                    rows.pop()  # a session that resumed from an older checkpoint
                rows.append(row)
    except FileNotFoundError:
        return []
    return rows


def _numbers(raw: dict[str | None, str | list[str] | None]) -> dict[str, float]:
    """The cells of a CSV row that are numbers (load.csv's dates are not)."""
    row = {}
    for key, value in raw.items():
        if key and isinstance(value, str) and value:
            try:
                row[key] = float(value)
            except ValueError:
                continue
    return row


@dataclass
class Series:
    """One curve: x by steps and by wall time (seconds), and y."""

    steps: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)

    def x(self, by: str) -> list[float]:
        return self.steps if by == "steps" else self.wall_s


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


def _series(rows: list[dict[str, float]], key: str) -> Series:
    s = Series()
    for row in rows:
        value = row.get(key, math.nan)
        if not math.isnan(value) and "wall_s" in row:
            s.steps.append(row["step"])
            s.wall_s.append(row["wall_s"])
            s.y.append(value)
    return s


def _wall_at(steps: list[float], metrics: list[dict[str, float]]) -> list[float]:
    """Wall times for ``steps``, interpolated from metrics.csv (load.csv keeps dates, not
    training time)."""
    known = [(r["step"], r["wall_s"]) for r in metrics if "wall_s" in r]
    if not known:
        return [math.nan] * len(steps)
    known_steps = [k[0] for k in known]
    out = []
    for step in steps:
        i = bisect.bisect_left(known_steps, step)
        lo, hi = known[max(i - 1, 0)], known[min(i, len(known) - 1)]
        if hi[0] <= lo[0]:
            out.append(hi[1] if step >= hi[0] else lo[1])
        else:
            share = min(max((step - lo[0]) / (hi[0] - lo[0]), 0.0), 1.0)
            out.append(lo[1] + (hi[1] - lo[1]) * share)
    return out


def load_run(run_dir: Path) -> RunCurves:
    """The curves of the run in ``run_dir``; raises RunDirError when it is not a run directory
    or has no row yet."""
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a run directory; give one with --run-dir")
    metrics = read_rows(run_dir / "metrics.csv")
    episodes = read_rows(run_dir / "episodes.csv")
    per_episode = bool(episodes)
    returns = _series(episodes, "return") if per_episode else _series(metrics, "return_mean")
    if not returns.y and not metrics:
        raise RunDirError(
            f"{run_dir} has no finished episode and no metrics row yet: plot it once it has "
            "trained a little"
        )
    load = read_rows(run_dir / "load.csv")
    load_steps = [r["step"] for r in load]
    load_walls = _wall_at(load_steps, metrics)
    cpu, gpu = Series(), Series()
    for row, wall in zip(load, load_walls, strict=True):
        for series, key in ((cpu, "cpu_mean"), (gpu, "gr3d")):
            if key in row:
                series.steps.append(row["step"])
                series.wall_s.append(wall)
                series.y.append(row[key])
    return RunCurves(
        name=run_dir.name,
        returns=returns,
        returns_per_episode=per_episode,
        sps=_series(metrics, "sps"),
        cpu=cpu,
        gpu=gpu,
        evals=_series(read_rows(run_dir / "eval.csv"), "return_mean"),
    )


def _time_unit(seconds: float) -> tuple[float, str]:
    if seconds >= 2 * 3600:
        return 3600.0, "hours"
    if seconds >= 2 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _x_label(runs: list[RunCurves], by: str) -> tuple[float, str]:
    """The x scale and its label."""
    if by == "steps":
        return 1.0, "env steps"
    longest = max(
        (max(r.returns.wall_s + r.sps.wall_s + r.evals.wall_s, default=0.0) for r in runs),
        default=0.0,
    )
    scale, unit = _time_unit(longest)
    return scale, f"training time ({unit})"


def moving_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and up to ``window - 1`` before it."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def save_png(runs: list[RunCurves], out: Path, by: str = "steps") -> None:
    """Draw the runs' curves into a PNG at ``out``; raises MissingDependencyError without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError(
            "matplotlib", "plot", "edgerl plot's PNG (--terminal draws text without it)"
        ) from None
    scale, x_label = _x_label(runs, by)
    has_load = any(r.cpu.y or r.gpu.y for r in runs)
    panels = 3 if has_load else 2
    fig, axes = plt.subplots(panels, 1, figsize=(9, 2.6 * panels + 0.6), sharex=True)
    ret_ax, sps_ax = axes[0], axes[1]
    for i, run in enumerate(runs):
        color = f"C{i}"
        xs = [x / scale for x in run.returns.x(by)]
        if run.returns_per_episode:
            ret_ax.plot(xs, run.returns.y, color=color, alpha=0.25, linewidth=0.7)
            ret_ax.plot(xs, moving_mean(run.returns.y, WINDOW), color=color, label=run.name)
        else:
            ret_ax.plot(xs, run.returns.y, color=color, label=run.name)
        if run.evals.y:
            ret_ax.plot(
                [x / scale for x in run.evals.x(by)],
                run.evals.y,
                color=color,
                marker="o",
                markersize=4,
                linestyle=":",
                label=f"{run.name}: evaluation",
            )
        sps_ax.plot([x / scale for x in run.sps.x(by)], run.sps.y, color=color, label=run.name)
        if has_load:
            load_ax = axes[2]
            load_ax.plot([x / scale for x in run.cpu.x(by)], run.cpu.y, color=color)
            load_ax.plot([x / scale for x in run.gpu.x(by)], run.gpu.y, color=color, ls="--")
    has_evals = any(r.evals.y for r in runs)
    ret_ax.set_ylabel("return" if has_evals else "training return")
    ret_ax.legend(loc="best", fontsize="small")
    sps_ax.set_ylabel("steps/s")
    if has_load:
        axes[2].set_ylabel("load % (CPU -, GPU --)")
        axes[2].set_ylim(0, 105)
    axes[-1].set_xlabel(x_label)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def text_chart(runs: list[RunCurves], by: str = "steps", width: int = 80, height: int = 24) -> str:
    """A character chart of training return (and evaluation return, where a run has eval.csv)
    against ``by`` that fits ``width`` x ``height`` characters: each column shows the mean
    return of the points that fall in it."""
    scale, x_label = _x_label(runs, by)
    points = []  # (xs, ys, mark), evaluations last: they are drawn over training returns
    for curve in ("returns", "evals"):
        marks = MARKS if curve == "returns" else EVAL_MARKS
        for i, run in enumerate(runs):
            series: Series = getattr(run, curve)
            if series.y:
                xs = [x / scale for x in series.x(by)]
                points.append((xs, series.y, marks[i % len(marks)]))
    legend = "  ".join(
        f"{MARKS[i % len(MARKS)]} {run.name}"
        + (f" ({EVAL_MARKS[i % len(EVAL_MARKS)]}: evaluation)" if run.evals.y else "")
        for i, run in enumerate(runs)
    )
    has_evals = any(run.evals.y for run in runs)
    what = "training and evaluation return" if has_evals else "training return"
    title = f"{what} against {x_label}"
    if not points:
        return f"{title}\n(no return yet)\n{legend}\n"
    all_x = [x for xs, _, _ in points for x in xs]
    all_y = [y for _, ys, _ in points for y in ys]
    x0, x1 = min(all_x), max(all_x)
    y0, y1 = min(all_y), max(all_y)
    if y1 == y0:
        y0, y1 = y0 - 1, y1 + 1
    if x1 == x0:
        x1 = x0 + 1
    label_w = max(len(f"{y0:.4g}"), len(f"{y1:.4g}")) + 1
    cols = max(width - label_w - 1, 10)
    rows = max(height - 5, 4)  # title, axis, x labels, legend
    grid = [[" "] * cols for _ in range(rows)]
    for xs, ys, mark in points:
        sums: dict[int, list[float]] = {}
        for x, y in zip(xs, ys, strict=True):
            c = min(int((x - x0) / (x1 - x0) * (cols - 1) + 0.5), cols - 1)
            sums.setdefault(c, []).append(y)
        for c, ys_in in sums.items():
            mean = sum(ys_in) / len(ys_in)
            r = min(int((y1 - mean) / (y1 - y0) * (rows - 1) + 0.5), rows - 1)
            grid[r][c] = mark
    lines = [title]
    for r, cells in enumerate(grid):
        label = f"{y1:.4g}" if r == 0 else f"{y0:.4g}" if r == rows - 1 else ""
        lines.append(f"{label:>{label_w}}|" + "".join(cells).rstrip())
    lines.append(" " * label_w + "+" + "-" * cols)
    left, right = f"{x0:,.4g}", f"{x1:,.4g}"
    lines.append(" " * (label_w + 1) + left + right.rjust(cols - len(left)))
    lines.append(legend)
    return "\n".join(lines) + "\n"


def summary(run: RunCurves) -> str:
    """One line per run: how far it got, its returns, its pace and load."""
    parts = [run.name]
    if run.returns.steps:
        parts.append(f"step {run.returns.steps[-1]:,.0f}")
    if run.returns_per_episode:
        recent = run.returns.y[-WINDOW:]
        parts.append(f"{len(run.returns.y):,} episodes")
        parts.append(f"return {sum(recent) / len(recent):.1f} (last {len(recent)})")
        parts.append(f"best {max(run.returns.y):.1f}")
    elif run.returns.y:
        parts.append(f"return {run.returns.y[-1]:.1f} (last 100)")
    if run.evals.y:
        parts.append(f"eval {run.evals.y[-1]:.1f} at step {run.evals.steps[-1]:,.0f}")
    if run.sps.y:
        parts.append(f"{run.sps.y[-1]:,.0f} steps/s")
    for series, what in ((run.cpu, "CPU"), (run.gpu, "GPU")):
        if series.y:
            parts.append(f"{what} {sum(series.y) / len(series.y):.0f}%")
    return " | ".join(parts)
