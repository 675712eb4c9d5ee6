"""Every check of a config across its keys, in one place, made once presets are applied
(:func:`check_consistency`, with the fleet's keys in :func:`check_fleet`) and the named preset
against the machine (:func:`check_preset_device`). Each raises ConfigError with one sentence
naming the keys to change. What needs the device or PyTorch (the precision, the memory against
the machine's) is checked where those are known, and what the learner's memory needs of its keys
(a replay's capacity against its batch and its environments) by the memory's kind
(:meth:`edgerl.memories.kinds.MemoryKind.refuse`, through
:func:`edgerl.learners.factory.check_setup`): :func:`edgerl.run.settle.settle_config` calls
everything in order, top to bottom."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from edgerl.config import SECTIONS, Config, Layer
from edgerl.config.fleet import parse_resource
from edgerl.config.learners import (
    EPSILON_KEYS,
    LEARNERS,
    MEMORY_SECTIONS,
    RemoteActors,
    learner_info,
)
from edgerl.config.presets import NAMED_PRESETS
from edgerl.config.sections import MAX_HIDDEN
from edgerl.errors import ConfigError

log = logging.getLogger(__name__)


def check_preset_device(name: str, cuda_usable: bool) -> None:
    """Raises ConfigError when preset ``name`` was measured on a CUDA GPU and none is usable."""
    if name in NAMED_PRESETS and NAMED_PRESETS[name].gpu and not cuda_usable:
        game = NAMED_PRESETS[name].values.get("env.id")  # those of its game, or of any
        cpu_presets = sorted(
            n
            for n, p in NAMED_PRESETS.items()
            if not p.gpu and p.values.get("env.id") in (game, None)
        )
        raise ConfigError(
            f"--preset {name} is a recipe for a CUDA GPU and none is usable here; on a CPU "
            f"use --preset {' or --preset '.join(cpu_presets)}"
        )


def check_preset_game(name: str, game_named: bool) -> None:
    """Raises ConfigError when preset ``name`` is a recipe without a game of its own (one for
    any Atari game) and the command names none (``game_named``: ``--env``, ``env.id`` in a
    config, or a run directory that holds a run of a game): the default game would be trained,
    and a run of it there resumed under this recipe's name."""
    preset = NAMED_PRESETS.get(name)
    if preset is None or "env.id" in preset.values or game_named:
        return
    with_game = sorted(n for n, p in NAMED_PRESETS.items() if p.values.get("env.id"))
    raise ConfigError(
        f"--preset {name} is a recipe for any Atari game and names none: give the game with "
        f"--env, e.g. --env ALE/Breakout-v5 (the presets with a game of their own: "
        f"{', '.join(with_game)})"
    )


def readers_of(key: str) -> list[str] | None:
    """The learners (names of :data:`LEARNERS`) that read ``key`` (``section.name``) when its
    section is a learner's own, named as ``agent.algo`` names it (``[pqn]``, ``[ppo]``,
    ``[ga]``), or a memory's (``[replay]``): the learner it is named for (first), any whose
    samples to target depend on the key, and any whose memory is made from it
    (:meth:`~edgerl.config.learners.LearnerInfo.memory_reads`: a replay learner's ``[replay]``,
    the rollout's length of a rollout learner without a rollout key of its own, PQN's); for
    ``agent.eps_*``, the learners that explore by epsilon. None for another key of a section
    every learner reads (``[agent]``, ``[env]``, ``[train]``, ...)."""
    if key in EPSILON_KEYS:
        return [n for n, i in LEARNERS.items() if i.explores_by_epsilon]
    section = key.partition(".")[0]
    if section not in SECTIONS or section not in (*LEARNERS, *MEMORY_SECTIONS.values()):
        return None
    also = {n for n, i in LEARNERS.items() if key in i.sample_keys or i.memory_reads(key)}
    if section not in LEARNERS:
        return [n for n in LEARNERS if n in also]  # in the registry's order
    return [section, *sorted(also - {section})]  # the learner it is named for first


def unread_keys(keys: Iterable[str], algo: str) -> dict[str, list[str]]:
    """Of ``keys``, those learner ``algo`` never reads (of another learner's section, or of a
    memory it learns without), each with the learners that read it (:func:`readers_of`)."""
    out = {}
    for key in keys:
        readers = readers_of(key)
        if readers is not None and algo not in readers:
            out[key] = readers
    return out


def check_learner_keys(sets: Iterable[str], algo: str) -> None:
    """Raises ConfigError when a key ``--set`` on the command line (``sets``) is one learner
    ``algo`` never reads: of another learner's section (``--set ppo.clip=0.1`` on a DQN run),
    or of a memory it learns without (``--set replay.capacity=1000`` on a PQN run). It would
    change nothing, and the run would be taken for one that tried it."""
    unread = unread_keys(sets, algo)
    if not unread:
        return
    key, readers = next(iter(unread.items()))
    more = f" (and {', '.join(list(unread)[1:])})" if len(unread) > 1 else ""
    section = key.partition(".")[0]
    train = f"add --set agent.algo={readers[0]} to train that learner, or leave it out"
    if key in EPSILON_KEYS:
        learners = " and ".join(f"agent.algo={n}" for n in readers)
        raise ConfigError(
            f"--set {key}{more} does nothing with agent.algo={algo}, which explores its own "
            f"way, not by epsilon: agent.eps_* are read by {learners}; leave it out"
        )
    if section in LEARNERS:
        raise ConfigError(
            f"--set {key}{more} does nothing with agent.algo={algo}: [{section}] holds the keys "
            f"of agent.algo={section}; {train}"
        )
    if len(readers) != 1:
        train = train.replace("that learner", "one of them") if readers else "leave it out"
    learners = " and ".join(f"agent.algo={n}" for n in readers) or "no learner"
    raise ConfigError(
        f"--set {key}{more} does nothing with agent.algo={algo}, which learns without a "
        f"{section}: [{section}] holds the keys of the {section} of {learners}; {train}"
    )


def check_learner_layers(
    cfg: Config, layers: list[Layer], config_file: Path | None, learner: Callable[[], str]
) -> None:
    """Refuse a ``--set`` of a key the learner never reads (another learner's, ``--set
    ppo.clip=0.1`` on a DQN run, or a memory's it learns without, ``--set replay.capacity=1000``
    on a PQN run: it would change nothing); a ``--config`` file's are said in the log, since one
    file often holds the settings of several learners. ``layers``: the command's own, as read
    (a file given as ``<(...)`` is read once); ``learner()`` names the learner that will train
    (:func:`edgerl.envs.training_learner`: the game is probed only where a key needs it).
    Raises ConfigError."""
    algo: str | None = None  # the learner that will train, asked only where a key needs it
    for layer in layers:
        values = layer.values
        if layer.source == "--set" and any(readers_of(k) is not None for k in values):
            # Asked of the learner that trains, which a continuous game naming none makes SAC
            # (PPO where it shows frames): a DQN key such as agent.eps_end is not theirs.
            algo = algo or learner()
            check_learner_keys(values, algo)
        elif config_file is not None and layer.source == str(config_file):
            if not unread_keys(values, cfg.agent.algo):
                continue
            algo = algo or learner()
            unread = unread_keys(values, algo)
            if unread:
                log.warning(
                    "%s sets %s, which agent.algo=%s does not read: %s in this run",
                    config_file,
                    ", ".join(unread),
                    algo,
                    "it does nothing" if len(unread) == 1 else "they do nothing",
                )


def check_consistency(cfg: Config) -> None:
    """Cross-key checks, after presets; raises ConfigError with the keys to change."""
    a = cfg.agent
    if a.eps_end > a.eps_start:
        raise ConfigError(
            f"agent.eps_end ({a.eps_end}) must not exceed agent.eps_start ({a.eps_start})"
        )
    check_fleet(cfg)
    if cfg.env.batch_size >= cfg.env.num_envs > 0 and cfg.env.batch_size:
        raise ConfigError(
            f"env.batch_size ({cfg.env.batch_size}) must be below env.num_envs "
            f"({cfg.env.num_envs}), or 0 to step every environment together"
        )
    if cfg.display.env_index >= cfg.env.num_envs:
        raise ConfigError(
            f"display.env_index ({cfg.display.env_index}) must be below "
            f"env.num_envs ({cfg.env.num_envs})"
        )
    if a.lr_end != -1.0 and a.lr_end < 0:
        raise ConfigError(f"agent.lr_end must be -1 (constant) or at least 0, got {a.lr_end}")
    if not a.hidden or len(a.hidden) > 16 or any(not 1 <= h <= MAX_HIDDEN for h in a.hidden):
        shown = list(a.hidden) if len(a.hidden) <= 16 else f"{len(a.hidden)} layers"
        raise ConfigError(
            f"agent.hidden must list 1 to 16 layer widths between 1 and {MAX_HIDDEN:,}, got {shown}"
        )


def check_fleet(cfg: Config) -> None:
    """The ``[fleet]`` keys against the others (remote actors feed a replay learner, each
    stepping its environments together); raises ConfigError."""
    fleet = cfg.fleet
    if not fleet.actors:
        return
    parse_resource(fleet.resource)
    if cfg.perf.autotune:
        raise ConfigError(
            "perf.autotune measures actors beside the learner; with fleet.actors set "
            "env.num_envs (each remote actor's environments) yourself"
        )
    info = learner_info(cfg.agent.algo)
    if info.remote is RemoteActors.NONE:
        able = " or ".join(n for n, i in LEARNERS.items() if i.remote is not RemoteActors.NONE)
        raise ConfigError(
            f"fleet.actors needs a learner remote actors can feed (agent.algo={able}): remote "
            f"actors for agent.algo={cfg.agent.algo} are not built yet"
        )
    if cfg.env.batch_size > 0:
        raise ConfigError(
            "env.batch_size (ALE's async mode) is for actors beside the learner; remote "
            "actors step their environments together: set env.batch_size to 0 or -1"
        )
