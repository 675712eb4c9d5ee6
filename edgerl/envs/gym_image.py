"""Gymnasium games that show pixels (CarRacing-v3, ...), made to look like ALE's frames to the
learner: each action repeated for :data:`FRAME_SKIP` frames with the last two max-pooled
(gymnasium's ``MaxAndSkipObservation``), the picture turned grey and scaled to 84x84 by area
averaging, and the last :data:`FRAME_STACK` pictures stacked. :class:`GymImageVecEnv` does it
for a batch of environments at once; :func:`is_image` says which observation spaces it takes.
Its actions are discrete or continuous (CarRacing-v3's steering, gas and brake, clipped to their
bounds as :class:`~edgerl.envs.actions.ToGame` says), each repeated over the skipped frames.

Grey is ITU-R 601 luma (0.299 R + 0.587 G + 0.114 B), as most Atari preprocessing computes it.
A new episode's stack starts as ALE's does, zeros before its first picture: the replay rebuilds
stacks the same way from single frames, so the learner sees what the actor saw. The colour
observation itself is the screen a recording or the viewer shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.actions import GameActions, ToGame
from edgerl.envs.gym_warnings import gym_warnings_logged
from edgerl.envs.spec import FRAME_SIZE, FRAME_SKIP, FRAME_STACK, EnvSpec, Step, VecEnv

LUMA = (0.299, 0.587, 0.114)


def is_image(space: Any) -> bool:
    """Whether ``space`` is a picture: a Box of uint8, height x width with 1 or 3 channels, or
    height x width, at least 8 pixels each way."""
    from gymnasium import spaces

    if not isinstance(space, spaces.Box) or space.dtype != np.uint8:
        return False
    shape = space.shape
    if (len(shape) == 3 and shape[2] in (1, 3)) or len(shape) == 2:
        return min(shape[:2]) >= 8
    return False


def image_spec(env_id: str, actions: GameActions) -> EnvSpec:
    """The spec every picture game gets: ALE's frame stacks, and the game's ``actions``."""
    return actions.spec(env_id, "frames", (FRAME_STACK, FRAME_SIZE, FRAME_SIZE), "uint8")


def to_frames(pictures: np.ndarray) -> np.ndarray:
    """A batch of pictures (N x H x W x C or N x H x W, uint8) as N x 84 x 84 grey uint8."""
    import torch  # here: watching a run (edgerl view, serve) reads envs without PyTorch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(pictures)).float()
    if x.ndim == 4 and x.shape[-1] == 3:
        x = x @ torch.tensor(LUMA)
    elif x.ndim == 4:
        x = x[..., 0]
    x = F.adaptive_avg_pool2d(x[:, None], (FRAME_SIZE, FRAME_SIZE))[:, 0]
    return x.round_().clamp_(0, 255).to(torch.uint8).numpy()


class GymImageVecEnv(VecEnv):
    """Picture games through ``gymnasium.vector.SyncVectorEnv``, as ALE frame stacks."""

    def __init__(
        self,
        cfg: EnvConfig,
        spec: EnvSpec,
        make_kwargs: dict[str, Any],
        check_stop: Callable[[], None] = lambda: None,
        screens: bool = False,
    ) -> None:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv
        from gymnasium.wrappers import MaxAndSkipObservation

        def one() -> Any:
            check_stop()  # many environments take long to build: a stop must not wait
            with gym_warnings_logged():
                return MaxAndSkipObservation(gym.make(cfg.id, **make_kwargs), skip=FRAME_SKIP)

        self._env = SyncVectorEnv([one] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = cfg.num_envs
        self.spec = spec
        self._screens = screens
        self._pictures: np.ndarray | None = None  # the latest colour observations
        self._final_pictures: dict[int, np.ndarray] = {}
        self._stack = np.zeros((cfg.num_envs, *spec.obs_shape), dtype=np.uint8)
        self._actions: np.ndarray | None = None
        self._to_game = ToGame(spec, cfg.num_envs)
        fps = self._env.envs[0].metadata.get("render_fps")
        if fps:
            self.steps_per_second = float(fps) / FRAME_SKIP

    def reset(self, seed: int) -> np.ndarray:
        pictures, _ = self._env.reset(seed=int(seed))
        self._pictures, self._final_pictures = pictures, {}
        self._stack[:] = 0
        self._stack[:, -1] = to_frames(pictures)
        return self._stack.copy()

    def send(self, actions: np.ndarray) -> None:
        self._actions = self._to_game(actions)

    def recv(self) -> Step:
        if self._actions is None:
            raise RuntimeError("recv() without send()")
        pictures, rewards, terminated, truncated, info = self._env.step(self._actions)
        self._actions = None
        done = np.asarray(terminated | truncated)
        frames = to_frames(pictures)
        final = None
        self._final_pictures = {}
        if done.any():
            ended = np.flatnonzero(done)
            last = to_frames(np.stack([info["final_obs"][i] for i in ended]))
            final = np.zeros_like(self._stack)
            final[ended, :-1] = self._stack[ended, 1:]
            final[ended, -1] = last
            self._final_pictures = {int(i): info["final_obs"][i] for i in ended}
        self._stack[:, :-1] = self._stack[:, 1:]
        self._stack[:, -1] = frames
        self._stack[done, :-1] = 0  # a new episode: zeros before its first picture
        self._pictures = pictures
        return Step(
            self._stack.copy(),
            np.asarray(rewards, dtype=np.float32),
            np.asarray(terminated),
            np.asarray(truncated),
            final,
        )

    def screen(self, index: int = 0, final: bool = False) -> np.ndarray | None:
        if not self._screens or self._pictures is None:
            return None
        picture = self._final_pictures.get(index) if final else self._pictures[index]
        if picture is None:
            return None
        return picture if picture.ndim == 3 and picture.shape[2] == 3 else grey_to_rgb(picture)

    def close(self) -> None:
        self._env.close()


def grey_to_rgb(picture: np.ndarray) -> np.ndarray:
    """An H x W (x 1) grey picture as H x W x 3, for screens."""
    grey = picture.reshape(picture.shape[0], picture.shape[1])
    return np.repeat(grey[..., None], 3, axis=2)
