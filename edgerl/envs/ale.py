"""The Arcade Learning Environment's family: ``ALE/<Game>-v5`` ids, their ROMs, and
:class:`AleVecEnv`, ALE's C++ vector env (preprocessing and emulation in its own threads, without
the GIL; async batches with ``env.batch_size``)."""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.spec import (
    ALE_HZ,
    FRAME_SIZE,
    FRAME_SKIP,
    FRAME_STACK,
    SCREEN_HEIGHT,
    SCREEN_WIDTH,
    EnvSpec,
    Step,
    VecEnv,
)
from edgerl.errors import EnvError
from edgerl.hw.cpus import usable_cpus

log = logging.getLogger(__name__)

ALE_ID = re.compile(r"^ALE/(?P<game>[A-Za-z0-9]+)-v5$")


def import_ale() -> Any:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return ale_py


def known_ids() -> list[str]:
    import gymnasium as gym

    import_ale()
    return list(gym.registry.keys())


def canonical_id(env_id: str) -> str:
    """The registered spelling of an id typed in another case (``ALE/pong-v5`` ->
    ``ALE/Pong-v5``), so one game has one run directory; other ids come back unchanged."""
    if ale_game(env_id) is None and "/" not in env_id and "-v" not in env_id:
        return env_id  # a bare name: nothing to respell, _unknown suggests the ALE id
    ids = known_ids()
    if env_id in ids:
        return env_id
    return {i.lower(): i for i in ids}.get(env_id.lower(), env_id)


def unknown_id(env_id: str) -> EnvError:
    ids = known_ids()
    # A bare game name ("Pong", "pong-v4") means the Atari game: edgerl's ids are ALE/<Game>-v5
    # (gymnasium's Pong-v4 is also registered but has no DQN preprocessing).
    base = env_id.split("/")[-1].split("-v")[0].replace("_", "").lower()
    atari = [i for i in ids if i.startswith("ALE/") and i.endswith("-v5")]
    close = [i for i in atari if i[4:-3].lower() == base]
    if not close:
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return EnvError(f"unknown environment id '{env_id}'{hint}")


def rom_exists(game: str) -> bool:
    return game in import_ale().roms.get_all_rom_ids()


def ale_game(env_id: str) -> str | None:
    """The ALE ROM name for an ``ALE/<Game>-v5`` id (``ALE/MsPacman-v5`` -> ``ms_pacman``)."""
    m = ALE_ID.match(env_id)
    if not m:
        return None
    return re.sub(r"(?<!^)(?=[A-Z])", "_", m.group("game")).lower()


class AleVecEnv(VecEnv):
    """Atari through ``ale_py.vector_env.AtariVectorEnv`` (preprocessing in C++ threads)."""

    steps_per_second = ALE_HZ / FRAME_SKIP

    def __init__(
        self,
        cfg: EnvConfig,
        game: str,
        screens: bool = False,
        check_stop: Callable[[], None] = lambda: None,
    ) -> None:
        """``check_stop`` is called just before ALE's one call that builds them all (it may
        raise to abandon them): a stop heard while the imports ran is not kept waiting."""
        import_ale()
        from ale_py.vector_env import AtariVectorEnv
        from gymnasium.vector import AutoresetMode

        threads = cfg.threads or min(cfg.num_envs, usable_cpus())
        offset = -1  # ALE's threads on any CPU
        cpus = sorted(os.sched_getaffinity(0))
        if cfg.pin_threads == "on" and len(cpus) >= 2:
            if cpus == list(range(cpus[0], cpus[0] + len(cpus))):  # ALE counts from an offset
                threads = min(threads, len(cpus) - 1)
                offset = cpus[0] + 1  # thread i on CPU offset + i: the first CPU is the loop's
            else:
                log.info("env.pin_threads: the CPUs here are not one range; ALE's threads float")
        self.threads = threads  # the emulator's threads
        batch = cfg.batch_size if 0 < cfg.batch_size < cfg.num_envs else 0
        self._batched = batch > 0
        common: dict[str, Any] = {
            "num_threads": threads,
            "thread_affinity_offset": offset,
            "repeat_action_probability": cfg.repeat_action_probability,
            "max_num_frames_per_episode": cfg.max_episode_frames,
            "noop_max": cfg.noop_max,
            "frameskip": FRAME_SKIP,
            "reward_clipping": False,
            "use_fire_reset": True,
            "autoreset_mode": AutoresetMode.SAME_STEP,
        }
        check_stop()
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
