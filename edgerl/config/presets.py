"""What depends on the game and the learner: values for the keys nobody set (presets), and the
checks across keys, made once presets are applied."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgerl.config import MAX_HIDDEN, Config, Layer, with_values
from edgerl.config.fleet import fleet_envs, parse_resource
from edgerl.config.learners import learner_info
from edgerl.errors import ConfigError

# Values for keys nobody set, by observation kind. "frames" are the field defaults above, so that a
# bare `edgerl train` (Pong) needs no preset; "vector" is for small control tasks like CartPole,
# tuned so that `edgerl train --env CartPole-v1 --steps 60000` solves it on two CPU cores.
PRESETS: dict[str, dict[str, Any]] = {
    "frames": {},
    # Mapped from RL Zoo's CartPole DQN (lr 2.3e-3, half an update per step, target every 128
    # updates, short exploration), plus a learning rate annealed to almost zero: with a constant
    # rate the greedy policy often collapsed in the last steps. With these, CartPole-v1 scored
    # 500/500 greedy on seeds 0-4 after 60,000 steps; a 128-wide MLP failed 3 seeds of 3.
    "vector": {
        "env.num_envs": 1,
        "agent.lr": 2.3e-3,
        "agent.lr_end": 1e-5,
        "agent.batch_size": 64,
        "agent.train_freq": 2,
        "agent.target_update": 256,
        "agent.learning_starts": 1_000,
        "agent.eps_end": 0.04,
        "agent.eps_decay_steps": 8_000,
        "replay.capacity": 50_000,
        "train.steps": 100_000,
        # A small MLP's update is shorter than Python's thread switching: one loop is faster.
        "perf.pipeline": "sync",
    },
}


@dataclass(frozen=True)
class NamedPreset:
    """A recipe a user picks by name (``--preset NAME``): a game, a learner and the settings
    measured to learn it on one class of machine."""

    summary: str  # one line for --help and the docs
    values: Mapping[str, Any]
    gpu: bool = False  # measured on a CUDA GPU: training refuses it where none is usable


# --preset NAME: over the config files, under --set and the command line's own flags. Each one's
# measured run is in docs/results.md, with its files under docs/runs/.
NAMED_PRESETS: dict[str, NamedPreset] = {
    # pong-cpu's recipe for any Atari game (--env ALE/<Game>-v5): what is set per machine class
    # and per short run, nothing per game (docs/training.md, "Any Atari game").
    "atari-cpu": NamedPreset(
        "Any Atari game (--env) with PQN on a CPU of two cores, sticky actions off: pong-cpu's "
        "recipe",
        {
            "agent.algo": "pqn",
            "env.repeat_action_probability": 0.0,
            "train.steps": 2_000_000,
            "agent.eps_decay_steps": 250_000,
            "eval.every_steps": 100_000,
            "eval.episodes": 10,
        },
    ),
    "pong-cpu": NamedPreset(
        "Pong with PQN on a CPU of two cores, sticky actions off: greedy 18+ within an hour",
        {
            "env.id": "ALE/Pong-v5",
            "agent.algo": "pqn",
            "env.repeat_action_probability": 0.0,
            "train.steps": 2_000_000,
            "agent.eps_decay_steps": 250_000,
            "eval.every_steps": 100_000,
            "eval.episodes": 10,
        },
    ),
    # The same recipe on a desktop GPU with 16 CPU cores (about 8,000 env steps/s on an H200 in
    # the plain loop; 18,000 with the lagged pipeline and the graphed update: 18+ at 1 min 16 s,
    # docs/results.md): evaluations every 500,000 steps, since ten good Pong episodes took 15-68 s
    # of CPU beside training (they run on the GPU now). bf16 as in the measured run (perf.amp=auto
    # chose it then): an fp32 run of the same settings was 1.19x as fast but at 13.7 at step
    # 1,500,032 (one run each).
    "pong-gpu": NamedPreset(
        "Pong with PQN on a desktop GPU with 16 CPU cores: greedy 18+ within 2 minutes",
        {
            "env.id": "ALE/Pong-v5",
            "agent.algo": "pqn",
            "env.repeat_action_probability": 0.0,
            "train.steps": 2_000_000,
            "agent.eps_decay_steps": 250_000,
            "eval.every_steps": 500_000,
            "eval.episodes": 10,
            "perf.amp": "bf16",
        },
        gpu=True,
    ),
    # DQN's recipe on a desktop GPU, measured on an H100 with 16 cores (docs/runs/pong-h100-dqn):
    # the CPU hour's n-step returns and exploration, 32 environments in ALE's async batches, the
    # learner on its own thread, and 128 samples every 16 env steps (the replay ratio of 32 every
    # 4 in a quarter of the updates: at batch 32 the update is a few hundred tiny kernels, 0.75
    # ms each, which capped the loop at 5,300 env steps/s; at 128 the limit is 14,500).
    "pong-gpu-dqn": NamedPreset(
        "Pong with DQN on a desktop GPU with 16 CPU cores: greedy 18+ within 2 minutes",
        {
            "env.id": "ALE/Pong-v5",
            "agent.algo": "dqn",
            "env.num_envs": 32,
            "env.repeat_action_probability": 0.0,
            "agent.n_step": 3,
            "agent.batch_size": 128,
            "agent.train_freq": 16,
            "agent.lr": 2e-4,
            "agent.eps_decay_steps": 100_000,
            "agent.learning_starts": 10_000,
            "replay.capacity": 100_000,
            "perf.pipeline": "async",
            "perf.max_ahead": 64,
            "train.steps": 2_000_000,
            "eval.every_steps": 100_000,
            "eval.episodes": 10,
        },
        gpu=True,
    ),
}


def named_preset_layer(name: str) -> Layer:
    """The settings of ``--preset name`` as a config layer; raises ConfigError for a name
    that is not one of :data:`NAMED_PRESETS`."""
    if name not in NAMED_PRESETS:
        raise ConfigError(
            f"unknown preset {name!r}; the presets are: {', '.join(sorted(NAMED_PRESETS))}"
        )
    return Layer(f"--preset {name}", dict(NAMED_PRESETS[name].values))


def check_preset_device(name: str, cuda_usable: bool) -> None:
    """Raises ConfigError when preset ``name`` was measured on a CUDA GPU and none is usable."""
    if NAMED_PRESETS[name].gpu and not cuda_usable:
        cpu_presets = sorted(n for n, p in NAMED_PRESETS.items() if not p.gpu)
        raise ConfigError(
            f"--preset {name} is a recipe for a CUDA GPU and none is usable here; on a CPU "
            f"use --preset {' or --preset '.join(cpu_presets)}"
        )


def apply_presets(cfg: Config, obs_kind: str) -> Config:
    """Fill the keys nobody set with the preset for ``obs_kind`` ("frames" or "vector") and
    the learner ``agent.algo`` names."""
    preset = {**PRESETS[obs_kind], **learner_info(cfg.agent.algo).presets.get(obs_kind, {})}
    return with_values(cfg, {k: v for k, v in preset.items() if k not in cfg.explicit})


def check_consistency(cfg: Config) -> None:
    """Cross-key checks, after presets; raises ConfigError with the keys to change."""
    a, r = cfg.agent, cfg.replay
    if a.eps_end > a.eps_start:
        raise ConfigError(
            f"agent.eps_end ({a.eps_end}) must not exceed agent.eps_start ({a.eps_start})"
        )
    if a.batch_size > r.capacity:
        raise ConfigError(
            f"agent.batch_size ({a.batch_size}) must not exceed replay.capacity ({r.capacity})"
        )
    check_fleet(cfg)
    if r.capacity < cfg.env.num_envs * 16:
        # Fewer environments first: a replay raised to fit 100,000 of them would not fit memory.
        raise ConfigError(
            f"replay.capacity ({r.capacity:,}) must hold at least 16 steps per environment "
            f"(env.num_envs={cfg.env.num_envs:,}): lower env.num_envs to "
            f"{max(r.capacity // 16, 1):,} or less, or raise replay.capacity to "
            f"{cfg.env.num_envs * 16:,} or more"
        )
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
    if not learner_info(cfg.agent.algo).remote_actors:
        raise ConfigError(
            f"fleet.actors needs a replay learner (agent.algo=dqn): remote actors feeding "
            f"agent.algo={cfg.agent.algo}'s rollouts are not built yet"
        )
    if cfg.env.batch_size > 0:
        raise ConfigError(
            "env.batch_size (ALE's async mode) is for actors beside the learner; remote "
            "actors step their environments together: set env.batch_size to 0 or -1"
        )
    total = fleet_envs(cfg)
    if cfg.replay.capacity < total * 16:
        raise ConfigError(
            f"replay.capacity ({cfg.replay.capacity:,}) must hold at least 16 steps per "
            f"environment of the fleet ({fleet.actors} actors x env.num_envs="
            f"{cfg.env.num_envs} = {total:,}): raise it to {total * 16:,} or more"
        )
