"""Values for the keys nobody set: by the game's kind of observations (:data:`PRESETS`, with the
learner's own from its registry line in :mod:`edgerl.config.learners`), ``--quick``'s
(:data:`QUICK`) and the recipes a user picks by name (:data:`NAMED_PRESETS`, ``--preset``). The
checks across keys, made once presets are applied, are :mod:`edgerl.config.checks`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgerl.config import Config, Layer, with_values
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


# --quick's values (edgerl.report.quick picks the game by the device), by observation kind: 60,000
# steps solve CartPole with its preset (PRESETS["vector"], seeds 0-4); for frames, the "Pong
# against the clock" settings of docs/performance.md (an H100 went from -21 to -14 in 407,736
# steps, 9 minutes): one update per step, short exploration, sticky actions off.
QUICK: dict[str, dict[str, Any]] = {
    "vector": {"train.steps": 60_000},
    "frames": {
        "train.steps": 500_000,
        "env.num_envs": 8,
        "env.repeat_action_probability": 0.0,
        "agent.train_freq": 1,
        "agent.lr": 1e-4,
        "agent.target_update": 1_000,
        "agent.learning_starts": 10_000,
        "agent.eps_decay_steps": 100_000,
        "agent.eps_end": 0.01,
        "replay.capacity": 100_000,
    },
}


@dataclass(frozen=True)
class NamedPreset:
    """A recipe a user picks by name (``--preset NAME``): a game, a learner and the settings
    measured to learn it on one class of machine."""

    summary: str  # one line for --help and the docs
    values: Mapping[str, Any]
    gpu: bool = False  # measured on a CUDA GPU: training refuses it where none is usable
    obs_kind: str = "frames"  # its game's observations, whose presets go under it
    continuous: bool = False  # its game's actions are numbers

    def config(self, cfg: Config) -> Config:
        """``cfg`` (the preset's layer resolved) with the presets of its game's kind under it,
        as training fills them in: what the preset trains without its game being probed."""
        return apply_presets(cfg, self.obs_kind, self.continuous)


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
        "Pong with PQN on a CPU of two cores, sticky actions off: greedy 18+ within an hour on "
        "a 2-core Intel Xeon",
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
    # pong-gpu's recipe for a Jetson's integrated GPU, not measured on one (no Jetson here): PQN
    # on the GPU in the lagged pipeline, with the precision PyTorch's checks choose there
    # (perf.amp auto: bf16 on Orin and Thor, fp16 or fp32 on older boards, as `edgerl doctor`
    # says). The service picks it on a Jetson, with env.num_envs by the board's memory
    # (edgerl.hw.recipe).
    "pong-jetson": NamedPreset(
        "Pong with PQN on a Jetson's integrated GPU: pong-gpu's recipe, estimated, not measured "
        "on a board",
        {
            "env.id": "ALE/Pong-v5",
            "agent.algo": "pqn",
            "env.repeat_action_probability": 0.0,
            "train.steps": 2_000_000,
            "agent.eps_decay_steps": 250_000,
            "eval.every_steps": 250_000,
            "eval.episodes": 10,
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
    # DQN's recipe on two CPU cores, as the runs on record trained it (docs/runs/
    # pong-cpu-2core-dqn-epyc: 18+ at 500,000 env steps, 67 min on a 2-core AMD EPYC): n-step
    # returns, 4 environments, one batch of 32 every 4 env steps. Fewer env steps to 18 than PQN's
    # 1.2M but 4 times the gradient work per step: the calibration weighs the two on a machine.
    "pong-cpu-dqn": NamedPreset(
        "Pong with DQN on a CPU: fewer env steps to 18 than pong-cpu, each costing more",
        {
            "env.id": "ALE/Pong-v5",
            "agent.algo": "dqn",
            "env.num_envs": 4,
            "env.repeat_action_probability": 0.0,
            "agent.n_step": 3,
            "agent.batch_size": 32,
            "agent.train_freq": 4,
            "agent.lr": 1e-4,
            "agent.eps_decay_steps": 100_000,
            "agent.learning_starts": 10_000,
            "replay.capacity": 100_000,
            "train.steps": 2_000_000,
            "eval.every_steps": 100_000,
            "eval.episodes": 10,
        },
    ),
    # Continuous control on two CPU cores: SAC with its preset (CleanRL's settings: one
    # environment, 256x256 networks, one update a step after 5,000 random ones, evaluations every
    # 5,000 steps) for 300,000 steps, as the seeds of docs/runs/halfcheetah-sac-seeds trained
    # (they ran two at a time, one torch thread each: perf.threads=1, not part of the recipe).
    "halfcheetah-cpu": NamedPreset(
        "HalfCheetah-v5 with SAC on a CPU of two cores (the mujoco extra): gymnasium's 4,800 "
        "within half an hour",
        {
            "env.id": "HalfCheetah-v5",
            "agent.algo": "sac",
            "train.steps": 300_000,
        },
        obs_kind="vector",
        continuous=True,
    ),
}


# The recipe README leads with (two CPU cores): `edgerl bench` measures its learner unless told
# another (--preset, --set agent.algo or a config file).
FIRST_RECIPE = "pong-cpu"


# --preset board: the recipe of NAMED_PRESETS this machine trains fastest (edgerl.run.calibrate,
# which measures the machine; the service uses it when its config chooses no learner).
BOARD_PRESET = "board"


def named_preset_layer(name: str) -> Layer:
    """The settings of ``--preset name`` as a config layer (naming itself in
    ``train.recipe``); raises ConfigError for a name that is not one of :data:`NAMED_PRESETS`
    (``board``: :func:`edgerl.run.calibrate.calibrated_layer`)."""
    if name not in NAMED_PRESETS:
        choices = ", ".join(sorted([*NAMED_PRESETS, BOARD_PRESET]))
        raise ConfigError(f"unknown preset {name!r}; the presets are: {choices}")
    values = {**NAMED_PRESETS[name].values, "train.recipe": f"{name} (--preset {name})"}
    return Layer(f"--preset {name}", values)


# The learner a game of continuous actions trains when no one names one, by observation kind: the
# others but PPO pick one of a few actions; SAC learns Pendulum within 20,000 steps
# (docs/results.md) but only from vectors, and PPO's Gaussian head learns from frames too.
CONTINUOUS_LEARNERS = {"vector": "sac", "frames": "ppo"}


def apply_presets(cfg: Config, obs_kind: str, continuous: bool = False) -> Config:
    """Fill the keys nobody set with the preset for ``obs_kind`` ("frames" or "vector") and
    the learner ``agent.algo`` names; for a game of ``continuous`` actions, the learner is
    :data:`CONTINUOUS_LEARNERS`' for its observations unless one is named, and its presets for
    "continuous" go on top."""
    if continuous and "agent.algo" not in cfg.explicit:
        cfg = with_values(cfg, {"agent.algo": CONTINUOUS_LEARNERS[obs_kind]})
    presets = learner_info(cfg.agent.algo).presets
    preset = {**PRESETS[obs_kind], **presets.get(obs_kind, {})}
    if continuous:
        preset.update(presets.get("continuous", {}))
    return with_values(cfg, {k: v for k, v in preset.items() if k not in cfg.explicit})
