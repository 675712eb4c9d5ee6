"""Commands that train and follow training: ``train``, ``daemon``, ``status``, ``config``."""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

import click

from edgerl.cli.app import cli, command_name
from edgerl.cli.options import build_config, config_options, default_status_dir, seeds_run
from edgerl.service.logs import setup_logging

log = logging.getLogger("edgerl")


@cli.command()
@config_options("env", "steps", "run_dir", "seed", "quick", "preset")
@click.option(
    "--fresh",
    is_flag=True,
    help="Start over: move an existing run directory aside (never deleted).",
)
@click.option("--quiet", is_flag=True, help="No progress bar or progress log lines.")
@click.option(
    "--seeds",
    type=click.IntRange(min=1, max=1000),
    default=1,
    show_default=True,
    help="Train N runs, one after another, with seeds --seed, --seed+1, ... in RUN/seed-K, "
    "RUN a folder that holds no run of its own (two at once on a small machine only slow each "
    "other); then `edgerl results RUN` sums them up.",
)
@click.pass_context
def train(
    ctx: click.Context,
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
    seed: int | None,
    quick: bool,
    preset: str | None,
    fresh: bool,
    quiet: bool,
    seeds: int,
) -> None:
    """Train an agent (DQN; PQN, PPO or the GA with --set agent.algo=...); resumes its checkpoint.

    Ctrl-C stops after the current step and writes a checkpoint; run the same command to resume.
    """
    if seeds == 1:
        train_one(
            ctx, config_file, overrides, env_id, steps, run_dir, seed, quick, preset, fresh, quiet
        )
        return
    from edgerl.errors import RunDirError
    from edgerl.report.rundir import holds_run, run_dir_of

    cfg = build_config(config_file, overrides, env_id, steps, run_dir, seed, quick, preset)
    base = run_dir_of(cfg)
    if holds_run(base):  # its seeds inside it would be hidden by it from results and status
        raise RunDirError(
            f"{base} holds a run of its own: --seeds trains each seed in a seed-K folder of a "
            "folder that holds no run, which `edgerl results` then sums up; give one with "
            f"--run-dir, e.g. --run-dir {shlex.quote(str(base))}-seeds"
        )
    first = cfg.env.seed
    # Each seed's run directory and seed are given as --run-dir and --seed: a --set of the same
    # keys (where the first came from) would disagree with them.
    per_seed = ("env.seed", "train.run_dir")
    overrides = tuple(o for o in overrides if o.partition("=")[0].strip() not in per_seed)
    for k in range(seeds):
        here = base / f"seed-{first + k}"
        click.echo(f"== seed {first + k} ({k + 1} of {seeds}): {here}", err=True)
        # A stop ends the command here (ctx.exit): the same command resumes this seed, and
        # the seeds already trained have nothing left to do.
        train_one(
            ctx, config_file, overrides, env_id, steps, here, first + k, quick, preset, fresh, quiet
        )
    from edgerl.display.seed_runs import NotEvaluatedYet, find_runs

    edgerl = command_name()
    try:
        find_runs([base])  # what `edgerl results` reads: it fails where no seed was evaluated
    except NotEvaluatedYet:
        click.echo(
            "these runs made no greedy evaluation (eval.every_steps is off below 50,000 steps "
            f"unless set), which `{edgerl} results` needs: give the seeds' command --set "
            "eval.every_steps=N (a tenth of the steps, say) in another --run-dir",
            err=True,
        )
        return
    click.echo(
        f"next: {edgerl} results {shlex.quote(str(base))} -o seeds.png   # k of {seeds} at "
        "the target, final scores, IQM",
        err=True,
    )


def train_one(
    ctx: click.Context,
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
    seed: int | None,
    quick: bool,
    preset: str | None,
    fresh: bool,
    quiet: bool,
) -> None:
    """One run of ``edgerl train``; a stop ends the command (``ctx.exit``)."""
    from edgerl.run.signals import StoppedDuringSetup, StopRequest, stop_on_signals

    stop = StopRequest()
    try:
        # From the start: a Ctrl-C while torch and the games are imported becomes a stop request.
        # As an exception raised inside those imports it can be swallowed (torch's C start-up
        # swallows one raised in its import of numpy, leaving numpy half-built for later).
        with stop_on_signals(stop.set) as received:
            from edgerl.hw.device import describe_threads
            from edgerl.report.estimate import expectation
            from edgerl.report.metrics import check_extras
            from edgerl.service.session import training_session

            cfg = build_config(
                config_file,
                overrides,
                env_id,
                steps,
                run_dir,
                seed,
                quick,
                preset,
                not fresh,
                stop=lambda: stop.reason,  # --preset board's measuring ends at once
            )
            setup_logging(ctx.obj["debug"], cfg.log.level)
            if preset is not None:
                import torch

                from edgerl.config.checks import check_preset_device

                check_preset_device(preset, torch.cuda.is_available())
            check_extras(cfg.train.tensorboard)  # before anything is written
            if stop.reason is not None:
                raise StoppedDuringSetup(stop.reason)
            with training_session(cfg, fresh=fresh, quiet=quiet, stop=stop) as session:
                trainer = session.trainer
                log.info(
                    "training %s on %s, %s: run directory %s",
                    trainer.cfg.env.id,
                    trainer.device,
                    describe_threads(trainer.cfg.perf.threads),
                    trainer.run_dir,
                )
                gpu = trainer.device.type == "cuda"
                expected = trainer.spec.has_frames and expectation(
                    trainer.cfg.env.id, trainer.cfg.agent.algo, gpu
                )
                if expected:
                    log.info("%s", expected)
                result = trainer.run()
                verdict = session.verdict()
    except StoppedDuringSetup as e:
        click.echo(f"{e}: no step was taken, nothing was lost", err=True)
        ctx.exit(130 if e.reason == "SIGINT" else 143)
    if result.session_steps or result.stopped:  # else the log said there was nothing to do
        click.echo(result.summary(), err=True)
        if verdict:
            click.echo(f"what limited training: {verdict}", err=True)
    if quick and not result.stopped:
        edgerl, run = command_name(), shlex.quote(str(trainer.run_dir))
        click.echo(
            f"next: {edgerl} plot --terminal --run-dir {run}   # the learning curve", err=True
        )
        click.echo(
            f"next: {edgerl} play --run-dir {run} --episodes 3   # the policy playing", err=True
        )
        missing = missing_extras()
        if missing:
            click.echo(
                f"not installed here: {', '.join(missing)}; `make run EXTRAS=commands` (or pip "
                "install 'edgerl[commands]') installs what every command needs",
                err=True,
            )
    if result.stopped:
        sig = received.get("signal", "a stop request")
        click.echo(f"stopped by {sig}; run the same command to resume", err=True)
        ctx.exit(130 if sig == "SIGINT" else 143)


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
    from edgerl.service.daemon import run

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

    Exit code 0 while it runs or once it has finished (reached train.steps), 3 when it stopped
    before that, is not running or its status is stale, 2 when its status cannot be read.
    """
    from edgerl.report.status import describe, disk_full, liveness, read_status

    run_dir = default_status_dir() if run_dir is None else seeds_run(run_dir)
    doc = read_status(run_dir)
    live = liveness(doc)
    if as_json:
        click.echo(
            json.dumps(
                {
                    **doc,
                    "running": live.running,
                    "stale": live.stale,
                    "finished": live.finished,
                    "liveness": live.reason,
                },
                indent=1,
            )
        )
    else:
        click.echo(describe(doc, live, run_dir))
        if live.running and disk_full(run_dir):  # why status.json may be stale
            click.echo(
                f"the disk holding {run_dir} is full: training goes on, but its status, metrics "
                "and checkpoints wait for space"
            )
    ctx.exit(live.exit_code)


@cli.command("config")
@config_options("env", "steps", "run_dir", "quick", "preset")
@click.option("--reference", is_flag=True, help="Print every key with its default and doc.")
@click.option("--markdown", is_flag=True, help="With --reference: the docs' Markdown table.")
def config_cmd(
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None,
    steps: int | None,
    run_dir: Path | None,
    quick: bool,
    preset: str | None,
    reference: bool,
    markdown: bool,
) -> None:
    """Print the resolved config (TOML), presets for the environment included."""
    from edgerl.config.presets import apply_presets
    from edgerl.config.reference import reference_markdown, reference_text
    from edgerl.envs import probe
    from edgerl.learners.factory import check_keys

    if reference:
        click.echo(reference_markdown() if markdown else reference_text(), nl=False)
        return
    if markdown:
        raise click.UsageError("--markdown formats the reference: give it with --reference")
    cfg = build_config(config_file, overrides, env_id, steps, run_dir, quick=quick, preset=preset)
    spec = probe(cfg.env)
    cfg = apply_presets(cfg, spec.kind, spec.continuous)
    check_keys(cfg)
    click.echo(cfg.to_toml(), nl=False)


def missing_extras() -> list[str]:
    """``edgerl view (the viewer extra)`` for each command a first run leads to whose extra is
    not installed."""
    import importlib.util

    from edgerl.serve import WEB_MODULES

    command_extras = (  # (command, extra, the modules it needs)
        ("edgerl export", "export", ("onnx", "onnxruntime")),
        ("edgerl view", "viewer", ("pygame",)),
        ("edgerl serve", "web", tuple(module for module, _ in WEB_MODULES)),
    )
    return [
        f"{command} (the {extra} extra)"
        for command, extra, modules in command_extras
        if any(importlib.util.find_spec(m) is None for m in modules)
    ]
