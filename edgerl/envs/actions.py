"""A gymnasium game's actions as edgerl takes them: one of a few (a ``Discrete`` space), or a
vector of bounded numbers (a one-dimensional ``Box`` with finite bounds: Pendulum's torque,
MuJoCo's joint torques, CarRacing's steering, gas and brake); :func:`game_actions` reads them
from the space and refuses any other with a sentence; :func:`refuse_continuous` is the sentence
for a learner that picks one of a few actions, given a continuous game; :func:`training_learner`
the learner a config trains (SAC for a continuous game naming none).

:class:`ToGame` is what a vector env does with the actions it is sent: a discrete game's go as
int64; a continuous game's, float32 ``(num_envs, numbers)``, are clipped to their bounds, as
CleanRL's continuous-control scripts do with gymnasium's ``ClipAction`` wrapper. The clipped
copy goes to the game; the caller's array, which the memories store, stays as the learner chose
it (a Gaussian policy's log-probability is its sample's, not the clipped action's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from edgerl.envs.spec import MAX_ACTIONS, MAX_BOUND, EnvSpec
from edgerl.errors import EdgerlError, EnvError

if TYPE_CHECKING:
    from edgerl.config import Config


class GameActions(NamedTuple):
    """A game's actions, as :class:`~edgerl.envs.spec.EnvSpec` describes them."""

    num_actions: int  # discrete actions; a continuous action's numbers
    meanings: tuple[str, ...]
    shape: tuple[int, ...] = ()  # () discrete; (numbers,) continuous
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    def spec(self, env_id: str, kind: str, obs_shape: tuple[int, ...], obs_dtype: str) -> EnvSpec:
        """The description of a game with these actions and these observations."""
        return EnvSpec(env_id, kind, obs_shape, obs_dtype, *self)


def game_actions(env_id: str, space: Any) -> GameActions:
    """The actions of ``space``, game ``env_id``'s action space; raises EnvError (one
    sentence naming the space) for a space edgerl does not take: neither ``Discrete`` nor a
    one-dimensional ``Box`` of floats with finite bounds."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        n = int(space.n)
        return GameActions(n, tuple(str(i) for i in range(n)))
    takes = (
        "edgerl takes one of a few actions (Discrete) or one vector of bounded numbers (a "
        "one-dimensional Box)"
    )
    if not isinstance(space, spaces.Box):
        raise EnvError(f"environment '{env_id}' has actions of the kind {space}; {takes}")
    if len(space.shape) != 1 or not 1 <= space.shape[0] <= MAX_ACTIONS:
        raise EnvError(
            f"environment '{env_id}' has actions of shape {space.shape} ({space}); {takes}, "
            f"of 1 to {MAX_ACTIONS:,} numbers"
        )
    if not np.issubdtype(space.dtype, np.floating):
        raise EnvError(
            f"environment '{env_id}' has actions of {space.dtype} numbers ({space}); {takes} "
            "of floating-point numbers"
        )
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    bounded = (np.abs(low) <= MAX_BOUND) & (np.abs(high) <= MAX_BOUND)  # False for NaN too
    if not bounded.all() or not (low.astype(np.float32) < high.astype(np.float32)).all():
        raise EnvError(
            f"environment '{env_id}' has actions without finite bounds, each low below its "
            f"high ({space}); edgerl clips every action to its bounds, so {takes}"
        )
    n = int(space.shape[0])
    meanings = tuple(f"a{i}" for i in range(n))
    return GameActions(n, meanings, (n,), tuple(low.tolist()), tuple(high.tolist()))


def refuse_continuous(spec: EnvSpec, learner: str, others: tuple[str, ...] = ()) -> None:
    """Raise EnvError (one sentence) where ``spec``'s game has continuous actions: for a learner
    (``agent.algo`` ``learner``) that picks one of a few, before anything is built; ``others``
    are the learners that learn such actions, which the sentence offers."""
    if not spec.continuous:
        return
    offered = " or ".join(f"agent.algo={name}" for name in others) or "a learner for them"
    raise EnvError(
        f"environment '{spec.id}' has a continuous action space ({numbers(spec)} per "
        f"environment, within bounds); agent.algo={learner} picks one of a few discrete "
        f"actions: use {offered}, or a game with discrete ones (e.g. CartPole-v1 or an "
        "ALE/<Game>-v5 id; some games take them in env.make_kwargs, as CarRacing-v3 does "
        "with '{continuous = false}')"
    )


def numbers(spec: EnvSpec) -> str:
    """``"1 number"``, ``"3 numbers"``: the size of one of ``spec``'s continuous actions."""
    n = spec.num_actions
    return f"{n} number{'s' if n != 1 else ''}"


class ToGame:
    """What a vector env of ``spec`` with ``num_envs`` environments sends the games for the
    actions it is sent (see the module docstring)."""

    def __init__(self, spec: EnvSpec, num_envs: int) -> None:
        self.spec = spec
        self.shape = (num_envs, *spec.action_shape)
        self.low = np.asarray(spec.action_low, dtype=np.float32)
        self.high = np.asarray(spec.action_high, dtype=np.float32)

    def __call__(self, actions: np.ndarray) -> np.ndarray:
        """The actions as the games take them; for a continuous game, raises EnvError when
        ``actions`` are not one float vector per environment (a learner that picks discrete
        actions), or are not finite (a network that diverged)."""
        if not self.spec.continuous:
            return np.asarray(actions, dtype=np.int64)
        a = np.asarray(actions)
        if a.shape != self.shape:
            raise EnvError(
                f"environment '{self.spec.id}' has a continuous action space "
                f"({numbers(self.spec)} per environment, an array of shape {self.shape}) and "
                f"was sent actions of shape {a.shape}: this learner picks "
                "one of a few discrete actions; use a learner for continuous actions, or a "
                "game with discrete ones (some take them in env.make_kwargs, as CarRacing-v3 "
                "does with '{continuous = false}')"
            )
        a = a.astype(np.float32, copy=False)
        if not np.isfinite(a).all():
            raise EnvError(
                f"the actions sent to '{self.spec.id}' are not all finite numbers (NaN or "
                "infinity): the learner's network has diverged; lower its learning rate"
            )
        return np.clip(a, self.low, self.high)


def greedy_actions(spec: EnvSpec, outputs: np.ndarray) -> np.ndarray:
    """The actions a policy's ``outputs`` (a batch of its network's rows) stand for when it
    acts greedily: a discrete game's the argmax of each row (int64); a continuous game's
    network outputs its action itself, the float32 numbers within their bounds."""
    if spec.continuous:
        return np.asarray(outputs, dtype=np.float32)
    return np.asarray(outputs).argmax(axis=1).astype(np.int64)


def random_actions(spec: EnvSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniformly random actions of ``spec``'s game from ``rng``: ids (int64), or
    float32 vectors uniform within the bounds."""
    if not spec.continuous:
        return rng.integers(0, spec.num_actions, size=n, dtype=np.int64)
    low = np.asarray(spec.action_low, dtype=np.float32)
    high = np.asarray(spec.action_high, dtype=np.float32)
    return rng.uniform(low, high, size=(n, *spec.action_shape)).astype(np.float32)


def with_random_vectors(
    spec: EnvSpec, actions: np.ndarray, epsilon: float, rng: np.random.Generator
) -> np.ndarray:
    """A continuous game's ``actions`` (one vector per environment), each replaced by a
    uniformly random one of :func:`random_actions` with probability ``epsilon`` (a discrete
    game's exploration is :func:`edgerl.learners.explore.with_exploration`)."""
    n = len(actions)
    out = np.array(actions, dtype=np.float32)
    explore = rng.random(n) < epsilon
    if explore.any():
        out[explore] = random_actions(spec, int(explore.sum()), rng)
    return out


def shown_action(spec: EnvSpec, action: Any) -> int:
    """What a frame's overlay names as the action taken: a discrete game's id; -1 for a
    continuous game's vector, whose numbers the overlay shows as the policy's figures."""
    return -1 if spec.continuous else int(action)


def training_learner(cfg: Config) -> str:
    """The learner ``cfg`` will train: ``agent.algo`` where it is set, else the one the game's
    presets give (a game of continuous actions trains the one
    :data:`~edgerl.config.presets.CONTINUOUS_LEARNERS` gives its observations); the game is
    probed only then."""
    if "agent.algo" in cfg.explicit:
        return cfg.agent.algo
    from edgerl.config.presets import CONTINUOUS_LEARNERS
    from edgerl.envs import probe

    try:
        spec = probe(cfg.env)
    except EdgerlError:  # an unknown game is said where it is built, in its own sentence
        return cfg.agent.algo
    if not spec.continuous:
        return cfg.agent.algo
    return CONTINUOUS_LEARNERS[spec.kind]
