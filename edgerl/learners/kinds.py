"""What each kind of learner is, besides its own learning: its network for a game, how its
environments act, how it is made fast before training, how ``edgerl bench`` measures and costs
it, and which rewards it learns from. A learner's module holds a ``KIND`` of this shape (its
registry line in :mod:`edgerl.config.learners` names the module); everything outside
learners/, memories/ and config/ asks the kind, never which learner it is.

The registry line holds what must be known without PyTorch (its memory, how it learns beside
the actor as a :class:`~edgerl.config.learners.Schedule`, what a fleet's remote actors send it
as :class:`~edgerl.config.learners.RemoteActors`, presets, the settings its samples to target
depend on); the kind holds what needs PyTorch or the learner's code. :class:`Basics` gives the
members most learners share (a Q-network's shape, epsilon-greedy acting, nothing to prepare,
measured alone from its memory by the loops), so that a learner's kind says only where it
differs. docs/development.md walks through a new one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from edgerl.config import Config
from edgerl.config.learners import LEARNERS, LearnerInfo, learner_info
from edgerl.envs import EnvSpec, refuse_continuous
from edgerl.learners.acting import ActingPolicy, EpsilonGreedy
from edgerl.learners.nets import build_q_network, num_actions_of

if TYPE_CHECKING:
    from edgerl.learners import Learner
    from edgerl.learners.fast_update import Decisions
    from edgerl.memories import Memory


@runtime_checkable
class LearnerKind(Protocol):
    # Its acting network changes where an episode ends (each environment plays one member's
    # whole episode): the loop records a step before it picks the next actions.
    switches_per_episode: bool
    # It learns actions that are numbers (a bounded Box); else it picks one of a few.
    continuous_actions: bool
    # Its ``update(batch)`` runs in every mode ``edgerl doctor --deep`` compares (eager,
    # channels-last, each autocast dtype, a CUDA graph); else doctor checks that it learns.
    update_modes: bool
    # Its evaluations and ``edgerl play`` draw each action from the policy's outputs (a softmax
    # of logits: a policy that samples as it learns), not the largest. A continuous game's are
    # played greedily whatever this says: its network outputs the action itself.
    samples_when_played: bool

    def refuse_game(self, spec: EnvSpec, algo: str) -> None:
        """Raise EnvError (one sentence) where it cannot learn ``spec``'s game (called
        ``algo`` in the config), before anything is built."""
        ...

    def network(self, spec: EnvSpec, hidden: tuple[int, ...]) -> nn.Module:
        """Its policy network for ``spec`` with hidden widths ``hidden`` (fresh weights): what
        it acts and learns with, and what checkpoints keep, play rebuilds and export writes."""
        ...

    def acting_policy(self, net: nn.Module) -> ActingPolicy:
        """How its environments act around ``net`` (a network of :meth:`network`), here and on
        a fleet's remote actors: the policy its learner's ``policy`` member is."""
        ...

    def build(self, net: nn.Module, cfg: Config, device: torch.device) -> Learner:
        """The learner around ``net`` (fresh, of :meth:`network`)."""
        ...

    def prepare(
        self,
        learner: Learner,
        cfg: Config,
        spec: EnvSpec,
        memory: Memory,
        remaining_updates: int,
        decisions: Decisions | None,
    ) -> None:
        """Make ``learner``'s update fast before training (a CUDA graph, torch.compile), or
        nothing."""
        ...

    def measure_alone(
        self, cfg: Config, spec: EnvSpec, device: torch.device, seconds: float
    ) -> dict[str, Any] | None:
        """``edgerl bench``'s learner-alone figures where its work is not units of learning
        made from a memory (the genetic algorithm's members handed out), else None: the loops
        then time it learning from a memory they write (:mod:`edgerl.run.learner_alone`)."""
        ...

    def forwards_per_env_step(self, cfg: Config, values_reused: bool) -> dict[str, float]:
        """Forward-pass equivalents one env step costs, by what they are for: ``act``,
        ``values`` (the next observations' values, all or only a rollout's last where the
        actor's are ``values_reused``), ``targets`` and ``gradients`` (forward and backward)."""
        ...

    def forwards_per_update(self, cfg: Config) -> float:
        """Forward-pass equivalents of one of its gradient updates, as the bench's
        learner-alone measurement makes it."""
        ...

    def learning_rewards(self, spec: EnvSpec, rewards: np.ndarray) -> np.ndarray:
        """What its memory is written of a step's ``rewards`` (the game's own, unclipped)."""
        ...


class Basics:
    """The members most learners share: a Q-network's shape (the Nature CNN for frames, an MLP
    for vectors; with LayerNorm where :attr:`layer_norm`), epsilon-greedy acting, nothing to
    prepare, measured alone by the loops, the rewards learning uses for the game
    (:meth:`EnvSpec.learning_rewards`: Atari's clipped)."""

    switches_per_episode = False
    continuous_actions = False
    update_modes = False
    samples_when_played = False
    layer_norm = False

    def refuse_game(self, spec: EnvSpec, algo: str) -> None:
        """A game of continuous actions, for a learner that picks one of a few."""
        if not self.continuous_actions and spec.continuous:
            others = tuple(n for n in LEARNERS if learner_kind(n).continuous_actions)
            refuse_continuous(spec, algo, others)

    def network(self, spec: EnvSpec, hidden: tuple[int, ...]) -> nn.Module:
        return build_q_network(spec, hidden, layer_norm=self.layer_norm)

    def acting_policy(self, net: nn.Module) -> ActingPolicy:
        return EpsilonGreedy(net, num_actions_of(net))

    def prepare(
        self,
        learner: Learner,
        cfg: Config,
        spec: EnvSpec,
        memory: Memory,
        remaining_updates: int,
        decisions: Decisions | None,
    ) -> None:
        """Nothing: the learner stays as built."""

    def measure_alone(
        self, cfg: Config, spec: EnvSpec, device: torch.device, seconds: float
    ) -> dict[str, Any] | None:
        return None

    def learning_rewards(self, spec: EnvSpec, rewards: np.ndarray) -> np.ndarray:
        return spec.learning_rewards(rewards)


def modes_learner(algo: str) -> str:
    """The learner whose update ``edgerl bench``'s variants (and ``doctor --deep``'s modes)
    run: ``algo`` where its update runs in modes (its kind's ``update_modes``), else the first
    registered learner whose update does."""
    if learner_kind(algo).update_modes:
        return algo
    return next(name for name in LEARNERS if learner_kind(name).update_modes)


def acting_learner(algo: str) -> str:
    """The learner ``edgerl bench``'s actor-alone stages act with, learning never due: ``algo``
    where it learns from a replay (its learning waits for ``agent.learning_starts``, which the
    bench puts out of reach), else :func:`modes_learner`'s (a rollout learner learns every
    rollout; its acting costs a forward pass a step as a replay learner's does)."""
    return algo if replay_learner(algo) else modes_learner(algo)


def replay_learner(algo: str) -> bool:
    """Whether ``algo`` learns from a replay it samples (its registry line's memory)."""
    return learner_info(algo).memory == "replay"


def learner_kind(algo: str) -> LearnerKind:
    """The kind of learner ``algo`` (a name of :data:`edgerl.config.learners.LEARNERS`, which
    the config checks): its module's ``KIND``."""
    info: LearnerInfo = learner_info(algo)
    kind = getattr(importlib.import_module(info.module), "KIND", None)
    if not isinstance(kind, LearnerKind):
        raise TypeError(f"{info.module}.KIND is not a learner kind (edgerl.learners.kinds)")
    return kind
