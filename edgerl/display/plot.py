"""Learning curves of runs drawn: training and evaluation return, steps/s and CPU/GPU load against
steps or wall time, as a PNG (matplotlib, the ``plot`` extra) or as text for a terminal (nothing
more needed). What is drawn comes from :mod:`edgerl.display.curves`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
from pathlib import Path
from typing import Any

from edgerl.display.curves import WINDOW, RunCurves, Series
from edgerl.errors import MissingDependencyError, OutputError
from edgerl.files.atomic import claim_temp, temp_path
from edgerl.words import plural

MARKS = "*o+x#@%&"  # one per run in the text rendering
EVAL_MARKS = "EFGHJKLM"  # its evaluations
ELITE_MARKS = "^vab<>cd"  # a genetic algorithm's elite scores
SUFFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def tick(value: float, span: float) -> str:
    """An axis label as a person reads it: ``60k``, ``1.25M``, ``500``, ``35.2``, never ``6e+04``
    or ``0.002267``. Digits below a hundredth of ``span`` (the axis length) are rounded away."""
    if not math.isfinite(value):
        return str(value)
    step = 10.0 ** math.floor(math.log10(span / 100)) if span > 0 else 1.0
    value = round(value / step) * step
    for scale, suffix in SUFFIXES:
        if abs(value) >= scale:
            digits = min(2, max(0, -math.floor(math.log10(step / scale))))
            return _trim(f"{value / scale:.{digits}f}") + suffix
    return _trim(f"{value:.{max(0, -math.floor(math.log10(step)))}f}")


def _trim(text: str) -> str:
    """``60.0`` -> ``60``, ``-0`` -> ``0``."""
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


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


def pyplot(purpose: str, instead: str = "") -> Any:
    """matplotlib's pyplot, drawing off screen; raises MissingDependencyError without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("matplotlib", "plot", purpose, instead) from None
    return plt


def save_png(runs: list[RunCurves], out: Path, by: str = "steps") -> None:
    """Draw the runs' curves into a PNG at ``out``; raises MissingDependencyError without
    matplotlib."""
    plt = pyplot("edgerl plot's PNG (--terminal draws text without it)")
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
            smooth = run.returns.smooth or []
            ret_ax.plot(xs, smooth, color=color, label=run.name)
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
        if run.elite.y:
            ret_ax.plot(
                [x / scale for x in run.elite.x(by)],
                run.elite.y,
                color=color,
                linestyle="--",
                drawstyle="steps-post",
                label=f"{run.name}: elite (genetic algorithm)",
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
    from matplotlib.ticker import FuncFormatter

    for ax in axes:  # 60k, not 6 with "1e4" in a corner
        low, high = ax.get_xlim()
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _, span=high - low: tick(v, span)))
        low, high = ax.get_ylim()
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _, span=high - low: tick(v, span)))
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        save_figure(fig, out)
    finally:
        plt.close(fig)


def save_figure(fig: Any, out: Path) -> None:
    """Write the figure under a temporary name and rename it: never half a file under ``out``.
    Raises OutputError with the reason."""
    fmt = out.suffix.lower().lstrip(".") or "png"
    tmp = temp_path(out)
    try:
        claim_temp(out)
        fig.savefig(tmp, format=fmt)
        os.replace(tmp, out)
    except ValueError as e:  # matplotlib: an unknown format
        raise OutputError(f"cannot write {out}: {e}; use .png, .svg or .pdf") from None
    except OSError as e:
        full = " (the disk is full)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise OutputError(
            f"cannot write {out}: {e.strerror or e}{full}; give another file with -o"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def text_chart(runs: list[RunCurves], by: str = "steps", width: int = 80, height: int = 24) -> str:
    """A character chart of training return (and evaluation return, where a run has eval.csv)
    against ``by`` that fits ``width`` x ``height`` characters: each column shows the mean
    return of the points that fall in it."""
    scale, x_label = _x_label(runs, by)
    points = []  # (xs, ys, mark), evaluations last: they are drawn over training returns
    for curve in ("returns", "elite", "evals"):
        marks = {"returns": MARKS, "elite": ELITE_MARKS, "evals": EVAL_MARKS}[curve]
        for i, run in enumerate(runs):
            series: Series = getattr(run, curve)
            if series.y:
                xs = [x / scale for x in series.x(by)]
                points.append((xs, series.y, marks[i % len(marks)]))
    legend = "  ".join(
        f"{MARKS[i % len(MARKS)]} {run.name}"
        + (f" ({EVAL_MARKS[i % len(EVAL_MARKS)]}: evaluation)" if run.evals.y else "")
        + (f" ({ELITE_MARKS[i % len(ELITE_MARKS)]}: elite)" if run.elite.y else "")
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
    top, bottom = tick(y1, y1 - y0), tick(y0, y1 - y0)
    label_w = max(len(top), len(bottom)) + 1
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
        label = top if r == 0 else bottom if r == rows - 1 else ""
        lines.append(f"{label:>{label_w}}|" + "".join(cells).rstrip())
    lines.append(" " * label_w + "+" + "-" * cols)
    left, right = tick(x0, x1 - x0), tick(x1, x1 - x0)
    lines.append(" " * (label_w + 1) + left + right.rjust(cols - len(left)))
    lines.append(legend)
    return "\n".join(lines) + "\n"


def summary(run: RunCurves) -> str:
    """One line per run: how far it got, its returns, its pace and load."""
    parts = [run.name]
    returns = run.returns
    # how far the run got: its newest row of any file (an evaluation or metrics row is often
    # newer than the last finished episode)
    newest = [s.recent[-1][0] for s in (returns, run.sps, run.evals) if s.recent]
    if newest:
        parts.append(f"step {max(newest):,.0f}")
    if run.returns_per_episode and returns.recent:
        parts.append(plural(returns.count, "episode"))
        parts.append(f"return {returns.recent_mean():.1f} (last {len(returns.recent)})")
        parts.append(f"best {returns.best:.1f}")
    elif returns.recent:
        parts.append(f"return {returns.recent[-1][1]:.1f} (last {WINDOW})")
    if run.evals.recent:
        step, ret = run.evals.recent[-1]
        parts.append(f"eval {ret:.1f} at step {step:,.0f}")
    if run.sps.recent:
        parts.append(f"{run.sps.recent[-1][1]:,.0f} steps/s")
    for series, what in ((run.cpu, "CPU"), (run.gpu, "GPU")):
        if series.count:
            parts.append(f"{what} {series.mean():.0f}%")
    return " | ".join(parts)
