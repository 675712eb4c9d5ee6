"""What watches a policy play besides the screen: a recording of the episodes, and the episode log.

:class:`Filming` records the played episodes (see :mod:`edgerl.play.record`): the colour screen, or
the agent's own view, one frame after each reset and one after each step (the last of an episode
included), each with its episode and score beneath it, at the game's pace whatever
``PlayOptions.fps``. Nothing is written under the file's name when playing fails, is interrupted
or stopped. The live view of ``edgerl play --render`` is
:class:`edgerl.display.render.PlayRenderer`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import numpy as np

from edgerl.envs import EnvSpec, VecEnv
from edgerl.errors import EnvError
from edgerl.play.observer import Moment, Observer
from edgerl.play.record import Recorder, open_recorder
from edgerl.words import plural

log = logging.getLogger(__name__)

RECORD_VIEWS = ("screen", "agent")  # the colour screen, or the agent's 84x84 grey frame
PROGRESS_S = 10.0  # EpisodeLog says how far a long episode is this often
AGENT_VIEW_SCALE = 2  # the agent's frame is small: each pixel becomes 2x2 in a recording


class Filming(Observer):
    """Records the episodes played to ``path`` (a GIF or MP4): what ``view`` shows, captioned.

    Raises ValueError for an unknown ``view`` and EnvError for the agent's view of a policy on
    vector observations (``spec``: the policy's); RecordError / MissingDependencyError when playing
    begins if the recording cannot be made.
    """

    def __init__(self, path: Path, spec: EnvSpec, view: str = "screen") -> None:
        if view not in RECORD_VIEWS:
            raise ValueError(f"record_view must be one of {RECORD_VIEWS}, not {view!r}")
        if view == "agent" and not spec.has_frames:
            raise EnvError(
                f"{spec.id} has vector observations, not frames: there is no agent's view to "
                "record; record its screen instead"
            )
        self.path, self.view = path, view
        self.screens = view == "screen"
        self._env: VecEnv | None = None
        self._recorder: Recorder | None = None

    def on_start(self, env: VecEnv, cleanup: contextlib.ExitStack) -> None:
        # Leaving the block by an exception (Ctrl-C included) discards the recording.
        self._env = env
        self._recorder = cleanup.enter_context(open_recorder(self.path, env.steps_per_second))

    def on_reset(self, obs: np.ndarray, episode: int) -> None:
        self._film(obs, episode, 0.0)

    def on_step(self, moment: Moment) -> bool:
        if moment.final_obs is not None:
            self._film(moment.final_obs, moment.episode, moment.ret, final=True)
        else:
            self._film(moment.next_obs, moment.episode, moment.ret)
        return True

    def on_end(self, stopped: bool) -> None:
        assert self._recorder is not None
        if stopped:
            self._recorder.abort()  # an episode cut short by a stop is no recording of it
        else:
            self.recording = self._recorder.close()

    def _film(self, obs: np.ndarray, episode: int, ret: float, final: bool = False) -> None:
        """Add the frame after a reset or step (``final``: the last of an episode, whose
        observation is the step's ``final_obs``)."""
        assert self._env is not None and self._recorder is not None
        if self.view == "agent":
            frame = obs[-1]  # the newest frame of the stack
            frame = frame.repeat(AGENT_VIEW_SCALE, axis=0).repeat(AGENT_VIEW_SCALE, axis=1)
        else:
            screen = self._env.screen(0, final=final)
            assert screen is not None  # the env was made with screens=True
            frame = screen
        self._recorder.add(frame, caption=f"episode {episode}  score {ret:+.0f}")


class EpisodeLog(Observer):
    """Logs each episode's return and length as it ends, and every :data:`PROGRESS_S` where
    one runs long (an Atari episode can run for minutes), how far it is."""

    def __init__(self) -> None:
        self.length = 0  # steps of the episode under way
        self.said = time.monotonic()

    def on_step(self, moment: Moment) -> bool:
        self.length += 1
        now = time.monotonic()
        if now - self.said >= PROGRESS_S:
            self.said = now
            log.info(
                "episode %d: %s steps so far, return %.1f",
                moment.episode,
                f"{self.length:,}",
                moment.ret,
            )
        return True

    def on_episode(self, episode: int, ret: float, length: int) -> None:
        log.info("episode %d: return %.1f after %s", episode, ret, plural(length, "step"))
        self.length, self.said = 0, time.monotonic()
