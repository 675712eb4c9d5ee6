"""The config's sections, one dataclass each, with every key's default, help and bounds
(the fleet's is :mod:`edgerl.config.fleet`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgerl.config.fields import setting
from edgerl.config.learners import LEARNERS

# Upper bounds: every number a config accepts is one training can use (ALE takes int32 seeds and
# thread counts; a step count of 10^12 is decades of training at 1,000 steps/s).
MAX_STEPS = 10**12
MAX_SEED = 2**31 - 1
MAX_ENVS = 1_000_000  # far beyond memory: the memory checks say what fits
MAX_THREADS = 1024
MAX_SECONDS = 10**7  # about 115 days
MAX_HIDDEN = 65_536  # widest hidden layer


@dataclass
class EnvConfig:
    id: str = setting(
        "ALE/Pong-v5", "Gymnasium id: ALE/<Game>-v5 (Atari) or any discrete-action id"
    )
    num_envs: int = setting(
        4, "environments stepped in parallel (ALE's C++ thread pool)", min=1, max=MAX_ENVS
    )
    seed: int = setting(
        0, "seed for environments, networks, exploration and replay", min=0, max=MAX_SEED
    )
    threads: int = setting(
        0, "ALE emulator threads (0: one per environment, up to the CPUs)", min=0, max=MAX_THREADS
    )
    pin_threads: str = setting(
        "auto",
        "Atari: keep ALE's threads off the first CPU, for the Python loop: on, off, or auto (on "
        "with an integrated GPU, a Jetson's, whose cores are the emulators' and the loop's)",
        choices=("auto", "on", "off"),
    )
    batch_size: int = setting(
        -1,
        "Atari: act on the first batch_size environments to finish a step while the others "
        "emulate (ALE's async mode; not deterministic); 0: all environments in lockstep "
        "(deterministic); -1: auto, half the environments where a GPU learner does not need them "
        "in lockstep (a replay, the genetic algorithm; 8 environments or more), else 0",
        min=-1,
        max=MAX_ENVS,
    )
    repeat_action_probability: float = setting(
        0.25, "sticky actions, as in ALE v5 (0 for the original DQN setting)", min=0.0, max=1.0
    )
    noop_max: int = setting(30, "random no-ops at episode start (Atari)", min=0, max=1000)
    max_episode_frames: int = setting(
        108_000, "emulator frames before an Atari episode is cut", min=1, max=1_000_000_000
    )
    make_kwargs: dict[str, Any] = setting(  # noqa: RUF009 (setting() copies a table per config)
        {},
        "a gymnasium id's keyword arguments for gymnasium.make, a TOML table: "
        "{continuous = false} gives CarRacing-v3 the discrete actions DQN needs",
    )


@dataclass
class AgentConfig:
    algo: str = setting(
        "dqn",
        "the learner: dqn (Double DQN with a replay memory), pqn (Q(lambda) without one: "
        "for boards with little memory; its keys are in [pqn]), ppo (proximal policy "
        "optimisation, a policy that samples its actions; its keys are in [ppo]), sac (soft "
        "actor-critic, for games whose actions are numbers; its keys are in [sac]) or ga (a "
        "genetic algorithm, forward passes only; its keys are in [ga])",
        choices=LEARNERS.keys(),  # a view: a learner registered later is a choice too
    )
    lr: float = setting(1e-4, "Adam learning rate", min=0.0, max=1.0)
    lr_end: float = setting(
        -1.0, "learning rate at the last step, linearly annealed (-1: constant)", min=-1.0, max=1.0
    )
    gamma: float = setting(0.99, "discount factor", min=0.0, max=1.0)
    n_step: int = setting(
        1,
        "transitions summed into each target (multi-step returns, as Rainbow's 3); episode "
        "ends cut it short",
        min=1,
        max=20,
    )
    batch_size: int = setting(32, "transitions per gradient update", min=1, max=65_536)
    train_freq: int = setting(
        4, "env steps per gradient update, counted over all envs", min=1, max=MAX_STEPS
    )
    target_update: int = setting(
        1000, "env steps between target-network syncs", min=1, max=MAX_STEPS
    )
    learning_starts: int = setting(
        20_000, "env steps of experience before learning starts", min=0, max=MAX_STEPS
    )
    eps_start: float = setting(1.0, "exploration epsilon at step 0", min=0.0, max=1.0)
    eps_end: float = setting(0.01, "exploration epsilon after the decay", min=0.0, max=1.0)
    eps_decay_steps: int = setting(
        250_000, "env steps of linear epsilon decay", min=1, max=MAX_STEPS
    )
    double: bool = setting(True, "Double DQN targets (online net picks, target net values)")
    grad_clip: float = setting(10.0, "max gradient norm (0: no clipping)", min=0.0, max=1e6)
    adam_eps: float = setting(
        1e-8, "Adam's epsilon (Rainbow and Dopamine use 1.5e-4 with lr 6.25e-5)", min=1e-12, max=1.0
    )
    hidden: tuple[int, ...] = setting((256, 256), "hidden layer widths of the MLP (vector obs)")


@dataclass
class ReplayConfig:
    capacity: int = setting(
        200_000, "transitions kept (about 7 KB each for Atari frames)", min=1, max=MAX_STEPS
    )
    device: str = setting(
        "auto",
        "where replay lives: auto (the learner's device), cpu, cuda",
        choices=("auto", "cpu", "cuda"),
    )
    persist: bool = setting(
        True,
        "save the replay with each checkpoint (only what changed) and resume with it",
    )


@dataclass
class PQNConfig:
    rollout_steps: int = setting(
        32, "vector steps of every environment per rollout, learned from at once", min=1, max=10_000
    )
    lam: float = setting(
        0.65,
        "Q(lambda)'s lambda: how much of the longer returns goes into each target",
        min=0.0,
        max=1.0,
    )
    epochs: int = setting(2, "passes over each rollout", min=1, max=100)
    minibatches: int = setting(32, "minibatches per pass", min=1, max=100_000)


@dataclass
class PPOConfig:
    rollout_steps: int = setting(
        128,
        "vector steps of every environment per rollout, learned from at once",
        min=1,
        max=10_000,
    )
    lam: float = setting(
        0.95,
        "GAE's lambda: how much of the longer returns goes into each advantage",
        min=0.0,
        max=1.0,
    )
    epochs: int = setting(4, "passes over each rollout", min=1, max=100)
    minibatches: int = setting(4, "minibatches per pass", min=1, max=100_000)
    clip: float = setting(
        0.1,
        "how far a pass may move an action's probability ratio from 1 (the clip range)",
        min=0.0,
        max=10.0,
    )
    vf_coef: float = setting(0.5, "the value loss's weight beside the policy's", min=0.0, max=100.0)
    ent_coef: float = setting(
        0.01,
        "the entropy bonus's weight: how much the policy is kept from certainty",
        min=0.0,
        max=10.0,
    )
    anneal_steps: int = setting(
        0,
        "env steps over which the learning rate goes from agent.lr to agent.lr_end (0: "
        "train.steps; CleanRL's ppo_atari.py anneals over its 10,000,000)",
        min=0,
        max=MAX_STEPS,
    )
    clip_value: bool = setting(
        False,
        "clip the value loss as CleanRL's clip_vloss: the larger of the value's error and that "
        "of the value kept within ppo.clip of the one noted as it acted",
    )
    orthogonal_init: bool = setting(
        False,
        "start from orthogonal weights as CleanRL's layer_init: gain sqrt(2) for hidden layers, "
        "0.01 for the policy's output, 1 for the value's, biases 0",
    )
    normalize_obs: bool = setting(
        True,
        "a continuous game's observations normalised by running statistics the policy keeps "
        "(and clipped to +-10), as CleanRL's ppo_continuous_action.py (vectors: frames are "
        "only scaled)",
    )
    normalize_rewards: bool = setting(
        True,
        "a continuous game's rewards divided by the running standard deviation of each "
        "environment's discounted return (and clipped to +-10), as CleanRL's "
        "ppo_continuous_action.py",
    )


@dataclass
class SACConfig:
    q_lr: float = setting(
        1e-3,
        "the critics' and the temperature's Adam learning rate (the policy's is agent.lr)",
        min=0.0,
        max=1.0,
    )
    tau: float = setting(
        0.005,
        "how far the target critics move towards the critics after each update",
        min=0.0,
        max=1.0,
    )
    policy_frequency: int = setting(
        2,
        "critic updates between the policy's, which then makes this many updates at once "
        "(TD3's delay, as CleanRL's sac_continuous_action.py)",
        min=1,
        max=1_000,
    )
    alpha: float = setting(
        0.2,
        "the entropy's temperature at the start (fixed where sac.autotune is off)",
        min=1e-8,
        max=1e4,
    )
    autotune: bool = setting(
        True, "tune the temperature towards a target entropy of minus the action's numbers"
    )


@dataclass
class GAConfig:
    population: int = setting(
        1000,
        "networks in each generation, one episode each at least (the paper's Atari 1,000)",
        min=2,
        max=1_000_000,
    )
    truncation: int = setting(
        20,
        "the best members of a generation that parent the next (truncation selection)",
        min=1,
        max=1_000_000,
    )
    sigma: float = setting(
        0.002,
        "mutation power: the Gaussian noise's standard deviation added to a parent",
        min=0.0,
        max=10.0,
    )
    elite_candidates: int = setting(
        10,
        "the best members played again to choose the elite, which passes unchanged",
        min=1,
        max=1_000,
    )
    elite_episodes: int = setting(
        30,
        "episodes each elite candidate plays (0: the elite is the best single episode)",
        min=0,
        max=10_000,
    )


@dataclass
class TrainConfig:
    steps: int = setting(
        10_000_000,
        "total env steps of the run (a total: resuming continues to it)",
        min=1,
        max=MAX_STEPS,
    )
    run_dir: str = setting("", "run directory (empty: runs/<env name>)")
    checkpoint_every_s: float = setting(
        300.0, "seconds between checkpoints", min=1.0, max=MAX_SECONDS
    )
    keep_checkpoints: int = setting(3, "newest checkpoints kept", min=1, max=1000)
    final_checkpoint_retry_s: float = setting(
        60.0,
        "seconds the last checkpoint is retried (disk full) before the run exits non-zero",
        min=0.0,
        max=MAX_SECONDS,
    )
    log_every_s: float = setting(
        5.0, "seconds between metrics.csv rows", min=0.1, max=MAX_SECONDS, live=True
    )
    tensorboard: bool = setting(False, "also write TensorBoard events (needs edgerl[tensorboard])")
    recipe: str = setting(
        "",
        "the named recipe these settings came from and why (--preset, or the service's choice "
        "for this machine); shown by status, changes nothing",
    )


@dataclass
class DisplayConfig:
    enabled: bool = setting(True, "publish frames for `edgerl view`", live=True)
    every: int = setting(
        3, "publish every Nth env step (DeepMind's display_freq)", min=1, max=MAX_STEPS, live=True
    )
    env_index: int = setting(0, "which environment is shown", min=0, max=MAX_ENVS)
    group: str = setting("edgerl", "group that may read the frame stream when training as root")


@dataclass
class HwConfig:
    max_clocks: bool = setting(
        False, "run at maximum clocks (jetson_clocks) and restore afterwards"
    )
    nvpmodel: str = setting("", "power mode (id or name in /etc/nvpmodel.conf) while training")
    monitor: bool = setting(True, "sample CPU/GPU load while training (load.csv, tegrastats.log)")
    monitor_interval_ms: int = setting(
        1000, "load sampling interval", min=50, max=3_600_000, live=True
    )
    jetson_clocks: str = setting("jetson_clocks", "jetson_clocks command (looked up on PATH)")
    tegrastats: str = setting("tegrastats", "tegrastats command (looked up on PATH)")
    nvpmodel_cmd: str = setting("nvpmodel", "nvpmodel command (looked up on PATH)")
    state_dir: str = setting(
        "", "clock state (empty: /run/edgerl-clocks as root, else ~/.local/state/edgerl)"
    )
    calibrate: bool = setting(
        True,
        "--preset board and the service measure this machine's recipes at their first start "
        "(remembered) and train the one with the least predicted time to its target, among "
        "those with 3 runs on record reaching it (else the class's recipe); false: "
        "the class's recipe, unmeasured",
    )


@dataclass
class PerfConfig:
    device: str = setting(
        "auto", "compute device: auto (CUDA if usable), cpu, cuda", choices=("auto", "cpu", "cuda")
    )
    threads: int = setting(
        0,
        "PyTorch CPU threads (0: auto, the CPUs the load leaves free, at most PyTorch's own)",
        min=0,
        max=MAX_THREADS,
    )
    pipeline: str = setting(
        "auto",
        "async: learner thread beside the actor; sync: one loop; auto: async when the "
        "learner is on a GPU, sync on the CPU (where the learner already uses every core)",
        choices=("auto", "async", "sync"),
    )
    max_policy_lag: int = setting(
        4,
        "updates behind the learner's at which the actor's weights are refreshed",
        min=1,
        max=1000,
    )
    max_ahead: int = setting(
        8, "updates the actor may run ahead of the learner (x train_freq)", min=1, max=1000
    )
    updates_per_launch: int = setting(
        0,
        "updates per launch of the learner's CUDA graph, each on a batch it samples on the GPU "
        "(0: auto, 4 where the graph samples, else 1)",
        min=0,
        max=64,
    )
    amp: str = setting(
        "auto",
        "mixed precision: auto (on a Jetson bf16 from Orin, fp16 before; off on "
        "discrete GPUs and CPUs), off, fp16, bf16 (on a CPU too where it does bf16 in "
        "hardware: AMX or AVX-512 BF16)",
        choices=("auto", "off", "fp16", "bf16"),
    )
    cuda_graphs: str = setting(
        "auto", "capture the update as a CUDA graph: auto, on, off", choices=("auto", "on", "off")
    )
    compile: str = setting(
        "auto",
        "torch.compile the update on the CPU: auto (tried for long runs, kept only if it "
        "measurably repays its compile time), on, off",
        choices=("auto", "on", "off"),
    )
    autotune: bool = setting(False, "measure at start and pick env.num_envs and env.threads")
    balance: str = setting(
        "auto",
        "while training, move what can change live (PyTorch's CPU threads, the async actor's "
        "lead) in small steps kept only where steps/s improves, give up threads to other "
        "programs' load, and move the learner's epochs among the values runs on record reached "
        "the target with, toward the least predicted time: auto (on, except with "
        "perf.deterministic), off",
        choices=("auto", "off"),
    )
    balance_every_s: float = setting(
        20.0, "seconds between the balancer's measurements (GA3C's 20)", min=2.0, max=3600.0
    )
    deterministic: bool = setting(
        False,
        "seeded runs repeat bit for bit on the same machine: the balancer holds still, PyTorch "
        "threads are fixed (perf.threads, else 1), deterministic kernels, and a replay learner "
        "learns in the actor's loop (sync)",
    )


@dataclass
class EvalConfig:
    every_steps: int = setting(
        -1,
        "env steps between greedy evaluations (eval.csv); 0: off; -1: auto, every twentieth "
        "of train.steps (rounded down to thousands) for runs of 50,000 steps or more, else off",
        min=-1,
        max=MAX_STEPS,
    )
    episodes: int = setting(5, "episodes per evaluation", min=1, max=1_000_000)
    epsilon: float = setting(
        0.001,
        "random-action probability while evaluating: not 0, so that a policy that never "
        "presses FIRE after a lost life cannot idle to the step cap (as Dopamine's 0.001)",
        min=0.0,
        max=1.0,
    )
    max_episode_steps: int = setting(
        27_000,
        "agent steps before an evaluation episode is cut (counted in eval.csv's cut column; "
        "27,000 is the 108,000 frames Atari cuts at)",
        min=1,
        max=1_000_000_000,
    )
    record: int = setting(
        0,
        "record the first episode of every Nth evaluation as a colour GIF in "
        "<run_dir>/recordings/eval-step-<step>.gif (0: never; needs the record extra)",
        min=0,
        max=1_000_000,
    )


@dataclass
class LogConfig:
    level: str = setting(
        "info", "log level", choices=("debug", "info", "warning", "error"), live=True
    )
