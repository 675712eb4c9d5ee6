"""Real environments: ALE's vector env for Pong, gymnasium's for CartPole, and bad ids."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgerl.config import EnvConfig
from edgerl.envs import ale_game, make_env, probe
from edgerl.errors import EnvError


def test_pong_frames_are_preprocessed_stacks():
    with make_env(EnvConfig(id="ALE/Pong-v5", num_envs=2)) as env:
        assert env.spec.kind == "frames"
        assert env.spec.obs_shape == (4, 84, 84) and env.spec.num_actions == 6
        assert env.spec.action_meanings[:2] == ("NOOP", "FIRE")
        obs = env.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert not obs[:, :3].any() and obs[:, 3].any()  # zeros before the first frame
        env.send(np.array([0, 1]))
        step = env.recv()
        assert step.obs.shape == (2, 4, 84, 84)
        assert step.rewards.dtype == np.float32
        np.testing.assert_array_equal(step.obs[:, 2], obs[:, 3])  # the stack shifts


def ale_threads_cpus(before: set[str]) -> list[str]:
    """The CPU lists of this process's threads started since ``before`` (ALE's)."""
    found = []
    for tid in sorted(set(os.listdir("/proc/self/task")) - before):
        status = Path(f"/proc/self/task/{tid}/status").read_text()
        found += [line.split()[1] for line in status.splitlines() if "Cpus_allowed_list" in line]
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("pin", ["on", "off"])
def test_pinned_emulator_threads_leave_the_first_cpu_to_the_python_loop(pin):
    cpus = sorted(os.sched_getaffinity(0))
    before = set(os.listdir("/proc/self/task"))
    with make_env(EnvConfig(id="ALE/Pong-v5", num_envs=4, pin_threads=pin)) as env:
        env.reset(seed=0)
        lists = ale_threads_cpus(before)
        assert lists  # ALE's pool started its threads
        if pin == "on":
            assert env.threads <= len(cpus) - 1
            # One CPU each, never the first: that one is the Python loop's.
            assert all(str(cpus[0]) != cpus_of and "-" not in cpus_of for cpus_of in lists)
        else:
            assert all(cpus_of == ",".join(map(str, cpus)) or "-" in cpus_of for cpus_of in lists)
    assert os.sched_getaffinity(0) == set(cpus)  # the loop's own thread is left as it was


@pytest.mark.parametrize("seed", [2**31 - 1, 2**31 + 5, 10**12])
def test_every_atari_environment_starts_at_any_seed_a_run_reaches(seed):
    # env.seed may be up to 2**31 - 1 and a resume reseeds at env.seed plus the step; ALE adds
    # each environment's index to an int32 seed.
    with make_env(EnvConfig(id="ALE/Pong-v5", num_envs=3)) as env:
        assert env.reset(seed=seed).shape == (3, 4, 84, 84)


def test_atari_returns_real_rewards_and_final_observations():
    cfg = EnvConfig(id="ALE/Pong-v5", num_envs=1, max_episode_frames=400)
    with make_env(cfg) as env:
        env.reset(seed=1)
        for _ in range(200):
            step = env.step(np.array([0]))
            if step.truncated[0]:
                break
        assert step.truncated[0]
        assert step.final_obs is not None and step.final_obs[0, 3].any()
        assert not step.obs[0, :3].any()  # already the next episode's first observation


def test_only_atari_rewards_are_clipped_for_learning():
    rewards = np.array([-7.0, -0.5, 0.0, 3.0], dtype=np.float32)
    clipped = probe("ALE/Pong-v5").learning_rewards(rewards)
    assert clipped.tolist() == [-1.0, -0.5, 0.0, 1.0] and clipped.dtype == np.float32
    assert probe("CartPole-v1").learning_rewards(rewards).tolist() == rewards.tolist()
    pytest.importorskip("Box2D", reason="CarRacing needs the box2d extra")
    car = probe("CarRacing-v3")  # frames, but no Atari game: its rewards as they are
    assert car.has_frames and car.learning_rewards(rewards).tolist() == rewards.tolist()


def test_cartpole_is_a_vector_env_with_final_observations():
    with make_env(EnvConfig(id="CartPole-v1", num_envs=2)) as env:
        assert env.spec.kind == "vector" and env.spec.obs_shape == (4,)
        env.reset(seed=0)
        for _ in range(500):
            step = env.step(np.zeros(2, dtype=np.int64))
            if step.terminated.any():
                break
        i = int(np.flatnonzero(step.terminated)[0])
        assert step.final_obs is not None
        assert abs(step.final_obs[i, 2]) > 0.2  # the pole fell: the last observation shows it
        assert abs(step.obs[i, 2]) < 0.06  # the reset observation


@pytest.mark.parametrize(
    ("env_id", "name"),
    [
        ("ALE/Pong-v5", "pong"),
        ("ALE/MsPacman-v5", "ms_pacman"),
        ("ALE/SpaceInvaders-v5", "space_invaders"),
        ("CartPole-v1", None),
        ("Pong-v4", None),
    ],
)
def test_ale_game_names(env_id, name):
    assert ale_game(env_id) == name


def test_unknown_ids_suggest_close_names():
    with pytest.raises(
        EnvError, match=r"unknown environment id 'ALE/Pongg-v5'; did you mean 'ALE/Pong-v5'"
    ):
        probe("ALE/Pongg-v5")
    with pytest.raises(EnvError, match=r"did you mean 'CartPole-v1'"):
        probe("CartPol-v1")
    with pytest.raises(EnvError, match=r"^unknown environment id 'zzzz'$"):
        probe("zzzz")


def test_discrete_actions_sent_to_a_continuous_game_are_refused():
    """Pendulum-v1 is a game edgerl describes (tests/test_continuous_envs.py); a learner that
    picks one of a few actions sends it one int per environment, which is one sentence."""
    assert probe("Pendulum-v1").continuous
    with make_env(EnvConfig(id="Pendulum-v1", num_envs=2)) as env:
        env.reset(seed=0)
        with pytest.raises(EnvError, match=r"continuous action space .* discrete actions"):
            env.send(np.zeros(2, dtype=np.int64))


def test_raw_image_observations_point_to_the_ale_id():
    with pytest.raises(EnvError, match=r"\(210, 160, 3\).*use ALE/Pong-v5 for Atari"):
        probe("Pong-v4")


def test_gymnasiums_warnings_are_plain_log_lines(tmp_path):
    """gymnasium colours its warnings whatever the stream: `[33mWARN: ...` in a log. A real
    process: a warning shown once in a process would not be seen again here."""
    from .conftest import run_edgerl

    run = tmp_path / "cp0"
    r = run_edgerl("train", "--env", "CartPole-v0", "--steps", "50", "--run-dir", run, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "WARNING gymnasium: The environment CartPole-v0 is out of date" in r.stderr
    assert "\x1b" not in r.stderr and "logger.deprecation" not in r.stderr


@pytest.mark.parametrize("game", ["Combat", "Joust", "MazeCraze", "Warlords"])
def test_a_rom_ale_cannot_play_alone_is_refused_before_anything_starts(tmp_path, game):
    """ALE ships these ROMs but builds no single-agent game from them: its C++ ended the process
    with exit 1 and its own lines (so this runs in a process of its own). Now one sentence,
    exit 2, nothing written."""
    from .conftest import run_edgerl

    run = tmp_path / "run"
    r = run_edgerl("train", "--env", f"ALE/{game}-v5", "--steps", "100", "--run-dir", run)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"ALE/{game}-v5 is a game ALE ships but cannot play with one agent" in r.stderr
    assert not run.exists()


def test_the_longest_episode_is_the_games_own_cap():
    """What a fleet's answers are held to: ALE's frame cap in agent steps, gymnasium's
    TimeLimit, nothing where neither caps an episode."""
    from edgerl.config import EnvConfig
    from edgerl.envs import longest_episode

    assert longest_episode(EnvConfig(id="ALE/Pong-v5")) == 27_000
    assert longest_episode(EnvConfig(id="ALE/Frostbite-v5", max_episode_frames=20_000)) == 5_000
    assert longest_episode(EnvConfig(id="CartPole-v1")) == 500
    assert longest_episode(EnvConfig(id="NoSuchGame-v0")) is None
