"""Environments: ALE's C++ vector env for Atari, gymnasium's vector env for anything else.

One module per family, each with its class: ``ale.py`` (``ALE/<Game>-v5``: :class:`AleVecEnv`),
``gym_image.py`` (gymnasium games that show pictures, made into ALE's frame stacks:
:class:`GymImageVecEnv`), ``gym_vector.py`` (gymnasium games with flat vector observations:
:class:`GymVecEnv`, and what both gymnasium families read: the registry, ``env.make_kwargs``),
``actions.py`` (a gymnasium game's actions, discrete or a bounded vector, and their clipping);
what they share is ``spec.py`` (:class:`EnvSpec`, :class:`Step`, :class:`VecEnv`). This module
picks the family for an id (:func:`probe`, :func:`make_env`).

All are wrapped in :class:`VecEnv`, which has one contract the trainer relies on:

* observations are batched numpy arrays: uint8 ``(N, 4, 84, 84)`` frame stacks for Atari (84x84
  grey, frame skip 4, max-pool over the last two frames, noop starts, fire reset; the frames before
  an episode's first are zeros) and for picture games (the same, without noops and fire),
  float32 ``(N, D)`` for vector observations;
* actions are int64 ``(N,)`` for a discrete game and float32 ``(N, *spec.action_shape)`` for a
  continuous one (:attr:`EnvSpec.continuous`), which the env clips to the game's bounds before
  the game sees them (CleanRL's ``ClipAction``; :mod:`edgerl.envs.actions`);
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

from collections.abc import Callable, Sequence

import numpy as np

from edgerl.config import EnvConfig
from edgerl.envs.actions import (
    greedy_actions,
    random_actions,
    refuse_continuous,
    shown_action,
    training_learner,
    with_random_vectors,
)
from edgerl.envs.ale import AleVecEnv, ale_game, canonical_id, known_ids, rom_exists, unknown_id
from edgerl.envs.gym_image import GymImageVecEnv
from edgerl.envs.gym_vector import GymVecEnv, gym_spec
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
    short_env_name,
)
from edgerl.errors import ConfigError, EnvError

__all__ = [
    "ALE_HZ",
    "FRAME_SIZE",
    "FRAME_SKIP",
    "FRAME_STACK",
    "SCREEN_HEIGHT",
    "SCREEN_WIDTH",
    "AleVecEnv",
    "EnvSpec",
    "GymImageVecEnv",
    "GymVecEnv",
    "Step",
    "VecEnv",
    "ale_game",
    "canonical_id",
    "greedy_actions",
    "longest_episode",
    "make_env",
    "probe",
    "random_actions",
    "refuse_continuous",
    "short_env_name",
    "shown_action",
    "training_learner",
    "with_random_vectors",
]


def probe(env: str | EnvConfig) -> EnvSpec:
    """Describe an environment (an id, or ``[env]`` settings where ``env.make_kwargs`` matters)
    without keeping it; raises EnvError if it is unknown or unusable, ConfigError for
    ``env.make_kwargs`` it cannot take."""
    cfg = env if isinstance(env, EnvConfig) else EnvConfig(id=env)
    env_id = cfg.id
    game = ale_game(env_id)
    if game is not None:
        if not rom_exists(game):
            raise unknown_id(env_id)
        if env_id not in known_ids():
            # ALE ships the ROM but registers no single-player game for it (Combat, Joust,
            # Maze Craze, Warlords, 3-D Tic-Tac-Toe): building it ends the process from C++.
            raise EnvError(
                f"{env_id} is a game ALE ships but cannot play with one agent (gymnasium "
                "registers no environment for it); pick another ALE/<Game>-v5 game"
            )
        check_no_kwargs(cfg)
        made = make_env(EnvConfig(id=env_id, num_envs=1, threads=1))
        try:
            return made.spec
        finally:
            made.close()
    return gym_spec(env_id, cfg.make_kwargs)


def longest_episode(cfg: EnvConfig) -> int | None:
    """The most agent steps an episode of ``cfg``'s game can last: an Atari game's
    ``env.max_episode_frames`` in steps of :data:`FRAME_SKIP` frames, a gymnasium id's
    TimeLimit; None where nothing caps it."""
    if ale_game(cfg.id) is not None:
        return -(-cfg.max_episode_frames // FRAME_SKIP)
    import gymnasium

    try:
        limit = gymnasium.spec(cfg.id).max_episode_steps
    except gymnasium.error.Error:
        return None
    return int(limit) if limit else None


# The length of play the human reference scores were measured over (Mnih et al. 2015: about 5
# minutes, 18,000 frames at 60 frames/s), which human-normalised scores divide by.
REFERENCE_FRAMES = 18_000


def reference_steps(cfg: EnvConfig) -> int | None:
    """The agent steps of :data:`REFERENCE_FRAMES` in ``cfg``'s Atari game (None for others,
    which have no human reference)."""
    if ale_game(cfg.id) is None:
        return None
    return REFERENCE_FRAMES // FRAME_SKIP


def within_reference(returns: Sequence[float], within: Sequence[float], digits: int) -> str:
    """``"; X within 5 minutes each"``: the mean of ``within`` (each episode's return over its
    first :data:`REFERENCE_FRAMES`), where it was measured and differs from ``returns`` (whole
    episodes); else empty. Evaluations and ``edgerl play`` end their lines with it."""
    if not within or np.allclose(within, returns):
        return ""
    return f"; {np.mean(within):.{digits}f} within 5 minutes each"  # 18,000 frames at 60 a second


def check_no_kwargs(cfg: EnvConfig) -> None:
    """Raise ConfigError where ``env.make_kwargs`` is given for an ALE game (its settings are
    ``[env]`` keys)."""
    if cfg.make_kwargs:
        raise ConfigError(
            f"env.make_kwargs is for gymnasium ids; {cfg.id} is set by the [env] keys "
            "(repeat_action_probability, noop_max, max_episode_frames)"
        )


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
        if not rom_exists(game):
            raise unknown_id(cfg.id)
        check_no_kwargs(cfg)
        return AleVecEnv(cfg, game, screens, check_stop)
    kwargs = cfg.make_kwargs
    spec = spec or gym_spec(cfg.id, kwargs)
    if spec.has_frames:
        return GymImageVecEnv(cfg, spec, kwargs, check_stop, screens)
    return GymVecEnv(cfg, spec, kwargs, check_stop, screens)
