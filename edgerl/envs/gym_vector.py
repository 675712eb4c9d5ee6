"""Any other discrete-action gymnasium game: its description read from the registry with
``env.make_kwargs`` (pictures go to :mod:`edgerl.envs.gym_image`), and :class:`GymVecEnv` around
gymnasium's ``SyncVectorEnv`` for flat vector observations (CartPole-v1, ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.ale import import_ale, unknown_id
from edgerl.envs.gym_image import image_spec, is_image
from edgerl.envs.gym_warnings import gym_warnings_logged
from edgerl.envs.screens import keep_screens
from edgerl.envs.spec import EnvSpec, Step, VecEnv
from edgerl.errors import ConfigError, EnvError


def gym_spec(env_id: str, kwargs: dict[str, Any] | None = None) -> EnvSpec:
    import gymnasium as gym
    from gymnasium import spaces

    import_ale()  # registers the Atari ids (Pong-v4, ...) so they are found and explained
    if kwargs and "render_mode" in kwargs:
        raise ConfigError(
            "env.make_kwargs cannot set render_mode: edgerl asks for the screen itself where it "
            "shows or records one"
        )
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        raise unknown_id(env_id) from None
    try:
        with gym_warnings_logged():
            env = gym.make(spec, **(kwargs or {}))
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"environment '{env_id}' needs a package that is missing: {e}") from None
    except (TypeError, ValueError) as e:  # a keyword the game does not take, or a value
        if not kwargs:
            raise EnvError(f"environment '{env_id}' cannot be made: {e}") from None
        raise ConfigError(f"env.make_kwargs does not suit {env_id}: {e}") from None
    try:
        act, obs = env.action_space, env.observation_space
        if not isinstance(act, spaces.Discrete):
            raise EnvError(
                f"environment '{env_id}' has a continuous action space ({act}); "
                "DQN needs a discrete one (e.g. CartPole-v1 or an ALE/<Game>-v5 id; some games "
                "take one in env.make_kwargs, as CarRacing-v3 does with '{continuous = false}')"
            )
        meanings = tuple(str(i) for i in range(int(act.n)))
        game = spec.kwargs.get("game") if "ale_py" in str(spec.entry_point) else None
        atari = ""  # an Atari game through gymnasium's id: ALE's own family plays it properly
        if isinstance(game, str):
            camel = "".join(part.capitalize() for part in game.split("_"))
            atari = f" (use ALE/{camel}-v5 for Atari with DQN preprocessing)"
        if is_image(obs) and not atari:
            return image_spec(env_id, int(act.n), meanings)
        if atari or not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
            raise EnvError(
                f"environment '{env_id}' has observations of shape {getattr(obs, 'shape', obs)}; "
                f"edgerl handles pictures (uint8, height x width x 1 or 3) and flat "
                f"vectors{atari}"
            )
        return EnvSpec(env_id, "vector", (int(obs.shape[0]),), "float32", int(act.n), meanings)
    finally:
        env.close()


class GymVecEnv(VecEnv):
    """Any other discrete-action gymnasium id through ``gymnasium.vector.SyncVectorEnv``."""

    def __init__(
        self,
        cfg: EnvConfig,
        spec: EnvSpec,
        kwargs: dict[str, Any],
        check_stop: Callable[[], None] = lambda: None,
        screens: bool = False,
    ) -> None:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        def one() -> Any:
            check_stop()  # many environments take minutes to build: a stop must not wait
            with gym_warnings_logged():
                if screens:
                    env = gym.make(cfg.id, render_mode="rgb_array", **kwargs)
                    return keep_screens(env, cfg.id)
                return gym.make(cfg.id, **kwargs)

        self._env = SyncVectorEnv([one] * cfg.num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = cfg.num_envs
        self.spec = spec
        self._screens = screens
        self._actions: np.ndarray | None = None
        fps = self._env.envs[0].metadata.get("render_fps")
        if fps:
            self.steps_per_second = float(fps)

    def reset(self, seed: int) -> np.ndarray:
        obs, _ = self._env.reset(seed=int(seed))
        return obs.astype(np.float32, copy=False)

    def screen(self, index: int = 0, final: bool = False) -> np.ndarray | None:
        if not self._screens:
            return None
        keeper = self._env.envs[index]
        return keeper.final if final else keeper.screen

    def send(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions, dtype=np.int64)

    def recv(self) -> Step:
        if self._actions is None:
            raise RuntimeError("recv() without send()")
        obs, rewards, terminated, truncated, info = self._env.step(self._actions)
        self._actions = None
        done = terminated | truncated
        final = None
        if done.any():
            final = np.zeros_like(obs, dtype=np.float32)
            for i in np.flatnonzero(info["_final_obs"]):
                final[i] = info["final_obs"][i]
        return Step(
            obs.astype(np.float32, copy=False),
            np.asarray(rewards, dtype=np.float32),
            terminated,
            truncated,
            final,
        )

    def close(self) -> None:
        self._env.close()
