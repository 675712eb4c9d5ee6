"""The training loop with actors elsewhere (run/remote.py, fleet/actor.py) without Ray: a remote
actor's batches of single frames write the replay a local actor writes, and a real Trainer fed
irregular batches makes exactly the updates its replay ratio owes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from edgerl.config import AgentConfig, build_layers, resolve
from edgerl.envs import make_env, probe
from edgerl.files.checkpoint import list_checkpoints, load
from edgerl.fleet.actor import RemoteActor
from edgerl.learners.shared import epsilon_at, epsilons_at
from edgerl.memories.replay import ReplayBuffer
from edgerl.report.episodes import Episodes
from edgerl.run.remote import write_chunk
from edgerl.run.train import Trainer
from edgerl.run.transport import Chunk, apex_epsilons, chunk_problem

from .inproc_fleet import InProcessFleet


def config(tmp_path, env_id: str, *sets: str, steps: int = 3000):
    return resolve(
        build_layers(
            None,
            ["hw.monitor=false", "display.enabled=false", "eval.every_steps=0", *sets],
            {"env.id": env_id, "train.steps": steps, "train.run_dir": str(tmp_path / "run")},
            use_system=False,
        )
    )


class Recorder:
    """The parts of the trainer write_chunk drives, around a real replay (the trainer's own
    _record clips Atari rewards too; here they are written as they come, on both sides)."""

    def __init__(self, cfg, spec, memory, num_envs):
        self.cfg, self.spec, self.memory = cfg, spec, memory
        self.step = 0
        self.episode_tally = Episodes()
        self.episode_tally.start(num_envs, 0, None)

    def record_step(self, actions, result, envs):
        self.memory.add(
            actions,
            result.rewards,
            result.terminated,
            result.truncated,
            result.obs,
            result.final_obs,
            envs=envs,
        )
        self.step += len(actions)


@pytest.mark.parametrize(
    "env_id, sets",
    [
        # Truncated every 30 steps: episode ends, final frames and first ones inside a batch.
        ("ALE/Pong-v5", ["env.max_episode_frames=120", "env.num_envs=3"]),
        ("CartPole-v1", ["env.num_envs=3"]),  # terminations within 100 random steps
    ],
)
def test_a_remote_actors_single_frames_write_the_replay_a_local_actor_writes(
    tmp_path, env_id, sets
):
    cfg = config(tmp_path, env_id, *sets)
    spec = probe(env_id)
    n, seed, steps = cfg.env.num_envs, 7, 100
    actor = RemoteActor(cfg.to_dict(), spec.to_dict(), seed)
    chunk = actor.collect(steps, np.ones(n))  # random actions: no weights needed
    assert chunk.first is not None and chunk.items.shape == (steps, n, *spec.item_shape)
    assert (chunk.terminated | chunk.truncated).any(), "the test wants episode ends"
    envs = np.arange(n, 2 * n)  # the fleet's second actor: the replay's rows n..2n-1
    chunk = chunk._replace(actor=1, envs=envs)

    def replay():
        return ReplayBuffer(spec, 2 * n * 200, 2 * n, seed=3, n_step=3)

    remote = replay()
    write_chunk(Recorder(cfg, spec, remote, 2 * n), chunk, total=10**9)

    local = replay()  # the same environments, stepped here with the same actions
    env = make_env(dataclasses.replace(cfg.env, batch_size=0), spec)
    local.add_first(env.reset(seed=seed), envs=envs)
    for t in range(steps):
        r = env.step(chunk.actions[t])
        local.add(chunk.actions[t], r.rewards, r.terminated, r.truncated, r.obs, r.final_obs, envs)
    env.close()

    assert torch.equal(remote.items, local.items)
    for name in ("actions", "rewards", "flags", "head", "count"):
        assert np.array_equal(getattr(remote, name), getattr(local, name)), name
    assert remote.valid == local.valid == steps * n
    a, b = remote.sample(64), local.sample(64)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert a.obs.shape[1:] == spec.obs_shape  # stacks rebuilt from single frames

    # The actor is lost and a new one takes its environments over: its first observations
    # start new rings; the observation the lost one left behind starts no transition.
    heads = remote.head[envs].copy()
    again = RemoteActor(cfg.to_dict(), spec.to_dict(), seed + 100)
    more = again.collect(5, np.ones(n))._replace(actor=1, envs=envs)
    write_chunk(Recorder(cfg, spec, remote, 2 * n), more, total=10**9)
    orphan = envs * remote.slots + heads - 1
    flags = remote.flags.reshape(-1)
    assert not (flags[orphan] & 2).any() and (flags[orphan + 1] & 1).all()  # not VALID; FIRST
    assert remote.valid == (steps + 5) * n


def test_a_trainer_fed_irregular_batches_makes_exactly_the_updates_they_owe(tmp_path):
    sets = [
        "fleet.actors=2",
        "env.num_envs=2",
        "fleet.batch_steps=16",
        "fleet.weights_every=20",
        "agent.learning_starts=500",
        "agent.train_freq=2",
        "agent.batch_size=16",
        "train.checkpoint_every_s=3600",
    ]
    cfg = config(tmp_path, "CartPole-v1", *sets)
    fleets: list[InProcessFleet] = []

    def open_fleet(cfg, spec):
        fleets.append(InProcessFleet(cfg, spec))
        return fleets[-1]

    with Trainer(cfg, fleet=open_fleet, quiet=True) as trainer:
        assert trainer.memory.num_envs == 4  # two actors of two environments
        result = trainer.run()
        assert trainer.step == 3000  # the last batch is cut at train.steps
        assert trainer.learner.updates == (3000 - 500) // 2
    fleet = fleets[0]
    assert fleet.closed and len(set(fleet.sizes)) > 5  # batches of many sizes arrived
    assert result.step == 3000 and result.episodes > 0
    # weights went out every 20 updates or so, newer each time
    assert fleet.published[0] == 0 and fleet.published == sorted(set(fleet.published))
    assert len(fleet.published) >= 1250 // 20 // 2
    # learning started: Ape-X's rates, one per environment of the fleet
    assert np.allclose(fleet.epsilons, apex_epsilons(4, 0.4, 7.0))

    (ck,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert load(ck.path).step == 3000
    resumed = config(tmp_path, "CartPole-v1", *sets, "fleet.exploration=schedule", steps=3400)
    with Trainer(resumed, fleet=open_fleet, quiet=True) as trainer:
        assert trainer.step == 3000
        trainer.run()
        assert trainer.step == 3400 and trainer.learner.updates == (3400 - 500) // 2
        schedule = trainer.learner.epsilon(3400)
    # the learner's schedule (CartPole's preset decays it over 8,000 steps) for every environment
    rates = fleets[1].epsilons
    assert len(set(rates.tolist())) == 1 and rates[0] == pytest.approx(schedule, abs=0.02)


def test_one_exploration_schedule_for_learners_and_remote_actors():
    agent = AgentConfig(eps_start=1.0, eps_end=0.1, eps_decay_steps=1000)
    apex = apex_epsilons(3, 0.4, 7.0)
    assert epsilons_at(agent, 499, 500, 3, apex).tolist() == [1.0] * 3  # the replay fills
    assert np.array_equal(epsilons_at(agent, 500, 500, 3, apex), apex)  # then Ape-X's, fixed
    assert epsilons_at(agent, 500, 500, 3).tolist() == [pytest.approx(0.55)] * 3
    assert epsilon_at(agent, 5000, 500) == 0.1


def damaged_batches(good: Chunk) -> dict[str, object]:
    """The ways a batch from across the network went wrong in the security review, and more."""
    nan_rewards = good.rewards.copy()
    nan_rewards[1, 0] = np.nan
    wild = good.actions.copy()
    wild[0, 1] = 300  # wrapped around in the replay's uint8, then stopped the learner
    return {
        "NaN rewards": good._replace(rewards=nan_rewards),
        "an action out of range": good._replace(actions=wild),
        "another frame size": good._replace(items=good.items[:, :, :42]),
        "500 times the asked size": good._replace(
            items=np.repeat(good.items, 500, axis=0),
            actions=np.repeat(good.actions, 500, axis=0),
            rewards=np.repeat(good.rewards, 500, axis=0),
            terminated=np.repeat(good.terminated, 500, axis=0),
            truncated=np.repeat(good.truncated, 500, axis=0),
        ),
        "episode ends without last frames": good._replace(
            terminated=np.ones_like(good.terminated), final_items=good.final_items[:0]
        ),
        "float frames": good._replace(items=good.items.astype(np.float32)),
        "first frames of another size": good._replace(first=np.zeros((2, 42, 84), np.uint8)),
        "weights never sent": good._replace(version=10**9),
        "not a batch": {"rewards": [1.0]},
    }


def test_a_damaged_batch_from_an_actor_is_refused_in_one_sentence(tmp_path):
    cfg = config(tmp_path, "ALE/Pong-v5", "env.num_envs=2", "env.repeat_action_probability=0")
    spec = probe(cfg.env.id)
    actor = RemoteActor(cfg.to_dict(), spec.to_dict(), seed=3)
    try:
        good = actor.collect(8, np.ones(2), None, -1)
    finally:
        actor.close()
    assert chunk_problem(good, spec, 8, 2, version=0) is None  # a real batch passes
    for what, bad in damaged_batches(good).items():
        problem = chunk_problem(bad, spec, 8, 2, version=0)
        assert problem is not None and len(problem.splitlines()) == 1, what


def test_a_vector_games_non_finite_last_observation_is_refused(tmp_path):
    """A NaN last observation of an ended CartPole episode became a NaN target (a truncated
    episode bootstraps from it): refused like any damaged part."""
    cfg = config(tmp_path, "CartPole-v1", "env.num_envs=2")
    spec = probe(cfg.env.id)
    actor = RemoteActor(cfg.to_dict(), spec.to_dict(), seed=3)
    try:
        good = actor.collect(40, np.ones(2), None, -1)  # random CartPole ends within 40 steps
    finally:
        actor.close()
    assert len(good.final_items) > 0 and chunk_problem(good, spec, 40, 2, version=0) is None
    poisoned = good.final_items.copy()
    poisoned[0, 0] = np.nan
    problem = chunk_problem(good._replace(final_items=poisoned), spec, 40, 2, version=0)
    assert problem is not None and "not finite" in problem
    first = np.full((2, 4), np.inf, dtype=np.float32)
    assert "not finite" in chunk_problem(good._replace(first=first), spec, 40, 2, version=0)


def test_apex_rates_run_from_the_base_down():
    rates = apex_epsilons(5, 0.4, 7.0)
    assert rates[0] == pytest.approx(0.4) and rates[-1] == pytest.approx(0.4**8)
    assert np.all(np.diff(rates) < 0)
    assert apex_epsilons(1, 0.4, 7.0).tolist() == [0.4]


def test_a_pong_fleet_learns_and_shows_its_first_environment(tmp_path):
    """Frames from remote actors: the replay's stacks feed the CNN's updates, and the first
    actor's first environment is published for `edgerl view`."""
    from edgerl.stream.reader import FrameReader

    sets = [
        "fleet.actors=2",
        "env.num_envs=2",
        "fleet.batch_steps=8",
        "agent.learning_starts=200",
        "agent.train_freq=16",
        "agent.batch_size=8",
        "replay.capacity=2000",
        "display.enabled=true",
        "display.every=1",
        "perf.compile=off",
    ]
    cfg = config(tmp_path, "ALE/Pong-v5", *sets, steps=600)
    with Trainer(cfg, fleet=InProcessFleet, quiet=True) as trainer:
        trainer.run()
        assert trainer.step == 600 and trainer.learner.updates == (600 - 200) // 16
        reader = FrameReader(trainer.run_dir)
        frame = reader.latest()
        assert reader.writes > 50 and frame is not None and frame.pixels.shape == (84, 84)
        reader.close()


def test_sac_learns_from_remote_actors_that_act_with_its_own_noise(tmp_path):
    """A game whose actions are numbers through the fleet: the actors' batches carry float32
    vectors within the bounds (refused otherwise, in one sentence), the learner makes exactly
    the updates they owe, and the actors act by the policy's noise, not Ape-X's random
    actions (every environment's rate is SAC's: 1 while the replay fills, then 0); the
    weights the actors load are the learner's policy network's."""
    sets = [
        "agent.algo=sac",
        "fleet.actors=2",
        "env.num_envs=1",
        "fleet.batch_steps=16",
        "fleet.weights_every=20",
        "agent.learning_starts=300",
        "agent.batch_size=32",
        "agent.hidden=[32,32]",
        "train.checkpoint_every_s=3600",
    ]
    cfg = config(tmp_path, "Pendulum-v1", *sets, steps=800)
    spec = probe(cfg.env.id)
    fleets: list[InProcessFleet] = []

    def open_fleet(cfg, spec):
        fleets.append(InProcessFleet(cfg, spec))
        return fleets[-1]

    with Trainer(cfg, fleet=open_fleet, quiet=True) as trainer:
        trainer.run()
        assert trainer.step == 800 and trainer.learner.updates == 800 - 300
        policy = {k: v.detach().numpy() for k, v in trainer.learner.q.state_dict().items()}
    fleet = fleets[0]
    assert np.array_equal(fleet.epsilons, np.zeros(2))  # its own noise, no Ape-X rates
    actor = fleet.actors[0]
    assert fleet.published[-1] > 0 and set(fleet.weights) == set(policy)
    chunk = actor.collect(8, np.zeros(1), fleet.weights, fleet.version)
    loaded = actor.weighted.state_dict()  # what the actor acts with: the learner's weights
    assert all(np.array_equal(loaded[k].numpy(), fleet.weights[k]) for k in fleet.weights)
    assert chunk.actions.shape == (8, 1, 1) and chunk.actions.dtype == np.float32
    assert chunk_problem(chunk, spec, 8, 1, version=fleet.version) is None
    outside = chunk.actions.copy()
    outside[0, 0, 0] = 2.5  # Pendulum's torque is within [-2, 2]
    problem = chunk_problem(chunk._replace(actions=outside), spec, 8, 1, version=fleet.version)
    assert problem is not None and "outside the game's bounds" in problem
    as_ids = chunk.actions.astype(np.int64)
    problem = chunk_problem(chunk._replace(actions=as_ids), spec, 8, 1, version=fleet.version)
    assert problem is not None and "not float32" in problem
