"""Any other gymnasium game: its description read from the registry with ``env.make_kwargs``
(pictures go to :mod:`edgerl.envs.gym_image`; the actions, discrete or a bounded vector, are
read by :mod:`edgerl.envs.actions`), and :class:`GymVecEnv` around gymnasium's
``SyncVectorEnv`` for flat vector observations (CartPole-v1, Pendulum-v1, MuJoCo's tasks, ...).
A continuous game's actions are clipped to their bounds before the game sees them, as CleanRL's
``ClipAction`` wrapper does (:class:`~edgerl.envs.actions.ToGame`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.actions import ToGame, game_actions
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
        # MuJoCo's tasks name gymnasium's extra; edgerl's own installs what they need.
        ours = "; edgerl's extra installs it: pip install 'edgerl[mujoco]'"
        extra = ours if "mujoco" in str(e).lower() else ""
        raise EnvError(
            f"environment '{env_id}' needs a package that is missing: {e}{extra}"
        ) from None
    except (TypeError, ValueError) as e:  # a keyword the game does not take, or a value
        if not kwargs:
            raise EnvError(f"environment '{env_id}' cannot be made: {e}") from None
        raise ConfigError(f"env.make_kwargs does not suit {env_id}: {e}") from None
    try:
        actions = game_actions(env_id, env.action_space)
        obs = env.observation_space
        game = spec.kwargs.get("game") if "ale_py" in str(spec.entry_point) else None
        atari = ""  # an Atari game through gymnasium's id: ALE's own family plays it properly
        if isinstance(game, str):
            camel = "".join(part.capitalize() for part in game.split("_"))
            atari = f" (use ALE/{camel}-v5 for Atari with DQN preprocessing)"
        if is_image(obs) and not atari:
            return image_spec(env_id, actions)
        if atari or not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
            raise EnvError(
                f"environment '{env_id}' has observations of shape {getattr(obs, 'shape', obs)}; "
                f"edgerl handles pictures (uint8, height x width x 1 or 3) and flat "
                f"vectors{atari}"
            )
        return actions.spec(env_id, "vector", (int(obs.shape[0]),), "float32")
    finally:
        env.close()


class GymVecEnv(VecEnv):
    """Any other gymnasium id with vector observations through
    ``gymnasium.vector.SyncVectorEnv``; :meth:`send` takes int64 ``(num_envs,)`` actions, or
    float32 ``(num_envs, numbers)`` for a continuous game, clipped to its bounds."""

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
        self._to_game = ToGame(spec, cfg.num_envs)
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
        self._actions = self._to_game(actions)

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
