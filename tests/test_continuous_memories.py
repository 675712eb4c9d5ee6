"""The memories with a continuous game's actions (memories/replay/, memories/rollout.py,
memories/budget.py): real games played with random actions, some beyond their bounds (the env
clips what the game gets; a memory keeps the actions as chosen), stored, sampled and saved
exactly; and a discrete game's memories as they were, byte for byte."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from edgerl.config import EnvConfig
from edgerl.envs import EnvSpec, make_env, probe
from edgerl.memories.budget import bytes_per_transition
from edgerl.memories.replay import ReplayBuffer
from edgerl.memories.replay.sampling import example_batch
from edgerl.memories.replay.store import ReplayFileError, ReplayStore
from edgerl.memories.rollout import RolloutBuffer, rollout_bytes

PONG = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, ("NOOP",) * 6)
CARTPOLE = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("0", "1"))
MANY = EnvSpec("test/Many-v0", "vector", (4,), "float32", 300, ("0",) * 300)
# Pendulum's observations with three numbers an action, and with two discrete actions: replays
# of the same items that differ in their actions alone.
THREE = EnvSpec(
    "Pendulum-v1", "vector", (3,), "float32", 3, ("a0", "a1", "a2"), (3,), (-1.0,) * 3, (1.0,) * 3
)
TWO = EnvSpec("Pendulum-v1", "vector", (3,), "float32", 2, ("0", "1"))


@dataclass
class Played:
    """A real game played with random actions: what a memory is written, and what each
    transition was, by its action (random float32 numbers: no two alike)."""

    spec: EnvSpec
    first: np.ndarray
    steps: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    # action bytes -> (observation, reward, next observation, terminated)
    transitions: dict[bytes, tuple[np.ndarray, float, np.ndarray, bool]] = field(
        default_factory=dict
    )


def play(cfg: EnvConfig, steps: int, seed: int = 0) -> Played:
    rng = np.random.default_rng(seed)
    with make_env(cfg) as env:
        spec = env.spec
        low, high = np.array(spec.action_low), np.array(spec.action_high)
        reach = (high - low) / 2  # half the range beyond each bound
        obs = env.reset(seed=seed)
        played = Played(spec, obs)
        for _ in range(steps):
            shape = (env.num_envs, *spec.action_shape)
            actions = rng.uniform(low - reach, high + reach, shape).astype(np.float32)
            result = env.step(actions)
            done = result.terminated | result.truncated
            played.steps.append((actions, *result[1:4], result.obs, result.final_obs))
            for e in range(env.num_envs):
                after = result.final_obs[e] if done[e] else result.obs[e]
                transition = (obs[e], float(result.rewards[e]), after, bool(result.terminated[e]))
                played.transitions[actions[e].tobytes()] = transition
            obs = result.obs
    assert any((s[2] | s[3]).any() for s in played.steps), "no episode ended: no final obs"
    assert any(((s[0] < low) | (s[0] > high)).any() for s in played.steps)  # beyond bounds
    return played


def pendulum() -> EnvConfig:
    return EnvConfig(id="Pendulum-v1", num_envs=2)  # 200 steps an episode


def car_racing() -> EnvConfig:
    pytest.importorskip("Box2D", reason="CarRacing needs the box2d extra")
    # 40 frames an episode: 10 agent steps
    return EnvConfig(id="CarRacing-v3", num_envs=2, make_kwargs={"max_episode_steps": 40})


GAMES = [(pendulum, 260, (1,)), (car_racing, 30, (3,))]


def write(memory, played: Played) -> None:
    memory.add_first(played.first)
    for step in played.steps:
        memory.add(*step)


def check_samples(replay: ReplayBuffer, played: Played, rounds: int = 10) -> None:
    """Every sampled transition is one that happened: its action to the bit, its observations,
    reward and discount."""
    shape = played.spec.action_shape
    seen = 0
    for _ in range(rounds):
        batch = replay.sample(32)
        assert batch.actions.dtype == torch.float32 and batch.actions.shape == (32, *shape)
        for i in np.flatnonzero(batch.weights.numpy()):
            key = batch.actions[i].numpy().tobytes()
            assert key in played.transitions, "sampled an action that was never taken"
            obs, reward, after, terminated = played.transitions[key]
            np.testing.assert_array_equal(batch.obs[i].numpy(), obs)
            np.testing.assert_array_equal(batch.next_obs[i].numpy(), after)
            assert batch.rewards[i].item() == pytest.approx(reward, rel=1e-6)
            assert batch.discounts[i].item() == pytest.approx(0.0 if terminated else 0.99)
            seen += 1
    assert seen > 0.7 * 32 * rounds


@pytest.mark.parametrize(("game", "steps", "shape"), GAMES)
def test_a_replay_stores_and_samples_a_continuous_games_actions_exactly(game, steps, shape):
    played = play(game(), steps)
    assert played.spec.action_shape == shape
    replay = ReplayBuffer(played.spec, 2 * 200, 2, "cpu", seed=1)
    assert replay.actions.shape == (2, 200, *shape) and replay.actions.dtype == np.float32
    write(replay, played)
    check_samples(replay, played)


@pytest.mark.parametrize(("game", "steps", "shape"), GAMES)
def test_a_cuda_replays_packed_writes_carry_the_actions_numbers(game, steps, shape):
    """A CUDA replay sends each step's actions through its staging ring as the bits of their
    float32 (run on CPU tensors standing in, as tests/test_replay.py does for a discrete
    game): the sampler's tensors hold what the host wrote."""
    played = play(game(), steps)
    packed = ReplayBuffer(played.spec, 2 * 200, 2, "cpu", seed=1)
    packed._packed_writes(pin=False)
    plain = ReplayBuffer(played.spec, 2 * 200, 2, "cpu", seed=1)
    write(packed, played)
    write(plain, played)
    st = packed.storage
    for name in ("actions", "rewards", "flags", "head", "count"):
        np.testing.assert_array_equal(getattr(packed, name), getattr(plain, name))
        np.testing.assert_array_equal(getattr(st, name).numpy(), getattr(packed, name), name)
    assert torch.equal(packed.items, plain.items)
    check_samples(packed, played)


def test_a_replay_refuses_actions_of_another_shape():
    replay = ReplayBuffer(probe("Pendulum-v1"), 64, 2, "cpu")
    replay.add_first(np.zeros((2, 3), np.float32))
    rest = (np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool))
    with pytest.raises(ValueError, match=r"actions of shape \(1,\), one a row; 2 rows came"):
        replay.add(np.zeros(2, np.int64), *rest, np.zeros((2, 3), np.float32), None)


def save(replay: ReplayBuffer, store: ReplayStore) -> str:
    job = store.snapshot(step=1)
    job.run()
    assert job.error is None
    store.commit(job)
    return job.result.manifest


def test_a_saved_replay_of_a_continuous_game_restores_exactly(tmp_path):
    played = play(pendulum(), 260)
    replay = ReplayBuffer(played.spec, 2 * 200, 2, "cpu", seed=1)
    write(replay, played)
    manifest = save(replay, ReplayStore(tmp_path, replay))
    fresh = ReplayBuffer(played.spec, 2 * 200, 2, "cpu", seed=1)
    assert ReplayStore(tmp_path, fresh).restore(manifest) == replay.valid
    for name in ("actions", "rewards", "flags", "head", "count", "written"):
        np.testing.assert_array_equal(getattr(fresh, name), getattr(replay, name), name)
    assert torch.equal(fresh.items, replay.items)
    check_samples(fresh, played)


def test_a_saved_replay_whose_actions_differ_from_the_games_is_refused(tmp_path):
    """The manifest says a continuous game's action shape and dtype (a discrete game's says
    nothing new, as every manifest before); a replay of other actions is refused, naming the
    file, and left empty."""
    played = play(pendulum(), 260)
    one = ReplayBuffer(played.spec, 64, 2, "cpu")
    write(one, played)
    one_manifest = save(one, ReplayStore(tmp_path / "one", one))
    discrete = ReplayBuffer(TWO, 64, 2, "cpu")
    discrete.add_first(played.first)
    for actions, *rest in played.steps:
        discrete.add((actions[:, 0] > 0).astype(np.int64), *rest)
    discrete_manifest = save(discrete, ReplayStore(tmp_path / "two", discrete))
    body = json.loads(json.loads((tmp_path / "two" / discrete_manifest).read_text())["manifest"])
    assert "action_shape" not in body and "action_dtype" not in body
    body = json.loads(json.loads((tmp_path / "one" / one_manifest).read_text())["manifest"])
    assert (body["action_shape"], body["action_dtype"]) == ([1], "float32")

    cases = [
        (played.spec, "two", discrete_manifest, r"a discrete game's actions, not float32 .* \[1\]"),
        (TWO, "one", one_manifest, r"float32 .* shape \[1\], not a discrete game's actions"),
        (THREE, "one", one_manifest, r"float32 .* \[1\], not float32 actions of shape \[3\]"),
    ]
    for spec, directory, manifest, says in cases:
        replay = ReplayBuffer(spec, 64, 2, "cpu")
        with pytest.raises(ReplayFileError, match=rf"{manifest}: it holds {says} \(the game's"):
            ReplayStore(tmp_path / directory, replay).restore(manifest)
        assert len(replay) == 0 and not replay.actions.any()
    # The discrete one restores into a replay of its own game.
    again = ReplayBuffer(TWO, 64, 2, "cpu")
    assert ReplayStore(tmp_path / "two", again).restore(discrete_manifest) == discrete.valid
    np.testing.assert_array_equal(again.actions, discrete.actions)


@pytest.mark.parametrize(("game", "steps", "shape"), GAMES)
def test_a_rollout_keeps_a_continuous_games_actions_exactly(game, steps, shape):
    played = play(game(), steps)
    steps = 8
    rollout = RolloutBuffer(played.spec, 2, steps, torch.device("cpu"))
    assert rollout.actions.shape == (steps, 2, *shape)
    assert rollout.actions.dtype == torch.float32
    rollout.add_first(played.first)
    for step in played.steps[:steps]:
        rollout.add(*step)
    want = np.stack([s[0] for s in played.steps[:steps]])
    np.testing.assert_array_equal(rollout.actions.numpy(), want)
    full = rollout.take_full()  # learned while the next one is written
    for step in played.steps[steps : 2 * steps]:
        rollout.add(*step)
    np.testing.assert_array_equal(full.actions.numpy(), want)
    np.testing.assert_array_equal(
        rollout.actions.numpy(), np.stack([s[0] for s in played.steps[steps : 2 * steps]])
    )
    rollout.clear()
    with pytest.raises(ValueError, match=r"one a row; 2 rows came with actions of shape \(2,\)"):
        rollout.add(np.zeros(2, np.int64), *played.steps[0][1:])


def test_a_discrete_games_memories_are_as_they_were():
    """The figures the code gave before continuous actions: one byte an action (int32 beyond
    256 actions) in a replay, int64 in a rollout."""
    assert [bytes_per_transition(s) for s in (PONG, CARTPOLE, MANY)] == [7062, 22, 25]
    assert rollout_bytes(PONG, 8, 128) == 29_149_872
    assert rollout_bytes(CARTPOLE, 8, 128) == 39_216
    replay = ReplayBuffer(CARTPOLE, 64, 2, "cpu")
    assert replay.actions.shape == (2, 32) and replay.actions.dtype == np.uint8
    assert ReplayBuffer(MANY, 64, 2, "cpu").actions.dtype == np.int32
    rollout = RolloutBuffer(CARTPOLE, 2, 4, torch.device("cpu"))
    assert rollout.actions.shape == (4, 2) and rollout.actions.dtype == torch.long
    batch = example_batch(CARTPOLE, 16, torch.device("cpu"), random=True)
    assert batch.actions.shape == (16,) and batch.actions.dtype == torch.int64


def test_a_continuous_games_memories_count_four_bytes_a_number():
    spec = probe("Pendulum-v1")
    assert bytes_per_transition(spec) == 3 * 4 + 1 * 4 + 4 + 1
    assert bytes_per_transition(THREE) == 3 * 4 + 3 * 4 + 4 + 1
    assert rollout_bytes(spec, 8, 128) == 8 * 129 * (3 * 4 + 1 * 4 + 4 + 2 + 2 * 4)
    for random in (False, True):
        actions = example_batch(THREE, 64, torch.device("cpu"), random).actions
        assert actions.shape == (64, 3) and actions.dtype == torch.float32
        assert actions.min() >= -1.0 and actions.max() <= 1.0
