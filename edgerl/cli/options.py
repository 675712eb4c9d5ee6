"""Options several commands share, and finding the run a command is about."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from edgerl.config import Config, Layer
from edgerl.config.learners import LEARNERS

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("edgerl")

SHORTCUTS = ("env", "steps", "run_dir", "seed", "quick", "preset")

SUFFIXES = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


class StepCount(click.ParamType):
    """A number of steps as people write it: ``1000000``, ``1e6``, ``10M``, ``250k``, ``1_000``."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().replace("_", "").replace(",", "")
        scale = SUFFIXES.get(text[-1:].lower(), 1)
        if scale != 1:
            text = text[:-1]
        try:
            number = float(text) * scale
        except ValueError:
            self.fail(f"{value!r} is not a number of steps (e.g. 1000000, 1e6, 10M)", param, ctx)
        if number < 1 or not number.is_integer():
            self.fail(f"{value!r} is not a whole number of steps of at least 1", param, ctx)
        return int(number)


def config_options(*shortcuts: str) -> Callable[[F], F]:
    """``--config`` and ``--set`` (layers 3-4 of config.py), plus the shortcut flags named
    (``env``, ``steps``, ``run_dir``, ``seed``: layer 5; ``quick`` and ``preset``: a layer
    between the files and ``--set``). The command gets ``config_file``, ``overrides`` and one
    keyword per shortcut (``env_id``, ``steps``, ``run_dir``, ``seed``, ``quick``, ``preset``)."""
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
            click.option(
                "--steps",
                type=StepCount(),
                help="Shortcut for --set train.steps=N (a total over all environments, which "
                "step together; 1e6, 10M and 250k work).",
            )
        )
    if "run_dir" in shortcuts:
        options.append(
            click.option(
                "--run-dir",
                type=click.Path(),
                callback=_run_dir_given,
                help="Shortcut for --set train.run_dir=DIR.",
            )
        )

    if "seed" in shortcuts:
        options.append(
            click.option(
                "--seed", type=click.IntRange(min=0), help="Shortcut for --set env.seed=N."
            )
        )
    if "quick" in shortcuts:
        options.append(
            click.option(
                "--quick",
                is_flag=True,
                help="A first run that learns in minutes here: CartPole-v1 (60k steps) on a "
                "CPU, Pong with fast settings (500k steps) on a GPU; --env keeps your game.",
            )
        )

    if "preset" in shortcuts:
        from edgerl.config.presets import BOARD_PRESET, NAMED_PRESETS

        listed = "; ".join(f"{name}: {p.summary}" for name, p in sorted(NAMED_PRESETS.items()))
        board = f"{BOARD_PRESET}: the one for this machine's class, as the service chooses"
        options.append(
            click.option(
                "--preset",
                type=click.Choice(sorted([*NAMED_PRESETS, BOARD_PRESET])),
                help=f"A measured recipe (game, learner, settings); --set wins over it. {listed}; "
                f"{board}.",
            )
        )

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def _run_dir_given(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    """--run-dir's directory; an empty one is refused (it would be the current directory)."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("is empty: give a directory (left out: runs/<game>)")
    return Path(value)


def _check_said_once(sets: list[Layer], shortcuts: dict[str, Any]) -> None:
    """Raise ConfigError where a shortcut (--env, --steps, --run-dir, --seed) and a --set give
    the same key different values: the shortcut would win without a word."""
    from edgerl.errors import ConfigError

    flags = {"env.id": "--env", "train.steps": "--steps", "train.run_dir": "--run-dir"}
    flags["env.seed"] = "--seed"
    for layer in sets:
        for key, value in layer.values.items():
            given = shortcuts.get(key)
            if given is not None and given != value:
                raise ConfigError(
                    f"{flags[key]} {given} and --set {key}={value} disagree: give it once"
                )


def build_config(
    config_file: Path | None,
    overrides: tuple[str, ...],
    env_id: str | None = None,
    steps: int | None = None,
    run_dir: Path | None = None,
    seed: int | None = None,
    quick: bool = False,
    preset: str | None = None,
    resume: bool = False,
    stop: Callable[[], str | None] | None = None,
) -> Config:
    """The resolved config from the shared options; raises ConfigError (also for ``--quick``
    with ``--preset``: both choose the game and its settings), and StoppedDuringSetup where
    ``stop`` gives a reason while ``--preset board`` measures the machine. With ``resume``, a
    run already in the run directory lends its own recipe in place of the defaults
    (:func:`run_recipe_layer`)."""
    from edgerl.config import build_layers, resolve
    from edgerl.errors import ConfigError

    shortcuts = {
        "env.id": env_id,
        "train.steps": steps,
        "train.run_dir": str(run_dir) if run_dir is not None else None,
        "env.seed": seed,
    }
    layers = asked = build_layers(config_file, overrides, shortcuts)
    _check_said_once(build_layers(None, overrides, {}, use_system=False), shortcuts)
    if quick and preset:
        raise ConfigError("--quick and --preset both choose what to train: give one of them")
    if quick or preset:  # over the files, under what the command line says
        from edgerl.config.presets import BOARD_PRESET, named_preset_layer
        from edgerl.report.quick import quick_layer
        from edgerl.report.rundir import run_dir_of
        from edgerl.run.calibrate import calibrated_layer
        from edgerl.run.families import board_layer

        command_line = build_layers(None, overrides, shortcuts, use_system=False)
        files = build_layers(config_file)
        if quick:
            chosen = quick_layer(resolve(layers))
        elif preset == BOARD_PRESET:  # measured here (once: remembered) unless told not to
            said = resolve([*files, calibrated_layer(False), *command_line])
            unmeasured = with_game(said, resume)
            run_dir = run_dir_of(unmeasured)  # a run there keeps the recipe it trained with
            user = resolve(layers)  # a game it names is not measured as Pong
            game = user.env.id if "env.id" in user.explicit else None
            chosen = board_layer(user.hw.calibrate, game=game, run_dir=run_dir, stop=stop)
        else:
            chosen = named_preset_layer(str(preset))
        layers = [*files, chosen, *command_line]
    cfg = with_game(resolve(layers), resume)
    if preset is not None:
        from edgerl.config.checks import check_preset_game
        from edgerl.report.rundir import run_game

        run_of_a_game = bool(cfg.train.run_dir) and run_game(Path(cfg.train.run_dir)) is not None
        check_preset_game(preset, "env.id" in cfg.explicit or run_of_a_game)
    if resume and (recipe := run_recipe_layer(cfg)) is not None:
        try:
            cfg = with_game(resolve([recipe, *layers]), resume)
        except ConfigError as e:  # a value an older edgerl allowed and this one does not
            log.warning("resuming without the run's own settings: %s", e)
    from edgerl.config.checks import check_learner_layers
    from edgerl.envs import training_learner

    check_learner_layers(cfg, asked, config_file, lambda: training_learner(cfg))
    return cfg


# What a run's config.toml lends a resume: how it learns and is judged (every learner's own
# section, named as agent.algo names it), not the machine it ran on (perf, hw, display, log,
# fleet) nor where it is (train.run_dir).
RECIPE_SECTIONS = ("env", "agent", *LEARNERS, "replay", "eval", "train")


def run_recipe_layer(cfg: Config) -> Layer | None:
    """The settings of the run already in ``cfg``'s run directory (``train.run_dir``, else
    ``runs/<game>``), as the layer under every other: what a resume uses where the command line
    and the config files say nothing, instead of the built-in defaults (a run trained with
    ``--preset atari-cpu`` resumes as PQN with ``--run-dir`` alone). None when the directory
    holds no run, a run of another game, or a config.toml that cannot be read (said in the
    log)."""
    from edgerl.config import SECTIONS, keys
    from edgerl.config.parse import flatten, parse_toml_file
    from edgerl.errors import ConfigError
    from edgerl.report.rundir import run_dir_of

    run_dir = run_dir_of(cfg)
    path = run_dir / "config.toml"
    if not path.is_file():
        return None
    source = f"{path} (the run's own settings)"
    try:
        table = parse_toml_file(path, follow=False)
        saved = {s: v for s, v in table.items() if s in RECIPE_SECTIONS}
        values = flatten(saved, source, SECTIONS)
    except ConfigError as e:
        log.warning("resuming without the run's own settings: %s", e)
        return None
    if values.get("env.id") != cfg.env.id:  # another game: refused when it resumes, as it is
        return None
    known = set(keys())
    values = {k: v for k, v in values.items() if k in known and k != "train.run_dir"}
    recipe = values.get("train.recipe") or f"agent.algo={values.get('agent.algo', '?')}"
    log.info(
        "the run in %s keeps its own settings (%s, from its config.toml) for every key this "
        "command leaves unset",
        run_dir,
        recipe,
    )
    return Layer(source, values)


def with_game(cfg: Config, resume: bool = False) -> Config:
    """The game spelled as registered (``ALE/pong-v5`` names ``runs/Pong-v5``), and, when no
    game was given but the run directory holds a run, that run's game: resuming needs no --env
    (said in the log as a resume where the command will ``resume``, else as the run's game:
    ``--fresh`` moves that run aside and starts its game over)."""
    from edgerl.config import with_values
    from edgerl.envs import canonical_id
    from edgerl.report.rundir import run_env

    env = run_env(Path(cfg.train.run_dir)) if cfg.train.run_dir else {}
    saved = env.get("id") if isinstance(env.get("id"), str) and env.get("id") else None
    values: dict[str, Any] = {}
    if "env.id" in cfg.explicit:
        canonical = canonical_id(cfg.env.id)
        if canonical != cfg.env.id:
            values["env.id"] = canonical
    elif saved is not None and saved != cfg.env.id:
        if resume:
            log.info("resuming the run in %s: its game is %s", cfg.train.run_dir, saved)
        else:
            log.info("the game of the run in %s: %s", cfg.train.run_dir, saved)
        values["env.id"] = saved
    game = values.get("env.id", cfg.env.id)
    kwargs = env.get("make_kwargs")  # the run's gymnasium.make arguments go with its game
    if game == saved and "env.make_kwargs" not in cfg.explicit and isinstance(kwargs, dict):
        values["env.make_kwargs"] = kwargs
    return with_values(cfg, values) if values else cfg


def default_status_dir() -> Path:
    """The run a watching command is about when none is given: ``train.run_dir`` if the config
    sets it, else the most recently updated run with a status.json among the service's runs
    and ``./runs``; says which on stderr, and why. Raises RunDirError."""
    from edgerl.config import build_layers, resolve
    from edgerl.errors import RunDirError
    from edgerl.report.finding import find_status_dirs
    from edgerl.report.rundir import service_state_dir

    cfg = resolve(build_layers())
    if "train.run_dir" in cfg.explicit:
        return Path(cfg.train.run_dir)
    roots = [service_state_dir() / "runs", Path("runs")]
    found = find_status_dirs(roots)
    if not found:
        raise RunDirError(
            "no run with a status.json in "
            f"{' or '.join(str(r) for r in roots)} (from this directory); give one with "
            "--run-dir, train one (edgerl train --quick: a minute), or start the service "
            "where it is installed (systemctl start edgerl)"
        )
    _say_chosen(found[0], "the most recently updated status.json", roots)
    return found[0]


def seeds_run(run_dir: Path) -> Path:
    """``run_dir``, or, where it holds no run but seeds' runs (``edgerl train --seeds``'
    ``seed-K``), the one of them most recently updated, said on stderr with why."""
    from edgerl.report.finding import find_status_dirs
    from edgerl.report.rundir import seed_runs_in

    if not seed_runs_in(run_dir):
        return run_dir
    found = find_status_dirs([run_dir])
    if not found:
        return run_dir
    _say_chosen(found[0], "the most recently updated status.json of its seeds", [run_dir])
    return found[0]


def default_policy_run() -> Path:
    """The run ``play`` and ``export`` use when given none: of the service's run and the runs
    under the service's state directory and ``./runs``, the one with the newest checkpoint;
    says which on stderr, and why. Raises CheckpointError."""
    from edgerl.errors import CheckpointError
    from edgerl.report.finding import runs_below
    from edgerl.report.rundir import service_state_dir
    from edgerl.service.daemon import daemon_config

    service_run = Path(daemon_config(None, recipe=False).train.run_dir)
    roots = [service_state_dir() / "runs", Path("runs")]
    candidates = [service_run] + [run for root in roots for run in runs_below(root, "checkpoints")]
    newest = {}
    for run in candidates:
        try:
            times = [f.stat().st_mtime for f in (run / "checkpoints").iterdir()]
        except OSError:  # no such run, or one this user cannot read
            continue
        if times:
            newest[run] = max(times)
    if not newest:
        raise CheckpointError(
            "no run with checkpoints in "
            f"{service_run} or {' or '.join(str(r) for r in roots)}: give --run-dir RUN, "
            "--checkpoint FILE or --model FILE"
        )
    chosen = max(newest, key=lambda run: newest[run])
    elsewhere = [] if service_run.parent == roots[0] else [service_run]  # train.run_dir set
    _say_chosen(chosen, "the newest checkpoint", [*elsewhere, *roots])
    return chosen


def _say_chosen(run: Path, why: str, looked_in: list[Path]) -> None:
    """One line on stderr: the run a command chose by itself, and why (naming the places
    looked in that exist)."""
    places = ", ".join(dict.fromkeys(str(p) for p in looked_in if p.exists())) or "."
    click.echo(f"run {run}: {why} in {places} (--run-dir picks another)", err=True)
