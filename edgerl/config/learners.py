"""The learners edgerl knows, by the name ``agent.algo`` gives them, and what must be known of
each before PyTorch is imported: the module that holds it, what it learns from, how it may learn
beside the actor (its :class:`Schedule`), what a fleet's remote actors send it
(:class:`RemoteActors`), its presets and the settings its samples to target depend on.

No PyTorch here: the config reads the names and presets before PyTorch is imported. A new learner
is a module with its learner class and a ``KIND`` (:class:`edgerl.learners.kinds.LearnerKind`:
its network, acting policy, preparation and cost model) and one entry in :data:`LEARNERS`;
docs/development.md walks through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Schedule(Enum):
    """How a learner may learn on a thread of its own while the actor collects steps (the async
    pipeline; :mod:`edgerl.run.pipeline` maps each to its pipeline class)."""

    IN_LOOP = "in-loop"  # never: it learns in the actor's loop
    SAMPLES = "samples"  # it samples its replay while the actor writes it
    # It learns one rollout while the next is collected with weights one rollout old.
    ROLLOUT_LAG = "rollout-lag"

    @property
    def concurrent(self) -> bool:
        """Whether it may learn beside the actor at all."""
        return self is not Schedule.IN_LOOP

    @property
    def timing_decides_samples(self) -> bool:
        """Whether, beside the actor, what it learns from depends on the threads' timing (a
        replay sampled while written), so that a run that must repeat learns in the loop."""
        return self is Schedule.SAMPLES


class RemoteActors(Enum):
    """What a fleet's remote actors send a learner (:mod:`edgerl.fleet` maps each to its
    transport)."""

    NONE = "none"  # it takes no remote actors
    STEPS = "steps"  # batches of steps for its memory (edgerl.run.remote)
    MEMBERS = "members"  # the scores of its members' episodes, played from their seeds


# What each kind of memory (edgerl.memories.kinds.MEMORY_KINDS) is made from besides the
# environments, for LearnerInfo.memory_reads: the keys of a section of its own (a replay's
# [replay]), its learner's rollout_key (a rollout's length), or none of either (the episodes'
# scores). A learner never reads the keys its memory is not made from.
MEMORY_SECTIONS: dict[str, str] = {"replay": "replay"}
# The keys of [agent] that only a learner exploring by epsilon reads (its explores_by_epsilon).
EPSILON_KEYS = ("agent.eps_start", "agent.eps_end", "agent.eps_decay_steps")
ROLLOUT_MEMORIES = frozenset({"rollout"})
PLAIN_MEMORIES = frozenset({"episodes"})


@dataclass(frozen=True)
class LearnerInfo:
    """What edgerl needs to know of a learner besides its code."""

    module: str  # the module whose KIND (edgerl.learners.kinds.LearnerKind) makes the learner
    # Its memory's kind, a name of edgerl.memories.kinds.MEMORY_KINDS: "replay" (sampled again
    # and again), "rollout" (the last steps, in order), "episodes" (episodes' scores).
    memory: str
    schedule: Schedule  # how it may learn beside the actor
    # A rollout learner's: the key of its rollout's length (PQN's, unless it has its own).
    rollout_key: str = "pqn.rollout_steps"
    remote: RemoteActors = RemoteActors.NONE  # what a fleet's remote actors send it
    # Settings it trains with unless set, by observation kind ("frames", "vector"), on top of
    # edgerl.config.presets.PRESETS; "continuous" goes on top for a game of continuous actions.
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The settings that decide how many env steps it needs to reach a score (its samples to
    # target, edgerl.config.targets): a run on record speaks for a config where these agree.
    sample_keys: tuple[str, ...] = ()
    # The one of its sample_keys that sets how much it learns from each env step (PQN's epochs
    # over each rollout), which the learning balance (edgerl.report.balance) may move while it
    # trains, among the values the runs on record reached the target with; "" for none. The
    # learner then has ``set_ratio(value)``, and its checkpoints keep the value it learns at.
    ratio_key: str = ""
    # Settings a resumed run must keep besides env.id and agent.hidden: its checkpoints hold
    # state made under them (PPO's observation statistics and reward scale).
    resume_keys: tuple[str, ...] = ()
    # It explores by epsilon (agent.eps_*: its learner's ``epsilon(step)`` is the chance of a
    # random action; the progress line and status.json show it); else its exploration is its
    # own (a policy's noise, sampled actions, members played greedily), no epsilon is shown,
    # and a --set of agent.eps_* is refused as a key it never reads.
    explores_by_epsilon: bool = False

    @property
    def concurrent(self) -> bool:
        """Whether it may learn beside the actor at all (the async pipeline)."""
        return self.schedule.concurrent

    def memory_reads(self, key: str) -> bool:
        """Whether its memory is made from ``key`` (``section.name``): a replay from the keys of
        ``[replay]``, a rollout from :attr:`rollout_key` (PQN's where it has none of its own),
        the episodes' scores from none of them. A kind of memory not named above may be made
        from any of them (none of them is refused as one it does not read)."""
        section = key.partition(".")[0]
        if self.memory in MEMORY_SECTIONS:
            return section == MEMORY_SECTIONS[self.memory]
        if self.memory in ROLLOUT_MEMORIES:
            return key == self.rollout_key
        if self.memory in PLAIN_MEMORIES:
            return False
        return key == self.rollout_key or section in MEMORY_SECTIONS.values()


# PQN's presets. Frames: the reference's Atari settings (purejaxql's pqn_atari.yaml): 128
# environments, rollouts of 32 steps, 2 epochs of 32 minibatches, lr 2.5e-4, lambda 0.65 (the
# [pqn] defaults), exploration over the first tenth of the default 10M steps; the learning rate is
# annealed to 0 as CleanRL's pqn_atari_envpool.py does, and exploration ends at 0.01 as there.
# How edgerl differs from the reference, and why: docs/training.md. Vector: CartPole-sized,
# measured in edgerl's suite.
PQN_PRESETS: dict[str, dict[str, Any]] = {
    "frames": {
        "env.num_envs": 128,
        "agent.lr": 2.5e-4,
        "agent.lr_end": 0.0,
        "agent.eps_end": 0.01,
        "agent.eps_decay_steps": 1_000_000,
    },
    "vector": {
        "env.num_envs": 32,
        "agent.lr": 1e-3,
        "agent.lr_end": 0.0,
        "agent.eps_end": 0.05,
        "agent.eps_decay_steps": 50_000,
        "pqn.rollout_steps": 16,
        "pqn.lam": 0.9,
        "pqn.epochs": 4,
        "pqn.minibatches": 4,
        "train.steps": 500_000,
        "perf.pipeline": "sync",
    },
}

# The genetic algorithm's presets. Frames: the paper's Atari settings are the [ga] defaults
# (population 1,000, truncation 20, sigma 0.002, 10 candidates over 30 episodes); episodes are cut
# at 20,000 frames as there, and 64 environments play members side by side. Vector: CartPole-sized,
# measured in edgerl's suite (docs/training.md).
GA_PRESETS: dict[str, dict[str, Any]] = {
    "frames": {"env.num_envs": 64, "env.max_episode_frames": 20_000, "train.steps": 50_000_000},
    "vector": {
        "env.num_envs": 16,
        "agent.hidden": (64, 64),
        "ga.population": 128,
        "ga.truncation": 12,
        "ga.sigma": 0.05,
        "ga.elite_candidates": 4,
        "ga.elite_episodes": 10,
        "train.steps": 300_000,
    },
}

# PPO's presets. Frames: CleanRL's ppo_atari.py (the [ppo] defaults: rollouts of 128 steps, 4
# epochs of 4 minibatches, lambda 0.95, clip 0.1, entropy 0.01) with 8 environments, Adam at
# lr 2.5e-4 annealed to 0 and the gradient clipped at norm 0.5. Vector: CleanRL's ppo.py for
# CartPole with 8 environments of 64 steps (a rollout of 512, as there), measured in edgerl's suite.
PPO_PRESETS: dict[str, dict[str, Any]] = {
    "frames": {
        "env.num_envs": 8,
        "agent.lr": 2.5e-4,
        "agent.lr_end": 0.0,
        "agent.grad_clip": 0.5,
        "agent.adam_eps": 1e-5,
        # CleanRL's defaults, off in [ppo] so that the runs on record before them repeat: the
        # value loss clipped (clip_vloss) and orthogonal initial weights (layer_init).
        "ppo.clip_value": True,
        "ppo.orthogonal_init": True,
    },
    "vector": {
        "env.num_envs": 8,
        "agent.lr": 2.5e-4,
        "agent.lr_end": 0.0,
        "agent.grad_clip": 0.5,
        "agent.adam_eps": 1e-5,
        "agent.hidden": (64, 64),
        "ppo.rollout_steps": 64,
        "ppo.clip": 0.2,
        "train.steps": 300_000,
        "perf.pipeline": "sync",
    },
    # A game of continuous actions (over "vector"): CleanRL's ppo_continuous_action.py (rollouts
    # of 2,048 steps, here 4 environments x 512; 10 epochs of 32 minibatches, lambda 0.95, clip
    # 0.2, no entropy bonus, lr 3e-4 annealed to 0, gradients clipped at 0.5, 64x64 tanh
    # networks with orthogonal weights, the value loss clipped, 1,000,000 steps). Pendulum-v1
    # with it: a greedy -121 at 170,000 steps (one run, 2 cores beside other work), against
    # about -700 with the CartPole settings above at 300,000.
    "continuous": {
        "env.num_envs": 4,
        "ppo.rollout_steps": 512,
        "ppo.epochs": 10,
        "ppo.minibatches": 32,
        "ppo.lam": 0.95,
        "ppo.clip": 0.2,
        "ppo.ent_coef": 0.0,
        "agent.lr": 3e-4,
        "ppo.clip_value": True,
        "ppo.orthogonal_init": True,
        "train.steps": 1_000_000,
    },
}

# SAC's presets, for continuous actions from vector observations (the only games it learns):
# CleanRL's sac_continuous_action.py: one environment, batches of 256 from a replay of 1,000,000,
# learning after 5,000 random steps, one critic update per env step, the policy at lr 3e-4 (the
# critics at sac.q_lr 1e-3), no gradient clipping; evaluations every 5,000 steps, as its tasks'
# runs are short (Pendulum-v1 learns within 20,000 steps).
SAC_PRESETS: dict[str, dict[str, Any]] = {
    "continuous": {
        "env.num_envs": 1,
        "agent.lr": 3e-4,
        "agent.batch_size": 256,
        "agent.train_freq": 1,
        "agent.learning_starts": 5_000,
        "agent.grad_clip": 0.0,
        "agent.hidden": (256, 256),
        "replay.capacity": 1_000_000,
        "train.steps": 1_000_000,
        "eval.every_steps": 5_000,
    },
}

# agent.algo -> the learner. A new learner: a module in edgerl/learners/ and a line here.
LEARNERS: dict[str, LearnerInfo] = {
    # DQN declares no ratio_key: every run on record trained at 8 samples per env step (batches
    # of 32 every 4 steps, 128 every 16), so no range is known to be safe; its updates owed
    # and its target network's period also count at one train_freq from the session's start.
    "dqn": LearnerInfo(
        "edgerl.learners.dqn",
        memory="replay",
        schedule=Schedule.SAMPLES,
        remote=RemoteActors.STEPS,
        explores_by_epsilon=True,
        sample_keys=(
            "env.num_envs",
            "agent.batch_size",
            "agent.train_freq",
            "agent.lr",
            "agent.target_update",
            "agent.eps_decay_steps",
            "agent.n_step",
            "agent.learning_starts",
            "replay.capacity",
            "agent.gamma",
            "agent.double",
            "agent.eps_end",
            "agent.lr_end",
        ),
    ),
    "pqn": LearnerInfo(
        "edgerl.learners.pqn",
        memory="rollout",
        schedule=Schedule.ROLLOUT_LAG,
        presets=PQN_PRESETS,
        ratio_key="pqn.epochs",
        explores_by_epsilon=True,
        sample_keys=(
            "env.num_envs",
            "pqn.rollout_steps",
            "pqn.epochs",
            "pqn.minibatches",
            "agent.lr",
            "agent.eps_decay_steps",
            "train.steps",  # the learning rate anneals over it
            "pqn.lam",
            "agent.gamma",
            "agent.eps_end",
            "agent.lr_end",
        ),
    ),
    "ppo": LearnerInfo(
        "edgerl.learners.ppo",
        memory="rollout",
        rollout_key="ppo.rollout_steps",
        schedule=Schedule.ROLLOUT_LAG,
        presets=PPO_PRESETS,
        resume_keys=("ppo.normalize_obs", "ppo.normalize_rewards"),
        sample_keys=(
            "env.num_envs",
            "ppo.rollout_steps",
            "ppo.epochs",
            "ppo.minibatches",
            "agent.lr",
            "train.steps",  # the learning rate anneals over it (ppo.anneal_steps 0)
            "ppo.anneal_steps",
            "ppo.lam",
            "ppo.clip",
            "ppo.ent_coef",
            "ppo.vf_coef",
            "ppo.clip_value",
            "ppo.orthogonal_init",
            "agent.gamma",
            "agent.lr_end",
        ),
    ),
    "sac": LearnerInfo(
        "edgerl.learners.sac",
        memory="replay",
        schedule=Schedule.SAMPLES,
        remote=RemoteActors.STEPS,  # its actors' steps, as DQN's (edgerl.run.remote)
        presets=SAC_PRESETS,
        sample_keys=(
            "env.num_envs",
            "agent.batch_size",
            "agent.train_freq",
            "agent.lr",
            "agent.learning_starts",
            "agent.n_step",
            "replay.capacity",
            "agent.gamma",
            "agent.lr_end",
            "sac.q_lr",
            "sac.tau",
            "sac.policy_frequency",
            "sac.alpha",
            "sac.autotune",
        ),
    ),
    "ga": LearnerInfo(
        "edgerl.learners.ga",
        memory="episodes",
        schedule=Schedule.IN_LOOP,
        remote=RemoteActors.MEMBERS,  # they play members from seeds (edgerl.fleet.members)
        presets=GA_PRESETS,
        sample_keys=("ga.population", "ga.truncation", "ga.sigma", "env.max_episode_frames"),
    ),
}


def pipeline_mode(setting: str, device_type: str, algo: str) -> str:
    """``perf.pipeline`` for learner ``algo`` on a device of ``device_type`` ("cpu", "cuda"):
    "async" (the learner on a thread of its own, as its :class:`Schedule` says) or "sync". Auto
    is async with a GPU learner and sync on the CPU; a learner that never learns beside the
    actor is always sync.

    On the CPU the learner's parallel regions already use every core; an actor thread beside it
    preempts them and every region waits for the preempted thread. Measured on 2 cores (Pong,
    batch 32): 43 ms per update with the actor beside it against 33 ms alone, so the plain loop
    was faster. With a GPU learner, acting and emulation use the CPU while the GPU learns."""
    return choose_pipeline(setting, device_type, LEARNERS[algo].concurrent)


def choose_pipeline(setting: str, device_type: str, concurrent: bool) -> str:
    """:func:`pipeline_mode` for a learner that may (``concurrent``) or may not learn beside
    the actor, whichever it is."""
    if not concurrent:
        return "sync"
    if setting != "auto":
        return setting
    return "async" if device_type == "cuda" else "sync"


def rollouts_held(setting: str, device_type: str, algo: str) -> int:
    """How many rollouts a rollout learner's memory holds: two where it learns one while the
    next is collected (:func:`pipeline_mode` async with :attr:`Schedule.ROLLOUT_LAG`)."""
    lagged = LEARNERS[algo].schedule is Schedule.ROLLOUT_LAG
    return 2 if lagged and pipeline_mode(setting, device_type, algo) == "async" else 1


def learner_info(algo: str) -> LearnerInfo:
    """The entry of ``algo`` (a name of :data:`LEARNERS`: the config checks it)."""
    return LEARNERS[algo]
