"""Commands for learned policies: ``play`` and ``export``."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import click

from edgerl.cli.app import cli, command_name
from edgerl.cli.options import default_policy_run
from edgerl.config import EvalConfig
from edgerl.words import plural

EVAL_EPSILON = EvalConfig().epsilon  # edgerl play's default: an evaluation's


@cli.command()
@click.option(
    "--model",
    type=click.Path(path_type=Path),
    help="A policy file: checkpoint (.ckpt), ONNX (.onnx) or TensorRT engine (.engine).",
)
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="A run directory: plays its best-evaluated policy, else its newest valid checkpoint "
    "(default: the service's run, else the newest under ./runs).",
)
@click.option("--checkpoint", type=click.Path(path_type=Path), help="A checkpoint file.")
@click.option("--last", is_flag=True, help="The run's newest checkpoint, not its best policy.")
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
    default=EVAL_EPSILON,
    show_default=True,
    help="Chance of a random action: the evaluations' (a policy that never presses FIRE does "
    "not idle to the game's cap); 0: greedy.",
)
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda", "auto"]),
    default="cpu",
    show_default=True,
    help="Device of the torch backend.",
)
@click.option(
    "--record",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Record the played episodes to FILE.gif or FILE.mp4 (MP4 needs ffmpeg).",
)
@click.option(
    "--record-view",
    type=click.Choice(["screen", "agent"]),
    default="screen",
    show_default=True,
    help="With --record: the game's colour screen, or the 84x84 grey frame the agent sees.",
)
@click.option(
    "--sample/--greedy",
    "sample",
    default=None,
    help="Draw each action from the policy's softmax, or take the largest output (default: as "
    "its evaluations did: PPO's checkpoints sample, the rest and exported files are greedy).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def play(
    model: Path | None,
    run_dir: Path | None,
    checkpoint: Path | None,
    last: bool,
    backend: str,
    env_id: str | None,
    episodes: int,
    render: str,
    fullscreen: bool,
    fps: float,
    seed: int,
    epsilon: float,
    device: str,
    record: Path | None,
    record_view: str,
    sample: bool | None,
    as_json: bool,
) -> None:
    """Play a learned policy and report returns and action latency."""
    from edgerl.config import EnvConfig
    from edgerl.envs import reference_steps
    from edgerl.hw.device import latency_threads
    from edgerl.play import Observer, PlayOptions
    from edgerl.play import play as run_play
    from edgerl.play.observers import EpisodeLog, Filming
    from edgerl.policies import load_policy

    if model is not None and (run_dir is not None or checkpoint is not None):
        raise click.UsageError("give either --model or --run-dir/--checkpoint, not both")
    if last and (model is not None or checkpoint is not None):
        raise click.UsageError("--last picks a run's checkpoint: give --run-dir (or nothing)")
    if record is not None:
        from edgerl.play.record import check_target

        check_target(record)  # a wrong name or a missing encoder is said before playing
    if model is None and checkpoint is None:
        checkpoint = _run_policy(run_dir, last, "playing")
    threads, load = latency_threads()
    policy = load_policy(
        model=model, checkpoint=checkpoint, backend=backend, device=device, threads=threads
    )
    observers: list[Observer] = [EpisodeLog()]
    if record is not None:
        observers.append(Filming(record, policy.spec, record_view))
    renderer = None
    if render != "none":
        from edgerl.display.render import make_renderer

        renderer = make_renderer(render, policy.spec, fullscreen=fullscreen)
        observers.append(renderer)
        if fps == 0 and render == "screen":
            fps = 15.0  # the game's pace with frame skip 4 (60 Hz / 4); --fps overrides
    within = reference_steps(EnvConfig(id=env_id or policy.spec.id)) or 0
    if sample is None:  # as its evaluations acted; an exported file says nothing of it
        sample = bool(getattr(policy, "samples", False))
    options = PlayOptions(
        env_id=env_id,
        episodes=episodes,
        seed=seed,
        epsilon=epsilon,
        fps=fps,
        within_steps=within,
        sample=sample,
    )
    try:
        result = run_play(policy, options, observers)
    except KeyboardInterrupt:
        if record is None:
            raise
        click.echo(f"interrupted: nothing was written to {record}", err=True)
        raise click.exceptions.Exit(130) from None
    finally:
        if renderer is not None:
            renderer.close()
    under = f"{plural(threads, 'CPU thread')}; {load}"
    if as_json:
        summary = {**result.to_json(), "epsilon": epsilon, "threads": threads, "load": load}
        click.echo(json.dumps(summary))
    else:
        click.echo(f"{result.describe()} ({under})")
    if result.recording is not None and not as_json:
        click.echo(result.recording.describe())


def export_interrupted(written: list[Path], unchecked: list[Path] | None = None) -> str:
    """What a Ctrl-C during an export leaves: the files checked and named before it (whole and
    usable), and those written before their check (a TensorRT engine is built under its name)."""
    if not written and not unchecked:
        return "interrupted: nothing was written (a file being made is removed, never named)"
    said = "no file was checked"
    if written:
        names = ", ".join(str(p) for p in written)
        said = f"{names} {'was' if len(written) == 1 else 'were'} written and checked before it"
    if unchecked:
        names = ", ".join(str(p) for p in unchecked)
        said += f"; {names} {'was' if len(unchecked) == 1 else 'were'} written but not checked:"
        said += " delete or export again"
    return f"interrupted: {said}"


@cli.command()
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    help="Export the run's best-evaluated policy, else its newest valid checkpoint (default: the "
    "service's run, else the newest under ./runs).",
)
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Export this checkpoint.")
@click.option("--last", is_flag=True, help="The run's newest checkpoint, not its best policy.")
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
    last: bool,
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
    from edgerl.export.run import ExportRequest, check_tools, render_table, run_export
    from edgerl.hw.device import latency_threads
    from edgerl.policies.sidecar import sidecar_path

    if int8 and not to_trt:
        raise click.UsageError(
            "--int8 is a TensorRT engine precision: add --trt (ONNX files are always fp32)"
        )
    if not (to_onnx or to_trt):
        raise click.UsageError("give --onnx, --trt or both")
    if run_dir is not None and checkpoint is not None:
        raise click.UsageError("give either --run-dir or --checkpoint, not both")
    if last and checkpoint is not None:
        raise click.UsageError("--last picks a run's checkpoint: give --run-dir (or nothing)")
    check_tools(to_trt)  # before the policy is named: nothing is exported without them
    source = _export_source(run_dir, checkpoint, last)
    threads, load = latency_threads()
    request = ExportRequest(
        checkpoint=source,
        out=out,
        trt=to_trt,
        fp16=fp16,
        int8=int8,
        batch=batch,
        workspace_mb=workspace_mb,
        threads=threads,
    )
    from edgerl.files.private import run_umask

    try:
        if out is None:  # into the run's export/ folder: as private as the run's files
            with run_umask():
                rows = run_export(request)
        else:
            rows = run_export(request)
    except KeyboardInterrupt:
        click.echo(export_interrupted(request.written, request.unchecked), err=True)
        raise click.exceptions.Exit(130) from None
    if as_json:
        measured = {"threads": threads, "load": load}
        click.echo(json.dumps([{**r.to_dict(), **measured} for r in rows], indent=1))
        return
    click.echo(render_table(rows, f"{plural(threads, 'CPU thread')}; {load}"), nl=False)
    written = [r.file.resolve() for r in rows if r.file.suffix in (".onnx", ".engine")]
    for path in written:  # the table shortens names; these are ready to copy
        click.echo(f"wrote {path}")
        if (sidecar := sidecar_path(path)).is_file():  # play --model reads it beside the model
            click.echo(f"wrote {sidecar}")
    engines = [p for p in written if p.suffix == ".engine"]
    if written:
        best = (engines or written)[-1]  # the engine when one was built
        # On the board's console (kmsdrm) --render screen works too; without a desktop to say
        # so, the console view is the one sure to draw.
        screen = os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        render = "screen" if screen else "console --fps 15"  # the game's pace in a terminal too
        model = shlex.quote(str(best))
        click.echo(f"play it with: {command_name()} play --model {model} --render {render}")


def _export_source(run_dir: Path | None, checkpoint: Path | None, last: bool) -> Path:
    """The checkpoint to export: given, else the run's policy (:func:`_run_policy`)."""
    from edgerl.errors import CheckpointError

    if checkpoint is not None:
        if not checkpoint.is_file():
            raise CheckpointError(f"checkpoint {checkpoint} does not exist")
        return checkpoint
    return _run_policy(run_dir, last, "exporting")


def _run_policy(run_dir: Path | None, last: bool, doing: str) -> Path:
    """The policy of ``run_dir`` (default: the service's run, else the newest under ./runs): its
    best-evaluated one, or its newest checkpoint with ``last``; says which on stderr. Raises
    CheckpointError when the run has none."""
    from edgerl.report.best import choose

    if run_dir is None:
        run_dir = default_policy_run()
    choice = choose(run_dir, last)
    click.echo(f"{doing} {choice.sentence}", err=True)
    return choice.path
