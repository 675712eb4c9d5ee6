"""Options several commands share, and finding the run a command is about."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgerl.config import Config

F = TypeVar("F", bound=Callable[..., Any])

SHORTCUTS = ("env", "steps", "run_dir")


def config_options(*shortcuts: str) -> Callable[[F], F]:
    """``--config`` and ``--set`` (layers 3-4 of config.py), plus the shortcut flags named
    (``env``, ``steps``, ``run_dir``: layer 5). The command gets ``config_file``,
    ``overrides`` and one keyword per shortcut (``env_id``, ``steps``, ``run_dir``)."""
    unknown = set(shortcuts) - set(SHORTCUTS)
    if unknown:
        raise ValueError(f"unknown shortcut options {sorted(unknown)}")
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
    ]
    if "env" in shortcuts:
        options.append(click.option("--env", "env_id", help="Shortcut for --set env.id=ID."))
    if "steps" in shortcuts:
        options.append(
            click.option("--steps", type=int, help="Shortcut for --set train.steps=N (a total).")
        )
    if "run_dir" in shortcuts:
        options.append(
            click.option(
                "--run-dir",
                type=click.Path(path_type=Path),
                help="Shortcut for --set train.run_dir=DIR.",
            )
        )

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def build_config(
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None = None,
    steps: int | None = None,
    run_dir: Path | None = None,
) -> Config:
    """The resolved config from the shared options; raises ConfigError."""
    from edgerl.config import build_layers, resolve

    shortcuts = {
        "env.id": env_id,
        "train.steps": steps,
        "train.run_dir": str(run_dir) if run_dir is not None else None,
    }
    return resolve(build_layers(config_file, overrides, shortcuts))


def default_status_dir() -> Path:
    """The run a watching command is about when none is given: ``train.run_dir`` if the config
    sets it, else the service's run, else the newest under ``./runs``; raises RunDirError."""
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
