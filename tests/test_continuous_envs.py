"""Games whose actions are numbers (envs/actions.py, envs/spec.py): how edgerl describes them,
with real gymnasium games (Pendulum-v1, MountainCarContinuous-v0, Box2D's LunarLanderContinuous,
BipedalWalker and CarRacing, MuJoCo's HalfCheetah-v5 where the mujoco extra is installed); the
clipping of actions to their bounds before a game sees them; the action spaces still refused;
and a game's description read back from a checkpoint's dict, old or hostile."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from edgerl.config import EnvConfig
from edgerl.envs import EnvSpec, make_env, probe, refuse_continuous
from edgerl.errors import EnvError


def test_pendulum_is_one_number_between_minus_two_and_two():
    spec = probe("Pendulum-v1")
    assert spec.continuous and spec.action_dtype == "float32"
    assert spec.action_shape == (1,) and spec.num_actions == 1
    assert (spec.action_low, spec.action_high) == ((-2.0,), (2.0,))
    assert spec.action_meanings == ("a0",)
    assert spec.kind == "vector" and spec.obs_shape == (3,)
    assert EnvSpec.from_dict(spec.to_dict()) == spec  # as a checkpoint keeps it


@pytest.mark.parametrize(
    ("env_id", "kind", "low", "high"),
    [
        ("LunarLanderContinuous-v3", "vector", (-1.0, -1.0), (1.0, 1.0)),
        ("BipedalWalker-v3", "vector", (-1.0,) * 4, (1.0,) * 4),
        ("CarRacing-v3", "frames", (-1.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # steer, gas, brake
    ],
)
def test_box2ds_continuous_games_are_described_with_their_bounds(env_id, kind, low, high):
    pytest.importorskip("Box2D", reason="needs the box2d extra")
    spec = probe(env_id)
    assert spec.kind == kind and spec.action_shape == (len(low),)
    assert (spec.action_low, spec.action_high) == (low, high)
    assert spec.action_meanings == tuple(f"a{i}" for i in range(len(low)))


def test_carracing_with_continuous_actions_steps_as_frames():
    pytest.importorskip("Box2D", reason="needs the box2d extra")
    with make_env(EnvConfig(id="CarRacing-v3", num_envs=2)) as env:
        obs = env.reset(seed=0)
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        step = env.step(np.array([[0.0, 1.0, 0.0], [-3.0, 5.0, -1.0]], dtype=np.float32))
        assert step.obs.shape == (2, 4, 84, 84) and step.rewards.shape == (2,)


def test_halfcheetah_v5_trains_from_the_mujoco_extra():
    pytest.importorskip("mujoco", reason="needs the mujoco extra: pip install 'edgerl[mujoco]'")
    spec = probe("HalfCheetah-v5")
    assert spec.kind == "vector" and spec.obs_shape == (17,)
    assert spec.action_shape == (6,) and spec.action_low == (-1.0,) * 6
    with make_env(EnvConfig(id="HalfCheetah-v5", num_envs=2), spec) as env:
        env.reset(seed=0)
        step = env.step(np.full((2, 6), 0.5, dtype=np.float32))
        assert step.obs.shape == (2, 17) and step.obs.dtype == np.float32


def one_step(env_id: str, action: float, seed: int = 3) -> tuple[np.ndarray, float, np.ndarray]:
    """The observation and reward after one step of ``action`` from ``seed``'s start, and the
    array that was sent."""
    with make_env(EnvConfig(id=env_id, num_envs=1)) as env:
        env.reset(seed=seed)
        sent = np.array([[action]], dtype=np.float32)
        step = env.step(sent)
        return step.obs[0], float(step.rewards[0]), sent


def test_an_action_beyond_its_bounds_acts_as_the_bound():
    """As CleanRL's ClipAction: the game gets the action clipped. MountainCarContinuous-v0 costs
    0.1 action^2 of the action it is given (its force is clipped by the game, its cost is not),
    so an unclipped 5.0 would cost 2.5 where 1.0 costs 0.1. The array sent is the learner's:
    a memory stores the action as chosen."""
    obs_5, reward_5, sent = one_step("MountainCarContinuous-v0", 5.0)
    obs_1, reward_1, _ = one_step("MountainCarContinuous-v0", 1.0)
    obs_half, _, _ = one_step("MountainCarContinuous-v0", 0.5)
    np.testing.assert_array_equal(obs_5, obs_1)
    assert reward_5 == reward_1 == pytest.approx(-0.1)
    assert not np.array_equal(obs_half, obs_1)  # the action does act
    assert sent[0, 0] == 5.0
    # Pendulum-v1 (bounds -2 and 2): 5.0 and -7.5 act as 2.0 and -2.0.
    for beyond, bound in ((5.0, 2.0), (-7.5, -2.0)):
        obs_b, reward_b, _ = one_step("Pendulum-v1", beyond)
        obs_2, reward_2, _ = one_step("Pendulum-v1", bound)
        np.testing.assert_array_equal(obs_b, obs_2)
        assert reward_b == reward_2


def test_a_learner_of_discrete_actions_is_told_before_anything_is_built():
    refuse_continuous(probe("CartPole-v1"), "dqn")  # nothing to say
    with pytest.raises(EnvError, match=r"^environment 'Pendulum-v1' has a continuous action space "
                       r"\(1 number per environment, within bounds\); agent.algo=dqn picks "
                       r"one of a few discrete actions: .*\{continuous = false\}'\)$"):  # fmt: skip
        refuse_continuous(probe("Pendulum-v1"), "dqn")


def test_actions_a_continuous_game_cannot_take_are_one_sentence():
    with make_env(EnvConfig(id="Pendulum-v1", num_envs=2)) as env:
        env.reset(seed=0)
        with pytest.raises(
            EnvError, match=r"shape \(2, 1\)\) and was sent actions of shape \(2,\)"
        ):
            env.send(np.zeros(2, dtype=np.int64))  # a discrete learner's
        with pytest.raises(EnvError, match=r"not all finite numbers .* diverged"):
            env.send(np.array([[0.5], [np.nan]], dtype=np.float32))
        env.send(np.array([[0.5], [-0.5]], dtype=np.float32))  # and it goes on
        assert env.recv().obs.shape == (2, 3)


class Game(gym.Env):
    """A gymnasium game of any action space, to see which ones edgerl refuses."""

    def __init__(self, action_space: Any) -> None:
        self.action_space = action_space
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(3, np.float32), 0.0, False, False, {}


@pytest.fixture
def registered() -> Iterator[Callable[[str, Any], str]]:
    """Registers a :class:`Game` of a given action space in gymnasium's registry, for the
    test only; returns its id."""
    ids: list[str] = []

    def register(name: str, space: Any) -> str:
        env_id = f"edgerl-test/{name}-v0"
        gym.register(env_id, entry_point=Game, kwargs={"action_space": space})
        ids.append(env_id)
        return env_id

    yield register
    for env_id in ids:
        gym.registry.pop(env_id, None)


@pytest.mark.parametrize(
    ("name", "space", "says"),
    [
        ("Multi", "MultiDiscrete", r"actions of the kind MultiDiscrete\(\[3 3\]\); edgerl takes"),
        ("Unbounded", "unbounded", r"actions without finite bounds.*Box\(-inf, inf"),
        ("Grid", "grid", r"actions of shape \(2, 3\).*one-dimensional Box\), of 1 to 4,096"),
        ("Whole", "ints", r"actions of int64 numbers.*of floating-point numbers"),
    ],
)
def test_action_spaces_edgerl_does_not_take_are_one_sentence(registered, name, space, says):
    spaces = gym.spaces
    made = {
        "MultiDiscrete": spaces.MultiDiscrete([3, 3]),
        "unbounded": spaces.Box(-np.inf, np.inf, (3,), np.float32),
        "grid": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
        "ints": spaces.Box(0, 9, (2,), np.int64),
    }[space]
    env_id = registered(name, made)
    with pytest.raises(EnvError, match=rf"^environment '{env_id}' has {says}"):
        probe(env_id)


# ---------------------------------------------------------------- the description in a file

# A checkpoint's game as every edgerl before continuous actions wrote it.
CARTPOLE = {
    "id": "CartPole-v1",
    "kind": "vector",
    "obs_shape": [4],
    "obs_dtype": "float32",
    "num_actions": 2,
    "action_meanings": ["0", "1"],
}
PENDULUM = CARTPOLE | {
    "id": "Pendulum-v1",
    "obs_shape": [3],
    "num_actions": 1,
    "action_meanings": ["a0"],
    "action_shape": [1],
    "action_low": [-2.0],
    "action_high": [2.0],
}


def test_an_older_checkpoints_game_reads_as_discrete_and_writes_as_it_was():
    spec = EnvSpec.from_dict(CARTPOLE)
    assert not spec.continuous and spec.action_shape == () and spec.action_dtype == "int64"
    assert (spec.action_low, spec.action_high) == ((), ())
    assert spec.to_dict() == CARTPOLE  # no new keys for a discrete game
    assert spec == probe("CartPole-v1")
    assert EnvSpec.from_dict(PENDULUM) == probe("Pendulum-v1")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"action_low": [float("nan")]}, ValueError),
        ({"action_high": [float("inf")]}, ValueError),
        ({"action_low": [3.0]}, ValueError),  # low above high
        ({"action_low": [2.0]}, ValueError),  # low at high
        ({"action_low": [-1e39]}, ValueError),  # no float32
        ({"action_shape": [10**9], "num_actions": 10**9}, ValueError),
        ({"action_shape": [5000], "num_actions": 5000}, ValueError),
        ({"action_shape": [1, 1]}, ValueError),
        ({"action_shape": [2]}, ValueError),  # 1 action, 1 bound each
        ({"action_low": [-2.0, -2.0]}, ValueError),
        ({"action_shape": [], "action_low": [-2.0]}, ValueError),  # bounds without a shape
        ({"action_shape": 1}, TypeError),
        ({"action_low": [True]}, TypeError),
        ({"action_high": ["two"]}, ValueError),
    ],
)
def test_hostile_action_descriptions_are_refused(change, error):
    with pytest.raises(error):
        EnvSpec.from_dict(PENDULUM | change)
