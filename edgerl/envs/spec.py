"""What every environment family shares: the game's description (:class:`EnvSpec`), one
vector step (:class:`Step`), the :class:`VecEnv` contract the trainer relies on (see
:mod:`edgerl.envs`), and the frame format of the image families (DQN's: 84x84 grey, a stack of
four, frame skip 4).

A game's actions are one of two kinds. Discrete: one of ``num_actions`` actions, an int64 per
environment. Continuous: a vector of ``action_shape`` float32 numbers per environment, each
within its bounds (``action_low``, ``action_high``; gymnasium's bounded ``Box``); there
``num_actions`` is the vector's length, so that a network sized by it has one output a number,
and ``action_meanings`` names the numbers ``a0``, ``a1``, ..."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

FRAME_STACK = 4
FRAME_SIZE = 84
FRAME_SKIP = 4
ALE_HZ = 60.0  # the Atari's frame rate
# Bounds of a game's description read from a file (a checkpoint's): far above any game edgerl
# plays (CarRacing's 96x96x3 pictures, 18 Atari actions), far below what would not fit memory.
MAX_OBS_SIDE = 65_536
MAX_OBS_SIZE = 1 << 24
MAX_ACTIONS = 4_096  # discrete actions, or numbers in a continuous action
MAX_BOUND = float(np.finfo(np.float32).max)  # a continuous action's bounds: finite float32
SCREEN_HEIGHT, SCREEN_WIDTH = 210, 160  # ALE's screen, every game


def short_env_name(env_id: str) -> str:
    """A file-system friendly env name: ``ALE/Pong-v5`` -> ``Pong-v5``."""
    return env_id.split("/")[-1].replace(":", "-")


@dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an environment (its actions: see the module
    docstring)."""

    id: str
    kind: str  # "frames" (Atari stacks) or "vector"
    obs_shape: tuple[int, ...]
    obs_dtype: str  # "uint8" or "float32"
    num_actions: int  # discrete actions; a continuous action's numbers
    action_meanings: tuple[str, ...]
    action_shape: tuple[int, ...] = ()  # one action's shape: () discrete, (numbers,) continuous
    action_low: tuple[float, ...] = ()  # a continuous action's bounds, one per number
    action_high: tuple[float, ...] = ()

    @property
    def continuous(self) -> bool:
        """Whether an action is a vector of bounded numbers rather than one of a few."""
        return bool(self.action_shape)

    @property
    def action_dtype(self) -> str:
        """The dtype of the actions a vector env takes: "int64", or "float32" (continuous)."""
        return "float32" if self.continuous else "int64"

    @property
    def short_name(self) -> str:
        """A file-system friendly name: ``ALE/Pong-v5`` -> ``Pong-v5``."""
        return short_env_name(self.id)

    @property
    def has_frames(self) -> bool:
        """Atari frame stacks (shown by the viewer, stored one frame per step)."""
        return self.kind == "frames"

    def learning_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """The rewards learners learn from: Atari's clipped to [-1, 1] (DQN's rule: one scale
        of error for every game), any other game's as they are (a picture game's too: clipped,
        CarRacing's -0.4 a step and +3 a tile would weigh the same). Episode returns are always
        reported from the real rewards."""
        atari = self.id.startswith("ALE/")  # every ALE/<Game>-v5 id, and only those
        return np.minimum(np.maximum(rewards, -1.0), 1.0) if atari else rewards

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """(height, width) of one frame; None for vector observations."""
        return (self.obs_shape[-2], self.obs_shape[-1]) if self.has_frames else None

    @property
    def stack(self) -> int:
        """Frames per observation (1 for vector observations)."""
        return self.obs_shape[0] if self.has_frames else 1

    @property
    def item_shape(self) -> tuple[int, ...]:
        """What one replay slot stores: the newest frame, or the whole vector."""
        return self.obs_shape[1:] if self.has_frames else self.obs_shape

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as checkpoints store them (a discrete game's as before continuous
        actions existed: no action shape or bounds)."""
        d = {
            "id": self.id,
            "kind": self.kind,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype,
            "num_actions": self.num_actions,
            "action_meanings": list(self.action_meanings),
        }
        if self.continuous:
            d["action_shape"] = list(self.action_shape)
            d["action_low"] = list(self.action_low)
            d["action_high"] = list(self.action_high)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvSpec:
        """The spec :meth:`to_dict` wrote (without an action shape: a discrete game's, as every
        older checkpoint holds); raises KeyError/TypeError when fields are missing,
        ValueError when they are no game's (a file's: a shape of 10^6 x 10^6 would build a
        network of a terabyte; a bound that is NaN would clip every action to NaN)."""
        shape = tuple(int(n) for n in d["obs_shape"])
        actions = int(d["num_actions"])
        if not 1 <= len(shape) <= 4 or not all(1 <= n <= MAX_OBS_SIDE for n in shape):
            raise ValueError(f"observations of shape {list(shape)[:8]}")
        if math.prod(shape) > MAX_OBS_SIZE or not 1 <= actions <= MAX_ACTIONS:
            raise ValueError(f"observations of shape {list(shape)} and {actions} actions")
        action_shape, low, high = continuous_action(d, actions)
        return cls(
            d["id"],
            d["kind"],
            shape,
            d["obs_dtype"],
            actions,
            tuple(d["action_meanings"]),
            action_shape,
            low,
            high,
        )


def continuous_action(
    d: dict[str, Any], num_actions: int
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """The action shape and bounds a spec's dict holds (all empty: a discrete game's); raises
    ValueError unless the shape is one dimension of ``num_actions`` numbers and the bounds are
    as many finite numbers, each low below its high; TypeError for values of another type."""
    raw_shape = d.get("action_shape", [])
    raw_low, raw_high = d.get("action_low", []), d.get("action_high", [])
    if not all(isinstance(v, list) for v in (raw_shape, raw_low, raw_high)):
        raise TypeError("an action shape or bounds that are not lists")
    if not raw_shape:
        if raw_low or raw_high:
            raise ValueError("action bounds without an action shape")
        return (), (), ()
    shape = tuple(int(n) for n in raw_shape[:2])
    if len(raw_shape) != 1 or not 1 <= shape[0] <= MAX_ACTIONS:
        raise ValueError(
            f"continuous actions of shape {list(shape)}, not one dimension of 1 to "
            f"{MAX_ACTIONS:,} numbers"
        )
    if shape[0] != num_actions or len(raw_low) != num_actions or len(raw_high) != num_actions:
        raise ValueError(
            f"continuous actions of {shape[0]} numbers with {num_actions} actions, "
            f"{len(raw_low)} low and {len(raw_high)} high bounds"
        )
    if any(isinstance(v, bool) for v in (*raw_low, *raw_high)):
        raise TypeError("action bounds that are not numbers")
    low, high = tuple(float(v) for v in raw_low), tuple(float(v) for v in raw_high)
    for i, (lo, hi) in enumerate(zip(low, high, strict=True)):
        # Actions are float32: a bound must be one, and stay below the other as one.
        within = abs(lo) <= MAX_BOUND and abs(hi) <= MAX_BOUND  # False for NaN too
        if not (within and np.float32(lo) < np.float32(hi)):
            raise ValueError(f"action number {i} bounded by {lo} and {hi}")
    return shape, low, high


class Step(NamedTuple):
    obs: np.ndarray
    rewards: np.ndarray  # float32, unclipped
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool
    final_obs: np.ndarray | None  # rows valid where terminated | truncated
    env_ids: np.ndarray | None = None  # the environment of each row; None: all, in order


class VecEnv:
    """Batched environments with a split ``send``/``recv`` step; see the module docstring."""

    spec: EnvSpec
    num_envs: int
    reset_ids: np.ndarray | None = None  # the environments of reset()'s rows; None: all

    def reset(self, seed: int) -> np.ndarray:
        raise NotImplementedError

    def send(self, actions: np.ndarray) -> None:
        raise NotImplementedError

    def recv(self) -> Step:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> Step:
        self.send(actions)
        return self.recv()

    # The game's pace in steps per second: what a recording plays at to look like the game.
    steps_per_second: float = 30.0

    def screen(self, index: int = 0, final: bool = False) -> np.ndarray | None:
        """Environment ``index``'s colour screen (HxWx3 uint8) after the latest reset or step;
        ``final``: the last screen of the episode that the latest step ended (the environment
        has reset itself since). None when it was made without ``screens=True``."""
        return None

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
