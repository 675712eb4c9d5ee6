"""What every environment family shares: the game's description (:class:`EnvSpec`), one
vector step (:class:`Step`), the :class:`VecEnv` contract the trainer relies on (see
:mod:`edgerl.envs`), and the frame format of the image families (DQN's: 84x84 grey, a stack of
four, frame skip 4)."""

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
MAX_ACTIONS = 4_096
SCREEN_HEIGHT, SCREEN_WIDTH = 210, 160  # ALE's screen, every game


def short_env_name(env_id: str) -> str:
    """A file-system friendly env name: ``ALE/Pong-v5`` -> ``Pong-v5``."""
    return env_id.split("/")[-1].replace(":", "-")


@dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an environment."""

    id: str
    kind: str  # "frames" (Atari stacks) or "vector"
    obs_shape: tuple[int, ...]
    obs_dtype: str  # "uint8" or "float32"
    num_actions: int
    action_meanings: tuple[str, ...]

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
        of error for every game), any other game's as they are. Episode returns are always
        reported from the real rewards."""
        return np.minimum(np.maximum(rewards, -1.0), 1.0) if self.has_frames else rewards

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
        """Plain values, as checkpoints store them."""
        return {
            "id": self.id,
            "kind": self.kind,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype,
            "num_actions": self.num_actions,
            "action_meanings": list(self.action_meanings),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvSpec:
        """The spec :meth:`to_dict` wrote; raises KeyError/TypeError when fields are missing,
        ValueError when they are no game's (a file's: a shape of 10^6 x 10^6 would build a
        network of a terabyte)."""
        shape = tuple(int(n) for n in d["obs_shape"])
        actions = int(d["num_actions"])
        if not 1 <= len(shape) <= 4 or not all(1 <= n <= MAX_OBS_SIDE for n in shape):
            raise ValueError(f"observations of shape {list(shape)[:8]}")
        if math.prod(shape) > MAX_OBS_SIZE or not 1 <= actions <= MAX_ACTIONS:
            raise ValueError(f"observations of shape {list(shape)} and {actions} actions")
        return cls(d["id"], d["kind"], shape, d["obs_dtype"], actions, tuple(d["action_meanings"]))


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
