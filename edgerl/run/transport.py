"""What the training loop knows of actors that run elsewhere: a :class:`Transport` delivers
their steps as :class:`Chunk` batches and takes the weights and exploration rates back.

The loop (:mod:`edgerl.run.remote`) does not know what carries them: ``edgerl.fleet`` is the one
transport, Ray actors on other machines (the ``edgerl[fleet]`` extra). A chunk holds single
frames: the replay keeps one frame per step and rebuilds stacks itself, so an actor sends each
observation's newest frame (or, for vector observations, the vector) and nothing more.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np

from edgerl.config.learners import RemoteActors
from edgerl.envs import EnvSpec


class Chunk(NamedTuple):
    """``T`` vector steps of one actor's ``E`` environments, in order."""

    actor: int  # the actor's index in the fleet
    envs: np.ndarray  # (E,) int64: the learner's ids of its environments (replay rows)
    first: np.ndarray | None  # (E, *item): the items after its environments' reset, else None
    items: np.ndarray  # (T, E, *item): the newest frame (or vector) after each step
    actions: np.ndarray  # (T, E): the action that led to it
    rewards: np.ndarray  # (T, E) float32, unclipped
    terminated: np.ndarray  # (T, E) bool
    truncated: np.ndarray  # (T, E) bool
    final_items: np.ndarray  # (K, *item): each ended episode's last item, in (t, e) order
    version: int  # the learner's update count of the weights that acted

    @property
    def steps(self) -> int:
        """Transitions it holds."""
        return int(self.actions.size)


class Transport(Protocol):
    """Actors elsewhere, as the training loop sees them. Made by a factory the trainer is given
    (``edgerl.fleet.open_fleet``), which raises EdgerlError subclasses for what a user can fix."""

    num_envs: int  # environments over all actors: the replay's rows
    plays: RemoteActors  # STEPS (batches of steps, these methods) or MEMBERS (run/remote.py)

    def start(self, weights: dict[str, np.ndarray], version: int, seed: int) -> None:
        """Start the actors with these weights (the learner's ``version``: its update count);
        their environments are seeded from ``seed``."""
        ...

    def receive(self, timeout_s: float) -> list[Chunk]:
        """The batches that arrived, each actor's in the order it sent them, after waiting up to
        ``timeout_s`` for the first (empty when none came); asks each actor that delivered for
        its next. An actor lost on the way is named in the log and left out; raises
        EdgerlError when no actor can run at all."""
        ...

    def set_exploration(self, epsilons: np.ndarray) -> None:
        """The exploration rate of each environment (``num_envs`` of them) for the batches asked
        for from now on."""
        ...

    def publish(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Newer weights for the actors' next batches."""
        ...

    def status(self) -> dict[str, Any]:
        """JSON-ready state for status.json: ``actors`` (a list of dicts with at least ``id``,
        ``state`` and ``node``) and totals."""
        ...

    def close(self) -> None:
        """Stop every actor (and what the transport started); safe to call twice."""
        ...


def apex_epsilons(n: int, base: float, alpha: float) -> np.ndarray:
    """Ape-X's exploration rates for ``n`` environments: ``base ** (1 + alpha * i / (n - 1))``
    for environment ``i`` (``base`` alone for one), from much exploration to almost none."""
    if n == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(n) / (n - 1))


def actions_problem(actions: np.ndarray, spec: EnvSpec) -> str | None:
    """Why a batch's ``actions`` cannot be the game's: action ids of another type or outside
    its actions, or a continuous game's numbers that are not float32, not finite or outside
    its bounds (beyond float32 rounding)."""
    if not spec.continuous:
        if actions.dtype.kind not in "iu":
            return "its actions are not whole numbers"
        if actions.size and (actions.min() < 0 or actions.max() >= spec.num_actions):
            return f"it holds actions outside 0-{spec.num_actions - 1}"
        return None
    if actions.dtype != np.float32:
        return f"its actions are {actions.dtype}, not float32"
    if not np.isfinite(actions).all():
        return "it holds actions that are not finite"
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    slack = 1e-5 * np.maximum(1.0, high - low)
    if actions.size and ((actions < low - slack).any() or (actions > high + slack).any()):
        return f"it holds actions outside the game's bounds {spec.action_low}-{spec.action_high}"
    return None


def chunk_problem(
    chunk: Any, spec: EnvSpec, steps_asked: int, num_envs: int, version: int
) -> str | None:
    """Why ``chunk``, as an actor delivered it, must not reach the replay, or None when it may.

    An actor's batch crosses a network from a process the learner does not control: NaN rewards
    went through clipping into the weights, an out-of-range action wrapped around in the replay's
    uint8 and stopped the learner, a wrong shape stopped it, a batch 500 times the asked size was
    taken. So each part is checked against the game (``spec``), the ``steps_asked`` (at most),
    the actor's ``num_envs`` and the newest weights ``version`` sent."""
    if not isinstance(chunk, Chunk):
        return f"a {type(chunk).__name__}, not a batch of steps"
    item = spec.item_shape
    expected = {
        "items": (None, num_envs, *item),
        "actions": (None, num_envs, *spec.action_shape),
        "rewards": (None, num_envs),
        "terminated": (None, num_envs),
        "truncated": (None, num_envs),
    }
    for name, shape in expected.items():
        value = getattr(chunk, name)
        if not isinstance(value, np.ndarray) or value.ndim != len(shape):
            return f"its {name} are not an array of {len(shape)} dimensions"
        if value.shape[1:] != shape[1:]:
            rest = ", ".join(map(str, shape[1:]))
            return f"its {name} have shape {value.shape}, not (steps, {rest})"
    steps = len(chunk.actions)
    if not 0 < steps <= steps_asked:
        return f"it holds {steps:,} steps where at most {steps_asked:,} were asked for"
    if any(len(getattr(chunk, n)) != steps for n in expected):
        return "its parts hold different numbers of steps"
    kinds = {"items": spec.obs_dtype, "terminated": "bool", "truncated": "bool"}
    for name, dtype in kinds.items():
        if getattr(chunk, name).dtype != np.dtype(dtype):
            return f"its {name} are {getattr(chunk, name).dtype}, not {dtype}"
    if chunk.rewards.dtype.kind != "f":
        return "its rewards are not numbers"
    if (problem := actions_problem(chunk.actions, spec)) is not None:
        return problem
    if not np.isfinite(chunk.rewards).all():
        return "it holds rewards that are not finite (NaN or infinite)"
    if spec.obs_dtype != "uint8" and not np.isfinite(chunk.items).all():
        return "it holds observations that are not finite"  # first and last ones: below
    if chunk.first is not None and (
        not isinstance(chunk.first, np.ndarray)
        or chunk.first.shape != (num_envs, *item)
        or chunk.first.dtype != np.dtype(spec.obs_dtype)
    ):
        return "its first observations do not fit the game"
    if chunk.first is not None and spec.obs_dtype != "uint8" and not np.isfinite(chunk.first).all():
        return "its first observations are not finite"
    ended = int(np.count_nonzero(chunk.terminated | chunk.truncated))
    final = chunk.final_items
    if (
        not isinstance(final, np.ndarray)
        or final.shape != (ended, *item)
        or final.dtype != np.dtype(spec.obs_dtype)
    ):
        return f"its last observations do not match its {ended:,} ended episodes"
    if spec.obs_dtype != "uint8" and not np.isfinite(final).all():
        return "its episodes' last observations are not finite (a target would be NaN)"
    if not isinstance(chunk.version, int | np.integer) or not -1 <= chunk.version <= version:
        return f"it names weights version {chunk.version!r}, never sent (newest {version})"
    return None
