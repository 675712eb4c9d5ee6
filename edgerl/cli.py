"""The command line: ``edgerl train | play | config | ...``.

Exit codes: 0 done, 2 a user error (one sentence on stderr, no traceback; ``--debug`` shows it),
1 an internal error, 130/143 stopped by SIGINT/SIGTERM after writing a checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgerl import __version__
from edgerl.errors import EdgerlError

log = logging.getLogger("edgerl")
F = TypeVar("F", bound=Callable[..., Any])


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever sys.stderr is now, so rich's progress bar can redirect it."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(debug: bool, level: str = "info", timestamps: bool = True) -> None:
    handler = _StderrHandler()
    fmt = "%(asctime)s %(levelname)s %(message)s" if timestamps else "%(levelname)s %(message)s"
    handler.setFormatter(logging.Formatter(fmt, datefmt="%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else getattr(logging, level.upper()))
    for noisy in ("PIL", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def config_options(func: F) -> F:
    """The options every command that builds a config takes (layers 3-5 of config.py)."""
    options = [
        click.option(
            "--config",
            "config_file",
            type=click.Path(path_type=Path),
            help="TOML config file (over /etc/edgerl/edgerl.toml and the defaults).",
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="SECTION.KEY=VALUE",
            help="Override one config key; repeatable.",
        ),
        click.option("--env", "env_id", help="Shortcut for --set env.id=ID."),
        click.option("--steps", type=int, help="Shortcut for --set train.steps=N (a total)."),
        click.option(
            "--run-dir",
            type=click.Path(path_type=Path),
            help="Shortcut for --set train.run_dir=DIR.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_config(
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
) -> Any:
    from edgerl.config import build_layers, resolve

    shortcuts = {
        "env.id": env_id,
        "train.steps": steps,
        "train.run_dir": str(run_dir) if run_dir is not None else None,
    }
    return resolve(build_layers(config_file, overrides, shortcuts))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(__version__, prog_name="edgerl")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """edgerl: train DQN agents on Atari on the device, watch them, export them to TensorRT."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    setup_logging(debug)


@cli.command()
@config_options
@click.option(
    "--fresh",
    is_flag=True,
    help="Start over: move an existing run directory aside (never deleted).",
)
@click.option("--quiet", is_flag=True, help="No progress bar or progress log lines.")
@click.pass_context
def train(
    ctx: click.Context,
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
    fresh: bool,
    quiet: bool,
) -> None:
    """Train a DQN; resumes the run directory's newest valid checkpoint.

    Ctrl-C stops after the current step and writes a checkpoint; run the same command to resume.
    """
    from edgerl.session import training_session
    from edgerl.signals import StopRequest, stop_on_signals

    cfg = build_config(config_file, overrides, env_id, steps, run_dir)
    setup_logging(ctx.obj["debug"], cfg.log.level)
    stop = StopRequest()
    with (
        stop_on_signals(stop.set) as received,
        training_session(cfg, fresh=fresh, quiet=quiet) as trainer,
    ):
        stop.target = trainer.request_stop
        log.info(
            "training %s on %s: run directory %s",
            trainer.cfg.env.id,
            trainer.device,
            trainer.run_dir,
        )
        result = trainer.run()
        verdict = trainer.monitor.verdict().sentence() if trainer.monitor else None
    ret = "n/a" if math.isnan(result.return_mean) else f"{result.return_mean:.2f}"
    sps = result.session_steps / result.session_s if result.session_s > 0 else 0.0
    click.echo(
        f"step {result.step:,}/{result.total_steps:,}: {result.episodes:,} episodes, "
        f"mean return (last 100) {ret}, {sps:,.0f} steps/s this session; "
        f"checkpoint {result.checkpoint or 'unchanged'}",
        err=True,
    )
    if verdict:
        click.echo(f"what limited training: {verdict}", err=True)
    if result.stopped:
        sig = received.get("signal", "a stop request")
        click.echo(f"stopped by {sig}; run the same command to resume", err=True)
        ctx.exit(130 if sig == "SIGINT" else 143)


@cli.command()
@click.option(
    "--model",
    type=click.Path(path_type=Path),
    help="A policy file: checkpoint (.ckpt), ONNX (.onnx) or TensorRT engine (.engine).",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="A run directory: plays its newest valid checkpoint.",
)
@click.option("--checkpoint", type=click.Path(path_type=Path), help="A checkpoint file.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "trt", "onnx", "torch"]),
    default="auto",
    show_default=True,
    help="auto picks by the file.",
)
@click.option("--env", "env_id", help="Environment id (default: the one the policy learned).")
@click.option("--episodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--render", type=click.Choice(["none", "console", "screen"]), default="none", show_default=True
)
@click.option("--fullscreen", is_flag=True, help="With --render screen: fill the screen.")
@click.option(
    "--fps",
    type=click.FloatRange(min=0),
    default=0.0,
    help="Steps per second (0: as fast as possible).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--epsilon",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Chance of a random action.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda", "auto"]),
    default="cpu",
    show_default=True,
    help="Device of the torch backend.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def play(
    model: Path | None,
    run_dir: Path | None,
    checkpoint: Path | None,
    backend: str,
    env_id: str | None,
    episodes: int,
    render: str,
    fullscreen: bool,
    fps: float,
    seed: int,
    epsilon: float,
    device: str,
    as_json: bool,
) -> None:
    """Play a learned policy and report returns and action latency."""
    from edgerl.play import load_policy
    from edgerl.play import play as run_play

    if model is not None and (run_dir is not None or checkpoint is not None):
        raise click.UsageError("give either --model or --run-dir/--checkpoint, not both")
    policy = load_policy(
        model=model, run_dir=run_dir, checkpoint=checkpoint, backend=backend, device=device
    )
    renderer = None
    if render != "none":
        from edgerl.display.render import make_renderer

        renderer = make_renderer(render, policy.spec, fullscreen=fullscreen)
        if fps == 0 and render == "screen":
            fps = 15.0  # the game's pace with frame skip 4 (60 Hz / 4); --fps overrides
    try:
        result = run_play(
            policy,
            env_id=env_id,
            episodes=episodes,
            seed=seed,
            epsilon=epsilon,
            renderer=renderer,
            fps=fps,
        )
    finally:
        if renderer is not None and hasattr(renderer, "close"):
            renderer.close()
    summary = result.to_json()
    if as_json:
        click.echo(json.dumps(summary))
        return
    lat = summary["latency_us"]
    click.echo(
        f"{summary['env']} with {summary['backend']}: {summary['episodes']} episodes, "
        f"mean return {summary['return_mean']:.2f} (returns {summary['returns']}); action "
        f"latency p50 {lat['p50']:.0f} us, p99 {lat['p99']:.0f} us, max {lat['max']:.0f} us"
    )


@cli.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="Config file (default: /etc/edgerl/edgerl.toml).",
)
@click.pass_context
def daemon(ctx: click.Context, config_file: Path | None) -> None:
    """Run as the edgerl service (systemd Type=notify): train, checkpoint, restore clocks."""
    from edgerl.daemon import run

    ctx.exit(run(config_file, debug=ctx.obj["debug"]))


@cli.command()
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="Run directory (default: the service's, else the newest under ./runs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print status.json with liveness fields.")
@click.pass_context
def status(ctx: click.Context, run_dir: Path | None, as_json: bool) -> None:
    """Show what a running trainer (the service or `edgerl train`) is doing.

    Exit code 0 while it runs, 3 when it is not running or its status is stale.
    """
    from edgerl.status import describe, liveness, read_status

    if run_dir is None:
        run_dir = _default_status_dir()
    doc = read_status(run_dir)
    live = liveness(doc)
    if as_json:
        click.echo(
            json.dumps(
                {**doc, "running": live.running, "stale": live.stale, "liveness": live.reason},
                indent=1,
            )
        )
    else:
        click.echo(describe(doc, live))
    ctx.exit(0 if live.running and not live.stale else 3)


def _default_status_dir() -> Path:
    from edgerl.config import build_layers, resolve
    from edgerl.errors import RunDirError
    from edgerl.rundir import service_state_dir
    from edgerl.status import find_status_dirs

    cfg = resolve(build_layers())
    if "train.run_dir" in cfg.explicit:
        return Path(cfg.train.run_dir)
    roots = [service_state_dir() / "runs", Path("runs")]
    found = find_status_dirs(roots)
    if not found:
        raise RunDirError(
            "no run with a status.json in "
            f"{' or '.join(str(r) for r in roots)}; give one with --run-dir, or start the "
            "service: systemctl start edgerl"
        )
    return found[0]


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
    help="With --snapshot/--frames: seconds to wait for frames.",
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
    opts = ViewOptions(
        run_dir=run_dir if run_dir is not None else _default_status_dir(),
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
    type=click.Path(path_type=Path),
    help="Export the run's newest valid checkpoint (default: the service's run).",
)
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Export this checkpoint.")
@click.option("--onnx", "to_onnx", is_flag=True, help="Write an ONNX file (works anywhere).")
@click.option(
    "--trt",
    "to_trt",
    is_flag=True,
    help="Also build a TensorRT engine (on the device that will run it).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(path_type=Path),
    help="Output file (.onnx / .engine) or directory (default: <run_dir>/export).",
)
@click.option(
    "--fp16/--fp32",
    default=True,
    show_default=True,
    help="Engine precision (FP16 only where the GPU has fast FP16).",
)
@click.option("--int8", is_flag=True, help="INT8 engine, calibrated on real game frames.")
@click.option(
    "--batch",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Largest batch the engine accepts (optimisation profile 1..N).",
)
@click.option(
    "--workspace-mb",
    type=click.IntRange(16, 65536),
    default=1024,
    show_default=True,
    help="TensorRT builder workspace.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def export(
    run_dir: Path | None,
    checkpoint: Path | None,
    to_onnx: bool,
    to_trt: bool,
    out: Path | None,
    fp16: bool,
    int8: bool,
    batch: int,
    workspace_mb: int,
    as_json: bool,
) -> None:
    """Export a checkpoint to ONNX and/or a TensorRT engine, each verified against PyTorch."""
    from edgerl.export import ExportRequest, run_export

    if not (to_onnx or to_trt):
        raise click.UsageError("give --onnx, --trt or both")
    if run_dir is not None and checkpoint is not None:
        raise click.UsageError("give either --run-dir or --checkpoint, not both")
    rows = run_export(
        ExportRequest(
            checkpoint=_export_source(run_dir, checkpoint),
            out=out,
            trt=to_trt,
            fp16=fp16,
            int8=int8,
            batch=batch,
            workspace_mb=workspace_mb,
        )
    )
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "file": str(r.file),
                        "backend": r.backend,
                        "precision": r.precision,
                        "size_bytes": r.size_bytes,
                        "agreement": r.agreement.to_dict(),
                        "latency_us": r.latency,
                        **r.extra,
                    }
                    for r in rows
                ],
                indent=1,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="edgerl export: batch-1 action latency on this machine")
    for col in (
        "file",
        "size",
        "backend",
        "precision",
        "agreement with PyTorch",
        "p50 us",
        "p99 us",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.file.name,
            f"{r.size_bytes / 2**20:.1f} MiB",
            r.backend,
            r.precision,
            r.agreement.describe(),
            f"{r.latency['p50']:.0f}",
            f"{r.latency['p99']:.0f}",
        )
    Console(width=160).print(table)


def _export_source(run_dir: Path | None, checkpoint: Path | None) -> Path:
    """The checkpoint to export: given, the run's newest, or the service's run's newest."""
    from edgerl.errors import CheckpointError
    from edgerl.play import newest_checkpoint

    if checkpoint is not None:
        if not checkpoint.is_file():
            raise CheckpointError(f"checkpoint {checkpoint} does not exist")
        return checkpoint
    if run_dir is None:
        from edgerl.daemon import daemon_config

        service_run = Path(daemon_config(None).train.run_dir)
        if not (service_run / "checkpoints").is_dir():
            raise CheckpointError(
                f"give --run-dir RUN or --checkpoint FILE (no service run at {service_run})"
            )
        run_dir = service_run
    return newest_checkpoint(run_dir)


@cli.command()
@click.option("--env", "env_id", default="ALE/Pong-v5", show_default=True)
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Seconds per whole-loop measurement (stages take a tenth of it each).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one config key (e.g. agent.train_freq=4); repeatable.",
)
@click.option("--autotune", is_flag=True, help="Also run the num_envs calibration.")
@click.option(
    "--compile",
    "compile_",
    is_flag=True,
    help="Also measure the torch.compile'd CPU update (compiling takes ~20 s).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
def bench(
    env_id: str,
    seconds: float,
    overrides: tuple[str, ...],
    autotune: bool,
    compile_: bool,
    as_json: bool,
) -> None:
    """Measure env, act, update and the whole loop (sync and async) on this machine."""
    from edgerl.bench import BenchOptions, render, run_bench

    result = run_bench(
        BenchOptions(
            env_id=env_id, seconds=seconds, overrides=overrides, autotune=autotune, compile=compile_
        )
    )
    click.echo(json.dumps(result, indent=1) if as_json else render(result))


@cli.command("config")
@config_options
@click.option("--reference", is_flag=True, help="Print every key with its default and doc.")
@click.option("--markdown", is_flag=True, help="With --reference: the README's table.")
def config_cmd(
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
    reference: bool,
    markdown: bool,
) -> None:
    """Print the resolved config (TOML), presets for the environment included."""
    from edgerl.config import apply_presets, check_consistency, describe
    from edgerl.envs import probe

    if reference and markdown:
        from edgerl.config import reference_markdown

        click.echo(reference_markdown(), nl=False)
        return
    if reference:
        for key, default, doc in describe():
            click.echo(
                f"{key} = {json.dumps(list(default) if isinstance(default, tuple) else default)}"
                f"  # {doc}"
            )
        return
    cfg = build_config(config_file, overrides, env_id, steps, run_dir)
    cfg = apply_presets(cfg, probe(cfg.env.id).kind)
    check_consistency(cfg)
    click.echo(cfg.to_toml(), nl=False)


@cli.group()
def hw() -> None:
    """Jetson hardware: board status, clocks, tegrastats logs."""


def _hw_config(config_file: Path | None, overrides: tuple[str, ...]) -> Any:
    return build_config(config_file, overrides, None, None, None).hw


def hw_config_options(func: F) -> F:
    func = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one config key (e.g. hw.jetson_clocks=/path).",
    )(func)
    return click.option(
        "--config", "config_file", type=click.Path(path_type=Path), help="TOML config file."
    )(func)


@hw.command("status")
@hw_config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def hw_status(config_file: Path | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Board, L4T, clocks state, power mode and one current load line."""
    from edgerl.hw.status import hardware_status

    status = hardware_status(_hw_config(config_file, overrides))
    if as_json:
        click.echo(json.dumps(status, indent=2))
        return
    for key in ("board", "l4t", "cpus", "gpu", "clocks", "power_mode", "load_source", "load"):
        click.echo(f"{key.replace('_', ' '):12s} {status[key] if status[key] is not None else '-'}")


@hw.group("clocks")
def hw_clocks() -> None:
    """Show, max or restore the Jetson clocks (jetson_clocks)."""


@hw_clocks.command("show")
@hw_config_options
def hw_clocks_show(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Print jetson_clocks --show and whether clocks are pinned at maximum."""
    from edgerl.hw.status import clocks_show

    click.echo(clocks_show(_hw_config(config_file, overrides)))


@hw_clocks.command("max")
@hw_config_options
def hw_clocks_max(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Store the clocks, then max them (undo with `edgerl hw clocks restore`)."""
    from edgerl.hw.status import clocks_max

    click.echo(clocks_max(_hw_config(config_file, overrides)))


@hw_clocks.command("restore")
@hw_config_options
def hw_clocks_restore(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Restore the clocks edgerl stored (the service's ExecStopPost runs this)."""
    from edgerl.hw.status import clocks_restore

    click.echo(clocks_restore(_hw_config(config_file, overrides)))


@hw.command("parse")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True
)
def hw_parse(file: Path, fmt: str) -> None:
    """Turn a saved tegrastats log (any Jetson generation) into CSV or JSON records."""
    from edgerl.hw.status import parse_log

    records, skipped = parse_log(file)
    for lineno, line in skipped:
        click.echo(f"{file}:{lineno}: skipped, not a tegrastats line: {line[:60]}", err=True)
    click.echo(render_records(records, fmt), nl=False)


def render_records(records: list[dict[str, Any]], fmt: str) -> str:
    """Records as a JSON list or CSV (lists and maps as JSON in their cells)."""
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    import csv
    import io

    from edgerl.hw.tegrastats import CSV_FIELDS

    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS)
    for rec in records:
        writer.writerow(
            [
                json.dumps(rec[k])
                if isinstance(rec[k], (list, dict))
                else ("" if rec[k] is None else rec[k])
                for k in CSV_FIELDS
            ]
        )
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (never raises for user errors)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        rv = cli.main(args=args, prog_name="edgerl", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except EdgerlError as e:
        if debug:
            log.exception("user error")
        click.echo(f"edgerl: error: {e}", err=True)
        return e.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except Exception as e:
        if debug:
            log.exception("internal error")
        click.echo(
            f"edgerl: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)",
            err=True,
        )
        return 1
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
