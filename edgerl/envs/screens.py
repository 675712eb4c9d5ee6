"""The colour screen of a gymnasium environment, kept for recordings: rendered after every reset
and step, so that an episode's last screen survives the vector env's reset in the same step."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerl.errors import EnvError, MissingDependencyError


def keep_screens(env: Any, env_id: str) -> Any:
    """``env`` (made with render_mode="rgb_array") rendering after every reset and step, so that
    the last screen of an episode survives the vector env's reset in the same step."""
    import gymnasium as gym

    class ScreenKeeper(gym.Wrapper):  # type: ignore[misc]
        screen: np.ndarray | None = None  # after the latest reset or step
        final: np.ndarray | None = None  # the last screen before the latest reset

        def _render(self) -> np.ndarray:
            try:
                frame = self.env.render()
            except gym.error.DependencyNotInstalled as e:
                raise MissingDependencyError(
                    "pygame", "viewer", f"drawing {env_id}'s screen ({e})"
                ) from None
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise EnvError(
                    f"environment '{env_id}' cannot draw its screen as an image (it has no "
                    "rgb_array render mode)"
                )
            return frame

        def reset(self, **kwargs: Any) -> Any:
            out = self.env.reset(**kwargs)
            self.final, self.screen = self.screen, self._render()
            return out

        def step(self, action: Any) -> Any:
            out = self.env.step(action)
            self.screen = self._render()
            return out

    return ScreenKeeper(env)
