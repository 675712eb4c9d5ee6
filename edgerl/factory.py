"""Building a training run's parts from its config: the replay (its memory checked first), the
learner, and the pipeline with its actor, ready to act and learn.

The trainer and ``edgerl bench`` build them here, so what the bench measures is what trains.
"""

from __future__ import annotations

import numpy as np
import torch

from edgerl.actor import Actor, ActorWeights
from edgerl.config import Config
from edgerl.device import resolve_device
from edgerl.dqn import DQN
from edgerl.envs import EnvSpec
from edgerl.fast_update import may_compile, spare_dynamo_import
from edgerl.nets import build_q_network
from edgerl.pipeline import (
    Learning,
    make_learning,
    resolve_updates_per_launch,
    wants_double_weights,
)
from edgerl.replay import ReplayBuffer
from edgerl.replay_memory import available_memory, check_env_memory, plan_memory
from edgerl.replay_sample import example_batch


def replay_device(cfg: Config, device: torch.device) -> torch.device:
    """Where the replay lives: ``replay.device``, by default the learner's device."""
    return device if cfg.replay.device == "auto" else resolve_device(cfg.replay.device)


def check_memory(cfg: Config, spec: EnvSpec, device: torch.device) -> int:
    """Refuse a replay or environments that do not fit (ReplayMemoryError, EnvMemoryError, one
    sentence each, before anything is allocated); returns the memory available to the replay."""
    where_to = replay_device(cfg, device)
    available, where = available_memory(where_to)
    plan = plan_memory(spec, cfg.replay.capacity, available, where)
    plan.check()
    check_env_memory(spec, cfg.env.num_envs, plan, where_to)
    return available


def build_learner(cfg: Config, spec: EnvSpec, device: torch.device) -> DQN:
    """The learner ``cfg`` asks for, with a fresh network (draws from torch's global RNG)."""
    if not may_compile(cfg.perf.compile, device, cfg.train.steps // cfg.agent.train_freq):
        spare_dynamo_import()
    net = build_q_network(spec, cfg.agent.hidden)
    return DQN(net, cfg.agent, device, cfg.perf, total_steps=cfg.train.steps)


def build_replay(
    cfg: Config, spec: EnvSpec, device: torch.device, available: int | None = None
) -> ReplayBuffer:
    """The replay of ``cfg`` on its device, feeding the learner on ``device``."""
    return ReplayBuffer(
        spec,
        cfg.replay.capacity,
        cfg.env.num_envs,
        replay_device(cfg, device),
        cfg.env.seed + 1,
        available,
        out_device=device,
        n_step=cfg.agent.n_step,
        gamma=cfg.agent.gamma,
    )


def build_learning(
    cfg: Config,
    spec: EnvSpec,
    learner: DQN,
    replay: ReplayBuffer,
    actor_rng: np.random.Generator,
    remaining_updates: int,
) -> Learning:
    """Make the learner fast (a CUDA graph that samples ``perf.updates_per_launch`` batches per
    launch, or torch.compile) and wrap it, the replay and an actor in the pipeline
    ``perf.pipeline`` asks for."""
    device = learner.device
    graph_samples = learner.fast.cuda_graphs and replay.device == device
    per_launch = resolve_updates_per_launch(
        cfg.perf.updates_per_launch, graph_samples, learner.target_period, cfg.perf.max_ahead
    )
    example = example_batch(spec, cfg.agent.batch_size, device)  # zeros: no RNG
    learner.prepare(example, remaining_updates, replay, per_launch)
    actor = Actor(
        ActorWeights(learner.q, wants_double_weights(cfg.perf, device)),
        spec.num_actions,
        cfg.env.batch_size or cfg.env.num_envs,  # the rows of one step
        actor_rng,
        spec.obs_shape,
        spec.obs_dtype,
        use_graph=learner.fast.cuda_graphs,
    )
    return make_learning(cfg.perf, learner, replay, actor)
