"""Commands about this machine: ``doctor``, ``bench``, ``hw``."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import click

from edgerl.cli.app import cli
from edgerl.cli.options import build_config, config_options
from edgerl.config import HwConfig


@cli.command()
@click.option(
    "--deep",
    is_flag=True,
    help="Also run real updates in every mode, a replay and the exports on the device "
    "(meant to take under two minutes on a GPU).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as a JSON document.")
@config_options()
def doctor(deep: bool, as_json: bool, config_file: Path | None, overrides: tuple[str, ...]) -> int:
    """Check that this machine can train, watch and export, and say how to fix what it cannot.

    One line per check: pass, warn, fail or skip, what was found, and the fix. Exit code 0 when
    no check failed (warnings and skips allowed), 1 when one did.
    """
    from edgerl.doctor import DoctorOptions, Report, run_checks

    edgerl_log = logging.getLogger("edgerl")
    level = edgerl_log.level
    if not click.get_current_context().obj.get("debug"):
        # The report says what the checks found; progress logs would only break up its lines.
        edgerl_log.setLevel(logging.WARNING)
    report = Report(deep=deep)
    try:
        for check in report.add(run_checks(DoctorOptions(deep, config_file, overrides))):
            if not as_json:
                click.echo(check.line())
    finally:
        edgerl_log.setLevel(level)
    click.echo(json.dumps(report.to_dict(), indent=1) if as_json else report.summary())
    return report.exit_code


@cli.command()
@click.option(
    "--env", "env_id", help="The game  [default: the preset's or the config's, else ALE/Pong-v5]"
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=1),
    default=20.0,
    show_default=True,
    help="Seconds per whole-loop measurement (stages take a tenth of it each).",
)
@click.option(
    "--envs",
    default="1,4,8,16",
    show_default=True,
    help="Comma-separated env.num_envs values to measure env steps/s at.",
)
@click.option(
    "--actor-envs",
    default="8,32",
    show_default=True,
    help="Comma-separated env.num_envs values to measure the actor alone at, beside the raw "
    "vector env (Atari; empty to skip).",
)
@click.option(
    "--loop-envs",
    default="1,4",
    show_default=True,
    help="Comma-separated env.num_envs values to run the whole loop at: sync at each, async "
    "beside it where there are several (a replay learner; PQN runs its own env.num_envs).",
)
@click.option(
    "--batch-shapes",
    default="",
    help="Also measure the learner alone at these agent.batch_size/agent.train_freq pairs, "
    "e.g. 64/8,128/16 (a replay learner; the same samples per env step in fewer updates).",
)
@config_options("preset")
@click.option("--autotune", is_flag=True, help="Also run the num_envs calibration.")
@click.option(
    "--compile",
    "compile_",
    is_flag=True,
    help="Also measure the torch.compile'd CPU update (compiling takes 20-50 s).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON document.")
def bench(
    env_id: str | None,
    seconds: float,
    envs: str,
    actor_envs: str,
    loop_envs: str,
    batch_shapes: str,
    config_file: Path | None,
    overrides: tuple[str, ...],
    preset: str | None,
    autotune: bool,
    compile_: bool,
    as_json: bool,
) -> None:
    """Measure env, act, update and the whole loop (sync and async) on this machine."""
    from edgerl.measure.bench import BenchOptions, run_bench
    from edgerl.measure.report import render

    env_sizes = _sizes(envs, "--envs")
    if not env_sizes:
        raise click.BadParameter("give at least one number of environments", param_hint="--envs")
    loops = _sizes(loop_envs, "--loop-envs")
    if not loops:
        raise click.BadParameter(
            "give at least one number of environments", param_hint="--loop-envs"
        )
    if preset is not None:
        import torch

        from edgerl.config.checks import check_preset_device

        check_preset_device(preset, torch.cuda.is_available())
    result = run_bench(
        BenchOptions(
            env_id=env_id,
            preset=preset,
            seconds=seconds,
            config_file=config_file,
            overrides=overrides,
            autotune=autotune,
            compile=compile_,
            env_sizes=env_sizes,
            actor_envs=_sizes(actor_envs, "--actor-envs"),
            loop_envs=loops,
            batch_shapes=_shapes(batch_shapes),
        )
    )
    click.echo(json.dumps(result, indent=1) if as_json else render(result))
    if result.get("interrupted"):  # what was measured is printed, the exit says it is not all
        raise click.exceptions.Exit(130)


def _shapes(text: str) -> tuple[tuple[int, int], ...]:
    """(batch_size, train_freq) pairs from ``"64/8,128/16"``; raises click.BadParameter."""
    shapes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        batch, _, freq = part.partition("/")
        try:
            shape = (int(batch), int(freq))
        except ValueError:
            raise click.BadParameter(
                f"expected pairs such as 128/16 (batch size / train_freq), got {part!r}",
                param_hint="--batch-shapes",
            ) from None
        if min(shape) < 1:
            raise click.BadParameter(
                f"a batch size and a train_freq are 1 or more, got {part!r}",
                param_hint="--batch-shapes",
            )
        shapes.append(shape)
    return tuple(shapes)


def _sizes(text: str, option: str) -> tuple[int, ...]:
    """Numbers of environments from ``"1,4,8"``; raises click.BadParameter with what is wrong."""
    try:
        sizes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected numbers separated by commas, got {text!r}", param_hint=option
        ) from None
    if sizes and min(sizes) < 1:
        raise click.BadParameter(
            "every number of environments must be 1 or more", param_hint=option
        )
    return sizes


@cli.group()
def hw() -> None:
    """Jetson hardware: board status, clocks, tegrastats logs."""


def _hw_config(config_file: Path | None, overrides: tuple[str, ...]) -> HwConfig:
    return build_config(config_file, overrides).hw


@hw.command("status")
@config_options()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def hw_status(config_file: Path | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Board, L4T, clocks state, power mode and one current load line."""
    from edgerl.hw.commands import hardware_status, render_status

    status = hardware_status(_hw_config(config_file, overrides))
    click.echo(json.dumps(status, indent=2) if as_json else render_status(status))


@hw.group("clocks")
def hw_clocks() -> None:
    """Show, max or restore the Jetson clocks (jetson_clocks)."""


@hw_clocks.command("show")
@config_options()
def hw_clocks_show(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Print jetson_clocks --show and whether clocks are pinned at maximum."""
    from edgerl.hw.commands import clocks_show

    click.echo(clocks_show(_hw_config(config_file, overrides)))


@hw_clocks.command("max")
@click.option(
    "--service",
    is_flag=True,
    help="As the service's privileged ExecStartPre: follow hw.max_clocks (true for the service "
    "unless the config says otherwise); not a Jetson is no error.",
)
@config_options()
def hw_clocks_max(service: bool, config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Store the clocks, then max them (undo with `edgerl hw clocks restore`)."""
    from edgerl.hw.commands import clocks_max

    cfg = build_config(config_file, overrides)
    hw = cfg.hw
    if service and "hw.max_clocks" not in cfg.explicit:
        hw = dataclasses.replace(hw, max_clocks=True)  # the service's default (daemon_config)
    click.echo(clocks_max(hw, service))


@hw_clocks.command("restore")
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    help="Where the clocks were stored [default: hw.state_dir if the config can be read, and "
    "/run/edgerl-clocks as root].",
)
@config_options()
def hw_clocks_restore(
    state_dir: Path | None, config_file: Path | None, overrides: tuple[str, ...]
) -> None:
    """Restore the clocks edgerl stored (the service's ExecStopPost runs this).

    It needs only the marker file edgerl wrote: a config that cannot be read is named and the
    default place is looked at, so the clocks are restored whatever the config holds.
    """
    from edgerl.errors import EdgerlError
    from edgerl.hw.clocks import default_state_dir, state_dir_for
    from edgerl.hw.commands import clocks_restore

    dirs = [state_dir] if state_dir is not None else []
    config_problem = None
    if state_dir is None:
        try:
            dirs.append(state_dir_for(build_config(config_file, overrides).hw))
        except Exception as e:  # restoring must not depend on the config, whatever it holds
            config_problem = str(e) if isinstance(e, EdgerlError) else repr(e)[:200]
            logging.getLogger("edgerl").warning(
                "the config cannot be read (%s); looking for stored clocks in %s",
                config_problem,
                default_state_dir(),
            )
        dirs.append(default_state_dir())
    click.echo(clocks_restore(dirs, config_unread=config_problem is not None))


@hw.command("parse")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True
)
def hw_parse(file: Path, fmt: str) -> None:
    """Turn a saved tegrastats log (any Jetson generation) into CSV or JSON records."""
    from edgerl.hw.commands import parse_log, printable, render_records

    records, skipped = parse_log(file)
    for lineno, line in skipped:
        click.echo(f"{file}:{lineno}: skipped, not a tegrastats line: {printable(line)}", err=True)
    click.echo(render_records(records, fmt), nl=False)
