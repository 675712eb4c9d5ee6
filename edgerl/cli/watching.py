"""Commands that watch a run: ``view``, ``plot``, ``serve``."""

from __future__ import annotations

import grp
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgerl.cli.app import cli
from edgerl.cli.options import default_status_dir, seeds_run

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def picture_options(output_help: str, x_help: str) -> Callable[[F], F]:
    """``-o/--output IMAGE`` and ``--x steps|time``, as ``plot`` and ``results`` take them."""

    def decorate(func: F) -> F:
        func = click.option(
            "--x",
            "by",
            type=click.Choice(["steps", "time"]),
            default="steps",
            show_default=True,
            help=x_help,
        )(func)
        return click.option(
            "-o",
            "--output",
            type=click.Path(path_type=Path),
            default=None,
            callback=_picture_path,
            help=output_help,
        )(func)

    return decorate


PICTURE_SUFFIXES = (".png", ".svg", ".pdf")


def _picture_path(_ctx: click.Context, _param: click.Parameter, path: Path | None) -> Path | None:
    """``-o`` checked before any work: a format matplotlib writes, a folder that exists."""
    if path is None:
        return None
    if path.suffix.lower() not in PICTURE_SUFFIXES:
        raise click.BadParameter(f"{path} is not a picture file name: use .png, .svg or .pdf")
    if not path.parent.is_dir():
        raise click.BadParameter(f"{path.parent} is not a directory to write {path.name} into")
    return path


def duration_option(text: str) -> float:
    """A duration given on the command line, in seconds; click's error for a bad one."""
    from edgerl.words import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def check_readable(run_dir: Path) -> None:
    """Refuse a run this user may not read, in one sentence that says how to get access
    (without it the viewer could only say that no frame came). Raises RunDirError."""
    from edgerl.errors import RunDirError
    from edgerl.report.status import STATUS_FILE

    for path in (run_dir, run_dir / STATUS_FILE):
        try:
            st = path.stat()
        except PermissionError:
            raise RunDirError(_refusal(_first_closed(path))) from None
        except OSError:
            return  # missing: the viewer says that nothing runs there
        want = os.R_OK | (os.X_OK if stat.S_ISDIR(st.st_mode) else 0)
        if not os.access(path, want):
            raise RunDirError(_refusal(path))


def _first_closed(path: Path) -> Path:
    """The outermost directory above ``path`` that this user may not enter."""
    for parent in reversed(path.parents):
        if not os.access(parent, os.X_OK):
            return parent
    return path


def _refusal(path: Path) -> str:
    try:
        group = grp.getgrgid(path.stat().st_gid).gr_name
    except (OSError, KeyError):
        group = "edgerl"
    return (
        f"permission denied reading {path}: runs of the service can be watched by the {group} "
        f"group only; add yourself with: sudo usermod -aG {group} $USER, then log in again"
    )


@cli.command()
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="Run directory (default: the service's, else the newest under ./runs).",
)
@click.option(
    "--scale",
    type=click.IntRange(1, 16),
    default=6,
    show_default=True,
    help="Pixels per frame pixel.",
)
@click.option("--fullscreen", is_flag=True, help="Fill the screen (kmsdrm on a bare console).")
@click.option(
    "--snapshot",
    type=click.Path(path_type=Path),
    help="Wait for one fresh frame, save the window as this PNG, exit.",
)
@click.option("--console", is_flag=True, help="Draw in the terminal (for ssh sessions).")
@click.option(
    "--fps",
    type=click.FloatRange(min=0.5),
    default=None,
    help="Most frames drawn per second (default: 30 window, 5 console).",
)
@click.option(
    "--frames",
    type=click.IntRange(min=0),
    default=0,
    help="Stop after drawing this many frames (0: until q).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds to wait for frames: --snapshot and --frames give up then; the window and "
    "--console give up when no trainer runs there or its stream is damaged.",
)
@click.pass_context
def view(
    ctx: click.Context,
    run_dir: Path | None,
    scale: int,
    fullscreen: bool,
    snapshot: Path | None,
    console: bool,
    fps: float | None,
    frames: int,
    timeout: float,
) -> None:
    """Watch a running trainer: keys q quit, f fullscreen, +/- scale, o overlay, s screenshot."""
    from edgerl.display.viewer import ViewOptions, run

    if snapshot is not None and console:
        raise click.UsageError("give either --snapshot or --console, not both")
    run_dir = seeds_run(run_dir) if run_dir is not None else default_status_dir()
    check_readable(run_dir)
    opts = ViewOptions(
        run_dir=run_dir,
        scale=scale,
        fullscreen=fullscreen,
        snapshot=snapshot,
        console=console,
        fps=fps if fps is not None else (5.0 if console else 30.0),
        frames=frames,
        timeout_s=timeout,
    )
    ctx.exit(run(opts))


@cli.command()
@click.option(
    "--run-dir",
    "run_dirs",
    type=click.Path(path_type=Path),
    multiple=True,
    help="Run directory; repeat to compare runs (default: the service's, else the newest run).",
)
@picture_options(
    "Image to write (.png, .svg or .pdf; needs the plot extra) [default: curve.png in the run "
    "directory].",
    "Against env steps or training time.",
)
@click.option("--terminal", is_flag=True, help="Draw the return curve as text, here, instead.")
def plot(run_dirs: tuple[Path, ...], output: Path | None, by: str, terminal: bool) -> None:
    """Learning curves: training return, steps/s and CPU/GPU load of one run or several."""
    import shutil

    from edgerl.display.curves import load_run
    from edgerl.display.plot import save_png, summary, text_chart
    from edgerl.report.rundir import seed_runs_in

    given = list(run_dirs) or [default_status_dir()]
    # a folder of seeds' runs (train --seeds) stands for them: their curves side by side
    dirs = [run for d in given for run in ([d / n for n in seed_runs_in(d)] or [d])]
    for run_dir in dirs:
        check_readable(run_dir)
    runs = [load_run(run_dir) for run_dir in dirs]
    if terminal:
        size = shutil.get_terminal_size()
        click.echo(text_chart(runs, by, size.columns, size.lines - len(runs)), nl=False)
    else:
        # Beside the run's files, not wherever the command happened to be typed, and as
        # private as they are whatever the umask.
        from edgerl.files.private import run_umask

        if output is None:
            output = dirs[0] / "curve.png"
            with run_umask():
                save_png(runs, output, by)
        else:
            save_png(runs, output, by)
    for run in runs:
        click.echo(summary(run))
    if output is not None and not terminal:
        click.echo(f"wrote {output.resolve()}")


@cli.command()
@click.option(
    "--run-dir",
    "run_dirs",
    type=click.Path(path_type=Path),
    multiple=True,
    help="A run directory, or a directory of runs; repeat for more (default: the service's "
    "runs and ./runs).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every network of this machine, which needs a token).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="Port to listen on (0: any free one).",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path),
    help="File whose first line is the token every client must send (else $EDGERL_SERVE_TOKEN; "
    "else, on 127.0.0.1, a token made for this start and printed in the address).",
)
@click.option(
    "--trusted-network",
    is_flag=True,
    help="No token: whoever reaches the port can watch (on 127.0.0.1, every account of this "
    "machine).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="With --trusted-network: a Host name the page may be opened by besides this machine's "
    "own names and addresses (repeat for several); any other is refused (DNS rebinding).",
)
@click.option(
    "--fps",
    type=click.FloatRange(0.5, 60),
    default=15.0,
    show_default=True,
    help="Most game frames sent per second to each viewer.",
)
def serve(
    run_dirs: tuple[Path, ...],
    host: str,
    port: int,
    token_file: Path | None,
    trusted_network: bool,
    allowed_hosts: tuple[str, ...],
    fps: float,
) -> None:
    """A web page of the runs (the game, curves, load, status) and Prometheus /metrics."""
    from edgerl.serve import ServeOptions, access_token, read_token, require_web

    require_web()
    given = read_token(token_file)
    token = access_token(host, given, trusted_network)
    roots = list(run_dirs) or serve_roots()
    if not any(root.is_dir() for root in roots):
        log.warning(
            "none of %s exists yet: the page lists runs as they appear",
            ", ".join(str(r) for r in roots),
        )
    if allowed_hosts and not trusted_network:
        raise click.UsageError("--allowed-host goes with --trusted-network (a token allows any)")
    opts = ServeOptions(
        roots=roots,
        host=host,
        port=port,
        token=token,
        trusted_network=trusted_network,
        fps=fps,
        allowed_hosts=allowed_hosts,
    )
    from edgerl.serve.server import serve as run_server

    def ready(url: str) -> None:
        there = [r for r in roots if r.is_dir()]  # the others are watched for, not listed
        where = f"runs in {', '.join(str(r) for r in there)}" if there else "no runs yet"
        click.echo(f"edgerl serve: {url} ({where}; Prometheus: {url}metrics)")
        if given is None and token is not None:
            click.echo(
                f"open {url}?token={token} (a token made for this start: no other account on "
                "this machine can watch without it; --token-file FILE keeps one across starts, "
                "and Prometheus sends it as Authorization: Bearer)"
            )
        elif token is not None:
            click.echo("open the page as that address with ?token=TOKEN (the given one) after /")

    run_server(opts, ready)


def serve_roots() -> list[Path]:
    """Where ``edgerl serve`` looks for runs without --run-dir: ``train.run_dir`` if the config
    sets it, the service's runs and ./runs."""
    from edgerl.config import build_layers, resolve
    from edgerl.report.rundir import service_state_dir

    cfg = resolve(build_layers())
    roots = [Path(cfg.train.run_dir)] if "train.run_dir" in cfg.explicit else []
    return [*roots, service_state_dir() / "runs", Path("runs")]


@cli.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--target",
    type=float,
    default=None,
    help="The score a run must reach [default: the human reference of an Atari game, "
    "gymnasium's reward threshold of another].",
)
@click.option(
    "--within",
    "within_s",
    default=None,
    callback=lambda _ctx, _param, v: None if v is None else duration_option(v),
    help="Count only the evaluations that ended within this training time (90s, 40m, 1h): "
    "for reaching the target, the final and best scores.",
)
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Evaluations in a run's final score (the mean of its last ones).",
)
@click.option(
    "--reps",
    type=click.IntRange(min=100),
    default=50_000,
    show_default=True,
    help="Bootstrap resamples of the 95% intervals (rliable's default); from fewer than 5 "
    "runs no interval is given, the range instead.",
)
@picture_options(
    "Also draw the sample-efficiency curves (IQM over the seeds with its 95% band) into this "
    "image (.png, .svg or .pdf).",
    "The picture against env steps or training time.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def results(
    run_dirs: tuple[Path, ...],
    target: float | None,
    within_s: float | None,
    last: int,
    reps: int,
    output: Path | None,
    by: str,
    as_json: bool,
) -> None:
    """Several runs of a recipe (seeds) as the field sums them up: k of n that reached the
    target and k of n that held it (final score), the median time to it, final and best
    scores, the IQM with its 95% stratified-bootstrap interval (rliable) from 5 runs up, the
    range from fewer. RUN_DIRS: run directories, or folders of them (train --seeds)."""
    from edgerl.display.across_games import across_games
    from edgerl.display.seeds import (
        describe,
        figures,
        find_runs,
        grouped,
        save_picture,
    )

    groups = grouped(find_runs(run_dirs))
    found = [figures(runs, target, within_s, last, reps) for runs in groups.values()]
    if as_json:
        click.echo(json.dumps([f.to_dict() for f in found], indent=1))
    else:
        click.echo("\n".join(describe(f, last) for f in found))
        for line in across_games(groups, last, reps, within_s):
            click.echo(line)
    if output is not None:  # the curves of the runs the figures counted
        save_picture({k: f.runs for k, f in zip(groups, found, strict=True)}, output, by, reps)
        click.echo(f"wrote {output.resolve()}", err=as_json)
