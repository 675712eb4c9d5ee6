"""Building a learner from its config: the learner ``agent.algo`` names and its memory (a replay
for DQN, a rollout for PQN; the memory checked first). The pipeline that runs it beside an actor
is :func:`edgerl.run.pipeline.build_learning`.

The trainer, ``edgerl bench``, autotune and ``edgerl doctor`` build learners here, so what they
measure is what trains. Which learners there are, and what each learns from, is
:mod:`edgerl.config.learners`'s table; what each is besides is its kind
(:mod:`edgerl.learners.kinds`): its network, acting policy and preparation. Nothing here names a
learner.
"""

from __future__ import annotations

import torch
from torch import nn

from edgerl.config import Config
from edgerl.config.checks import check_consistency
from edgerl.config.learners import learner_info
from edgerl.envs import EnvSpec, ale_game
from edgerl.errors import ConfigError
from edgerl.learners import Learner
from edgerl.learners.acting import ActingPolicy
from edgerl.learners.fast_update import Decisions, may_compile, spare_dynamo_import
from edgerl.learners.kinds import learner_kind
from edgerl.memories import Memory
from edgerl.memories.budget import MEMORY_SHARE, MemoryPlan, check_env_memory
from edgerl.memories.kinds import MEMORY_KINDS, MemoryKind
from edgerl.words import fmt_bytes


def memory_kind(cfg: Config) -> MemoryKind:
    """What the memory of ``cfg``'s learner is (its line in edgerl.config.learners names it)."""
    return MEMORY_KINDS[learner_info(cfg.agent.algo).memory]


def uses_replay(cfg: Config) -> bool:
    """The learner ``cfg`` names learns from a replay (``edgerl doctor --deep`` exercises each
    memory itself; everything else asks :func:`memory_kind` what it needs)."""
    return learner_info(cfg.agent.algo).memory == "replay"


def memory_keeps_steps(cfg: Config) -> bool:
    """Whether the memory of ``cfg``'s learner keeps its steps to learn from again and again (a
    replay, saved beside a checkpoint where asked), see :attr:`Memory.keeps_steps`."""
    return memory_kind(cfg).keeps_steps


def policy_network(cfg: Config, spec: EnvSpec) -> nn.Module:
    """The policy network of ``cfg``'s learner for ``spec`` (its kind's: PQN's has LayerNorm),
    fresh weights."""
    return learner_kind(cfg.agent.algo).network(spec, cfg.agent.hidden)


def remote_acting_policy(cfg: Config, spec: EnvSpec) -> tuple[nn.Module, ActingPolicy]:
    """A fresh network of ``cfg``'s learner for ``spec`` (what the learner's weights load into)
    and the policy its environments act with (its kind's, which may wrap the network: SAC's
    acts on its mean and log-std), for a fleet's remote actor to act as the learner's own
    environments do."""
    net = policy_network(cfg, spec)
    return net, learner_kind(cfg.agent.algo).acting_policy(net)


def check_keys(cfg: Config) -> None:
    """Every check of ``cfg``'s keys that needs neither the game's make nor the machine: the
    config's own (:func:`edgerl.config.checks.check_consistency`) and its learner's memory's
    (``edgerl config``, ``edgerl bench`` and ``edgerl doctor`` call it; training calls
    :func:`check_setup` as well)."""
    check_consistency(cfg)
    memory_kind(cfg).refuse(cfg)


def check_setup(cfg: Config, spec: EnvSpec) -> None:
    """Refuse settings the learner cannot train with (ConfigError, one sentence): its memory's
    rules first, then how it learns beside the environments."""
    algo = cfg.agent.algo
    learner_kind(algo).refuse_game(spec, algo)  # a game whose actions it cannot learn
    memory_kind(cfg).refuse(cfg)
    if cfg.perf.pipeline == "async" and not learner_info(algo).concurrent:
        raise ConfigError(
            f"perf.pipeline=async needs a learner that learns beside the actor, and "
            f"agent.algo={algo} learns in the actor's loop (set perf.pipeline to auto or sync)"
        )
    if cfg.perf.autotune and spec.continuous:
        raise ConfigError(
            f"perf.autotune measures actors that pick one of a few actions, and '{spec.id}' "
            "has continuous ones: set env.num_envs yourself (and perf.autotune to false)"
        )
    if cfg.perf.autotune and not memory_kind(cfg).keeps_steps:
        preset = learner_info(algo).presets.get(spec.kind, {}).get("env.num_envs")
        raise ConfigError(
            f"perf.autotune balances the actor against a replay learner's updates; with "
            f"agent.algo={algo} set env.num_envs yourself"
            + (f" (its preset is {preset})" if preset else "")
        )
    if memory_kind(cfg).lockstep and cfg.env.batch_size > 0:
        raise ConfigError(
            f"env.batch_size needs a replay learner: an agent.algo={algo} rollout steps every "
            "environment together (set env.batch_size to 0)"
        )
    if cfg.env.batch_size > 0 and ale_game(spec.id) is None:
        raise ConfigError(
            f"env.batch_size (ALE's async mode) is for Atari ids (ALE/<Game>-v5), not "
            f"{cfg.env.id}; set it to 0"
        )


# env.batch_size = -1 (auto) turns ALE's async mode on from this many environments: with fewer,
# half a step is too few rows to keep the emulator threads busy.
AUTO_BATCH_MIN_ENVS = 8


def resolve_env_batch(cfg: Config, spec: EnvSpec, device: torch.device) -> int:
    """``env.batch_size`` as training uses it: a number given is kept; -1 (auto) is half the
    environments (ALE's async mode) where the loop is bound by acting, not by learning (a
    learner on a GPU whose memory does not step in lockstep: a replay learner, the genetic
    algorithm, whose members' call then runs while the other half emulates; Atari, at least
    :data:`AUTO_BATCH_MIN_ENVS` environments), else 0:
    all environments in lockstep, and a seeded run repeats exactly.

    Why: stepping 8 Pong environments in lockstep, the actor alone reached 72-93% of the raw
    vector env on 2 cores, and with half of them returned at a time 98-100% (docs/performance.md);
    that is what a GPU learner's loop waits on. On a CPU the update is the limit (about 30
    updates/s against thousands of env steps/s) and async mode would give up repeatable runs
    for nothing; a rollout learner (PQN) steps every environment together."""
    if cfg.env.batch_size >= 0:
        return cfg.env.batch_size
    n = cfg.env.num_envs
    acting_bound = device.type == "cuda" and not memory_kind(cfg).lockstep
    if acting_bound and ale_game(spec.id) is not None and n >= AUTO_BATCH_MIN_ENVS:
        return n // 2
    return 0


def memory_plan(cfg: Config, spec: EnvSpec, device: torch.device) -> tuple[MemoryPlan, str]:
    """What the learner's memory (DQN's replay, PQN's rollout) needs against what is free on the
    device it lives on, and a sentence saying so (``edgerl doctor``'s memory line)."""
    plan, what = memory_kind(cfg).plan(cfg, spec, device)
    return plan, (
        f"{what}; {fmt_bytes(plan.available_bytes)} of {plan.where} memory is free, edgerl uses "
        f"up to {MEMORY_SHARE:.0%}"
    )


def memory_fix(cfg: Config, plan: MemoryPlan) -> str:
    """What to change when ``plan`` does not fit."""
    return memory_kind(cfg).fix(cfg, plan)


def check_memory(cfg: Config, spec: EnvSpec, device: torch.device) -> int:
    """Refuse a memory or environments that do not fit (ReplayMemoryError, EnvMemoryError,
    one sentence each, before anything is allocated); returns the memory available."""
    kind = memory_kind(cfg)
    plan, _ = kind.plan(cfg, spec, device)
    kind.check(cfg, device, plan)
    named = (kind.label, kind.size_key(cfg))
    check_env_memory(spec, cfg.env.num_envs, plan, kind.where(cfg, device), named)
    return plan.available_bytes


def build_learner(cfg: Config, spec: EnvSpec, device: torch.device) -> Learner:
    """The learner ``agent.algo`` names, with a fresh network (draws from torch's global RNG)."""
    if not may_compile(cfg.perf.compile, device, cfg.train.steps // cfg.agent.train_freq):
        spare_dynamo_import()
    return learner_kind(cfg.agent.algo).build(policy_network(cfg, spec), cfg, device)


def prepare_learner(
    cfg: Config,
    spec: EnvSpec,
    learner: Learner,
    memory: Memory,
    remaining_updates: int,
    decisions: Decisions | None = None,
) -> None:
    """Make the learner fast before training where its kind knows how (DQN: a CUDA graph that
    samples ``perf.updates_per_launch`` batches per launch, or torch.compile, whose
    measurements ``decisions`` remembers)."""
    kind = learner_kind(learner.kind)
    kind.prepare(learner, cfg, spec, memory, remaining_updates, decisions)


def build_memory(
    cfg: Config,
    spec: EnvSpec,
    device: torch.device,
    available: int | None = None,
    num_envs: int | None = None,
) -> Memory:
    """What the learner learns from: DQN's replay (on its device, feeding the learner on
    ``device``) or PQN's rollout, for ``num_envs`` environments (default ``env.num_envs``)."""
    return memory_kind(cfg).build(cfg, spec, device, available, num_envs or cfg.env.num_envs)
