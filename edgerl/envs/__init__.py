"""Environments: ALE's C++ vector env for Atari, gymnasium's vector env for anything else.

Both are wrapped in :class:`VecEnv`, which has one contract the trainer relies on:

* observations are batched numpy arrays: uint8 ``(N, 4, 84, 84)`` frame stacks for Atari (84x84
  grey, frame skip 4, max-pool over the last two frames, noop starts, fire reset; the frames before
  an episode's first are zeros), float32 ``(N, D)`` for vector observations;
* rewards are the environment's real rewards (the trainer clips them for learning, so that episode
  returns are reported in game points);
* environments reset themselves in the same step that ends an episode: ``obs`` is then the first
  observation of the next episode and ``final_obs`` holds the last one of the finished episode.

``send()``/``recv()`` split a step so that emulation (in ALE's threads, without the GIL) overlaps
with work on the learner. With ``env.batch_size`` below ``env.num_envs`` (Atari only), ALE runs
asynchronously: ``recv()`` returns the first ``batch_size`` environments to finish, named by
``Step.env_ids`` (and ``reset_ids`` after a reset), and ``send()`` acts for exactly those, while
the others go on emulating. A row may then be an environment's first observation after the
reset (``reset_ids`` names only the first batch).

Made with ``screens=True`` (for recordings), an environment also keeps what a person would see:
``screen()`` is the colour screen after the latest reset or step. ALE's vector env hands out only
the preprocessed observation, so for Atari a second vector env of the same game, settings and seed
runs in lockstep and returns the raw 210x160 colour screen instead (emulation is deterministic
given the seed and the actions: their rewards and episode ends are checked to agree).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.gym_warnings import gym_warnings_logged
from edgerl.envs.screens import keep_screens
from edgerl.errors import EnvError

log = logging.getLogger(__name__)

ALE_ID = re.compile(r"^ALE/(?P<game>[A-Za-z0-9]+)-v5$")
FRAME_STACK = 4
FRAME_SIZE = 84
FRAME_SKIP = 4
ALE_HZ = 60.0  # the Atari's frame rate
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
        """The spec :meth:`to_dict` wrote; raises KeyError/TypeError when fields are missing."""
        return cls(
            d["id"],
            d["kind"],
            tuple(d["obs_shape"]),
            d["obs_dtype"],
            int(d["num_actions"]),
            tuple(d["action_meanings"]),
        )


class Step(NamedTuple):
    obs: np.ndarray
    rewards: np.ndarray  # float32, unclipped
    terminated: np.ndarray  # bool
    truncated: np.ndarray  # bool
    final_obs: np.ndarray | None  # rows valid where terminated | truncated
    env_ids: np.ndarray | None = None  # the environment of each row; None: all, in order


def _import_ale() -> Any:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return ale_py


def _known_ids() -> list[str]:
    import gymnasium as gym

    _import_ale()
    return list(gym.registry.keys())


def canonical_id(env_id: str) -> str:
    """The registered spelling of an id typed in another case (``ALE/pong-v5`` ->
    ``ALE/Pong-v5``), so one game has one run directory; other ids come back unchanged."""
    if ale_game(env_id) is None and "/" not in env_id and "-v" not in env_id:
        return env_id  # a bare name: nothing to respell, _unknown suggests the ALE id
    ids = _known_ids()
    if env_id in ids:
        return env_id
    return {i.lower(): i for i in ids}.get(env_id.lower(), env_id)


def _unknown(env_id: str) -> EnvError:
    ids = _known_ids()
    # A bare game name ("Pong", "pong-v4") means the Atari game: edgerl's ids are ALE/<Game>-v5
    # (gymnasium's Pong-v4 is also registered but has no DQN preprocessing).
    base = env_id.split("/")[-1].split("-v")[0].replace("_", "").lower()
    atari = [i for i in ids if i.startswith("ALE/") and i.endswith("-v5")]
    close = [i for i in atari if i[4:-3].lower() == base]
    if not close:
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return EnvError(f"unknown environment id '{env_id}'{hint}")


def _rom_exists(game: str) -> bool:
    return game in _import_ale().roms.get_all_rom_ids()


def ale_game(env_id: str) -> str | None:
    """The ALE ROM name for an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``)."""
    m = ALE_ID.match(env_id)
    if not m:
        return None
    return re.sub(r"(?<!^)(?=[A-Z])", "_", m.group("game")).lower()


def probe(env_id: str) -> EnvSpec:
    """Describe an environment without keeping it; raises EnvError if it is unknown or unusable."""
    game = ale_game(env_id)
    if game is not None:
        if not _rom_exists(game):
            raise _unknown(env_id)
        if env_id not in _known_ids():
            # ALE ships the ROM but registers no single-player game for it (Combat, Joust,
            # Maze Craze, Warlords, 3-D Tic-Tac-Toe): building it ends the process from C++.
            raise EnvError(
                f"{env_id} is a game ALE ships but cannot play with one agent (gymnasium "
                "registers no environment for it); pick another ALE/<Game>-v5 game"
            )
        env = make_env(EnvConfig(id=env_id, num_envs=1, threads=1))
        try:
            return env.spec
        finally:
            env.close()
    return _gym_spec(env_id)


def _gym_spec(env_id: str) -> EnvSpec:
    import gymnasium as gym
    from gymnasium import spaces

    _import_ale()  # registers the Atari ids (Pong-v4, ...) so they are found and explained
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        raise _unknown(env_id) from None
    try:
        with gym_warnings_logged():
            env = gym.make(spec)
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"environment '{env_id}' needs a package that is missing: {e}") from None
    try:
        act, obs = env.action_space, env.observation_space
        if not isinstance(act, spaces.Discrete):
            raise EnvError(
                f"environment '{env_id}' has a continuous action space ({act}); "
                "DQN needs a discrete one (e.g. CartPole-v1 or an ALE/<Game>-v5 id)"
            )
        if not isinstance(obs, spaces.Box) or len(obs.shape) != 1:
            hint = ""
            game = spec.kwargs.get("game") if "ale_py" in str(spec.entry_point) else None
            if isinstance(game, str):
                camel = "".join(part.capitalize() for part in game.split("_"))
                hint = f" (use ALE/{camel}-v5 for Atari with DQN preprocessing)"
            raise EnvError(
                f"environment '{env_id}' has observations of shape {getattr(obs, 'shape', obs)}; "
                f"edgerl handles Atari frames and flat vectors{hint}"
            )
        meanings = tuple(str(i) for i in range(int(act.n)))
        return EnvSpec(env_id, "vector", (int(obs.shape[0]),), "float32", int(act.n), meanings)
    finally:
        env.close()


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


class AleVecEnv(VecEnv):
    """Atari through ``ale_py.vector_env.AtariVectorEnv`` (preprocessing in C++ threads)."""

    steps_per_second = ALE_HZ / FRAME_SKIP

    def __init__(self, cfg: EnvConfig, game: str, screens: bool = False) -> None:
        _import_ale()
        from ale_py.vector_env import AtariVectorEnv
        from gymnasium.vector import AutoresetMode

        threads = cfg.threads or min(cfg.num_envs, os.cpu_count() or 1)
        batch = cfg.batch_size if 0 < cfg.batch_size < cfg.num_envs else 0
        self._batched = batch > 0
        common: dict[str, Any] = {
            "num_threads": threads,
            "repeat_action_probability": cfg.repeat_action_probability,
            "max_num_frames_per_episode": cfg.max_episode_frames,
            "noop_max": cfg.noop_max,
            "frameskip": FRAME_SKIP,
            "reward_clipping": False,
            "use_fire_reset": True,
            "autoreset_mode": AutoresetMode.SAME_STEP,
        }
        self._env = AtariVectorEnv(
            game,
            cfg.num_envs,
            img_height=FRAME_SIZE,
            img_width=FRAME_SIZE,
            stack_num=FRAME_STACK,
            grayscale=True,
            maxpool=True,
            batch_size=batch,
            **common,
        )
        # The screen as the emulator drew it at the step's last frame (not max-pooled: a max
        # of two colour frames mixes colours the game never shows).
        self._screens = (
            AtariVectorEnv(
                game,
                cfg.num_envs,
                img_height=SCREEN_HEIGHT,
                img_width=SCREEN_WIDTH,
                stack_num=1,
                grayscale=False,
                maxpool=False,
                **common,
            )
            if screens
            else None
        )
        self._screen: np.ndarray | None = None
        self._final_screen: np.ndarray | None = None
        meanings = tuple(a.name for a in self._env.ale.get_action_set())
        self.num_envs = cfg.num_envs
        self.spec = EnvSpec(
            cfg.id,
            "frames",
            (FRAME_STACK, FRAME_SIZE, FRAME_SIZE),
            "uint8",
            len(meanings),
            meanings,
        )

    def reset(self, seed: int) -> np.ndarray:
        # ALE seeds environment i with seed + i, an int32: env.seed plus the step (a resume
        # reseeds at it) plus the environment's index must stay below 2**31.
        seed = int(seed) % ((1 << 31) - self.num_envs)
        obs, info = self._env.reset(seed=seed)
        self.reset_ids = np.asarray(info["env_id"], dtype=np.int64) if self._batched else None
        if self._screens is not None:
            screens, _ = self._screens.reset(seed=seed)
            self._screen, self._final_screen = screens[:, 0], None
        return obs

    def send(self, actions: np.ndarray) -> None:
        self._env.send(np.asarray(actions, dtype=np.int64))
        if self._screens is not None:
            self._screens.send(np.asarray(actions, dtype=np.int64))

    def recv(self) -> Step:
        obs, rewards, terminated, truncated, info = self._env.recv()
        done = terminated | truncated
        final = info.get("final_obs") if done.any() else None
        if self._screens is not None:
            screens, s_rewards, s_terminated, s_truncated, s_info = self._screens.recv()
            if not (
                np.array_equal(rewards, s_rewards)
                and np.array_equal(terminated, s_terminated)
                and np.array_equal(truncated, s_truncated)
            ):
                raise RuntimeError("the screen environment left the played one's lockstep")
            self._screen = screens[:, 0]
            self._final_screen = s_info["final_obs"][:, 0] if done.any() else None
        ids = np.asarray(info["env_id"], dtype=np.int64) if self._batched else None
        return Step(obs, rewards.astype(np.float32), terminated, truncated, final, ids)

    def screen(self, index: int = 0, final: bool = False) -> np.ndarray | None:
        shown = self._final_screen if final else self._screen
        return None if shown is None else shown[index]

    def close(self) -> None:
        self._env.close()
        if self._screens is not None:
            self._screens.close()


class GymVecEnv(VecEnv):
    """Any other discrete-action gymnasium id through ``gymnasium.vector.SyncVectorEnv``."""

    def __init__(
        self,
        cfg: EnvConfig,
        spec: EnvSpec,
        check_stop: Callable[[], None] = lambda: None,
        screens: bool = False,
    ) -> None:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        def one() -> Any:
            check_stop()  # many environments take minutes to build: a stop must not wait
            with gym_warnings_logged():
                if screens:
                    return keep_screens(gym.make(cfg.id, render_mode="rgb_array"), cfg.id)
                return gym.make(cfg.id)

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


def make_env(
    cfg: EnvConfig,
    spec: EnvSpec | None = None,
    check_stop: Callable[[], None] = lambda: None,
    screens: bool = False,
) -> VecEnv:
    """Build ``cfg.num_envs`` environments for ``cfg.id``; raises EnvError for unusable ids.

    ``check_stop`` is called between environments built in Python and may raise to abandon them.
    ``screens``: also keep the colour screen (see :meth:`VecEnv.screen`), for recordings; an
    environment that cannot draw one raises EnvError (MissingDependencyError without pygame) at
    its first reset.
    """
    game = ale_game(cfg.id)
    if game is not None:
        if not _rom_exists(game):
            raise _unknown(cfg.id)
        check_stop()
        return AleVecEnv(cfg, game, screens)
    return GymVecEnv(cfg, spec or _gym_spec(cfg.id), check_stop, screens)
