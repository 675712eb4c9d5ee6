"""Soft Actor-Critic (edgerl/learners/sac.py) and actions that are numbers through acting,
play and export: the squashed Gaussian's log-probability against torch.distributions', its
acting policy in the real actor (uniform within the bounds before learning, sampled after, a
seeded run repeating), one update of each part on a real Pendulum replay, and a short real
run whose policy plays greedily from its checkpoint and from the ONNX file export writes, the
two agreeing. Whether it learns is on record (docs/runs/pendulum-seeds/sac), not timed here."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from torch.distributions import AffineTransform, Normal, TanhTransform, TransformedDistribution

from edgerl.config import Config
from edgerl.envs import make_env, probe
from edgerl.errors import ConfigError
from edgerl.learners.factory import build_learner, check_setup
from edgerl.learners.sac import SAC, SquashedGaussian
from edgerl.memories.replay.buffer import ReplayBuffer
from edgerl.run.actor import Actor, ActorWeights

from .conftest import run_edgerl

PENDULUM = probe("Pendulum-v1")


def sac_config(**agent: object) -> Config:
    cfg = Config()
    cfg.agent.algo = "sac"
    cfg.env.id = "Pendulum-v1"
    cfg.env.num_envs = 1
    cfg.agent.hidden = (32, 32)
    for key, value in agent.items():
        setattr(cfg.agent, key, value)
    return cfg


def test_the_log_probability_is_the_squashed_gaussians():
    """SquashedGaussian.sample's log-probability of its own action is what torch's
    tanh-then-scale transformed Normal says of that action."""
    torch.manual_seed(0)
    net = SquashedGaussian(PENDULUM, (16,))
    obs = torch.randn(64, 3)
    actions, logp = net.sample(obs)
    mean, log_std = net.stats(obs)
    dist = TransformedDistribution(
        Normal(mean, log_std.exp()),
        [TanhTransform(cache_size=1), AffineTransform(net.bias, net.scale)],
    )
    inside = actions.abs().squeeze(1) < 1.99  # away from the tanh's saturation
    expected = dist.log_prob(actions).sum(dim=1)
    assert inside.sum() > 32
    torch.testing.assert_close(logp[inside], expected[inside], atol=1e-3, rtol=1e-3)
    assert (actions.abs() <= 2.0).all()
    torch.testing.assert_close(net(obs), torch.tanh(mean) * 2.0)  # greedy: the mean's action


def make_actor(learner: SAC, n: int, seed: int) -> Actor:
    policy = learner.policy
    weights = ActorWeights(policy.net, False)
    rng = np.random.default_rng(seed)
    return Actor(weights, policy, n, rng, PENDULUM.obs_shape, PENDULUM.obs_dtype, False)


def test_the_actor_acts_with_vectors_within_the_bounds_and_repeats():
    torch.manual_seed(0)
    learner = build_learner(sac_config(), PENDULUM, torch.device("cpu"))
    obs = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    actor = make_actor(learner, 5, seed=3)
    random, shown = actor.act(obs, epsilon=1.0, shown=0)
    assert random.shape == (5, 1) and random.dtype == np.float32 and shown is None
    assert (np.abs(random) <= 2.0).all() and len(np.unique(random)) == 5
    sampled, shown = actor.act(obs, epsilon=0.0, shown=2)
    assert sampled.shape == (5, 1) and sampled.dtype == np.float32
    assert (np.abs(sampled) <= 2.0).all() and actor.extras == {}
    with torch.no_grad():  # the viewer's figures: row 2's greedy action
        greedy = learner.q(torch.from_numpy(obs[2:3]))[0].numpy()
        np.testing.assert_allclose(shown, greedy, rtol=1e-5)
    again = make_actor(learner, 5, seed=3)
    again.act(obs, epsilon=1.0)
    np.testing.assert_array_equal(again.act(obs, epsilon=0.0)[0], sampled)


def pendulum_replay(cfg: Config, steps: int) -> ReplayBuffer:
    """A replay of ``steps`` random Pendulum steps, as training writes it."""
    replay = ReplayBuffer(PENDULUM, capacity=1000, num_envs=1, gamma=cfg.agent.gamma)
    rng = np.random.default_rng(0)
    with make_env(cfg.env) as env:
        replay.add_first(env.reset(seed=0))
        for _ in range(steps):
            actions = rng.uniform(-2, 2, size=(1, 1)).astype(np.float32)
            step = env.step(actions)
            done = step.terminated | step.truncated
            final = step.final_obs if done.any() else None
            replay.add(actions, step.rewards, step.terminated, step.truncated, step.obs, final)
    return replay


def test_an_update_moves_the_critics_the_policy_the_temperature_and_the_targets():
    torch.manual_seed(0)
    cfg = sac_config(batch_size=64, learning_starts=0, train_freq=1)
    learner = build_learner(cfg, PENDULUM, torch.device("cpu"))
    assert isinstance(learner, SAC)
    replay = pendulum_replay(cfg, 300)
    critics = [p.detach().clone() for p in learner.critics.parameters()]
    targets = [p.detach().clone() for p in learner.targets.parameters()]
    policy = [p.detach().clone() for p in learner.q.parameters()]
    alpha = learner.alpha
    assert learner.owed(0, replay) == 0 and learner.epsilon(0) == 0.0
    learner.learn(replay, step=1, n=1)  # a critic update; the policy waits for the second
    assert learner.updates == 1 and np.isnan(learner.figures()["policy_loss"])
    moved = [p.detach() for p in learner.critics.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(critics, moved, strict=True))
    tau = cfg.sac.tau  # each target moved tau of the way to its critic
    for before, target, critic in zip(targets, learner.targets.parameters(), moved, strict=True):
        torch.testing.assert_close(target, before + tau * (critic - before))
    assert all(torch.equal(a, b) for a, b in zip(policy, learner.q.parameters(), strict=True))
    learner.learn(replay, step=2, n=1)
    assert learner.updates == 2 and np.isfinite(learner.figures()["policy_loss"])
    assert any(not torch.equal(a, b) for a, b in zip(policy, learner.q.parameters(), strict=True))
    assert learner.alpha != alpha
    # a checkpoint's state restores every part
    other = build_learner(cfg, PENDULUM, torch.device("cpu"))
    other.load_state_dict(learner.state_dict())
    assert other.alpha == learner.alpha and other.updates == 2
    for a, b in zip(other.targets.parameters(), learner.targets.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_sac_explores_at_random_until_learning_starts():
    learner = build_learner(sac_config(learning_starts=100), PENDULUM, torch.device("cpu"))
    assert learner.epsilon(99) == 1.0 and learner.epsilon(100) == 0.0
    assert learner.owed(99) == 0 and learner.owed(104) == 4 // learner.cfg.train_freq


def test_sac_refuses_games_it_cannot_learn_with_a_sentence(cli):
    cfg = sac_config()
    with pytest.raises(Exception, match="discrete ones: use dqn, pqn or ppo"):
        check_setup(cfg, probe("CartPole-v1"))
    r = cli("train", "--env", "CartPole-v1", "--set", "agent.algo=sac", "--steps", "10")
    assert r.code != 0 and "Traceback" not in r.err
    assert "agent.algo=sac learns actions that are numbers" in r.err


def test_a_fleet_takes_a_continuous_game_for_sac():
    """SAC's remote actors send their steps as DQN's do (tests/test_remote.py trains with
    them); the continuous game is no longer refused for the fleet."""
    cfg = sac_config()
    cfg.fleet.actors = 2
    check_setup(cfg, PENDULUM)  # no ConfigError


@pytest.mark.slow
def test_a_short_sac_run_plays_and_exports_its_vector_actions(tmp_path):
    """A real run (1,500 steps, learning from step 500), its checkpoint played greedily, its
    ONNX export agreeing with PyTorch on the actions (export's own check) and played: the same
    returns on the same episodes."""
    train = run_edgerl(
        "train", "--env", "Pendulum-v1", "--set", "agent.algo=sac", "--steps", "1500",
        "--set", "agent.learning_starts=500", "--set", "agent.batch_size=64",
        "--set", "agent.hidden=[32, 32]", "--set", "eval.every_steps=1000",
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-2000:]
    run = tmp_path / "runs" / "Pendulum-v1"
    evals = (run / "eval.csv").read_text().splitlines()
    assert len(evals) == 2 and evals[1].startswith("1000,"), evals
    played = run_edgerl(
        "play", "--run-dir", run, "--episodes", "2", "--json", cwd=tmp_path, timeout=300
    )
    assert played.returncode == 0, played.stderr[-2000:]
    drawn = run_edgerl("play", "--run-dir", run, "--render", "console", cwd=tmp_path, timeout=300)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    assert re.search(r"\| action [+-]\d\.\d{3}\n", drawn.stdout), drawn.stdout[-300:]  # numbers
    export = run_edgerl("export", "--run-dir", run, "--onnx", cwd=tmp_path, timeout=600)
    assert export.returncode == 0, export.stderr[-2000:]
    (onnx,) = (run / "export").glob("*.onnx")
    sidecar = json.loads((onnx.parent / (onnx.name + ".json")).read_text())
    assert sidecar["action_shape"] == [1] and sidecar["action_low"] == [-2.0]
    assert sidecar["agreement"]["ok"] and sidecar["agreement"]["total"] > 0
    from_file = run_edgerl(
        "play", "--model", onnx, "--episodes", "2", "--json", cwd=tmp_path, timeout=300
    )
    assert from_file.returncode == 0, from_file.stderr[-2000:]
    a, b = json.loads(played.stdout), json.loads(from_file.stdout)
    assert b["backend"] == "onnx" and len(a["returns"]) == 2
    np.testing.assert_allclose(a["returns"], b["returns"], rtol=1e-3)


def test_a_continuous_game_trains_sac_unless_a_learner_is_named(cli):
    """No learner named: SAC with its preset; PPO named: its continuous preset on top of its
    vector one; DQN named: refused in a sentence."""
    import tomllib

    r = cli("config", "--env", "Pendulum-v1")
    cfg = tomllib.loads(r.out)
    assert r.code == 0 and cfg["agent"]["algo"] == "sac", r.err
    assert cfg["agent"]["batch_size"] == 256 and cfg["agent"]["learning_starts"] == 5000
    r = cli("config", "--env", "Pendulum-v1", "--set", "agent.algo=ppo")
    cfg = tomllib.loads(r.out)
    assert cfg["ppo"]["rollout_steps"] == 512 and cfg["ppo"]["epochs"] == 10
    assert cfg["agent"]["hidden"] == [64, 64] and cfg["ppo"]["ent_coef"] == 0.0
    r = cli("config", "--env", "CartPole-v1", "--set", "agent.algo=ppo")
    assert tomllib.loads(r.out)["ppo"]["rollout_steps"] == 64  # a discrete game's as before
    r = cli("train", "--env", "Pendulum-v1", "--set", "agent.algo=dqn", "--steps", "10")
    assert r.code != 0 and "Traceback" not in r.err and "continuous action space" in r.err


def test_a_key_of_sac_is_taken_for_a_continuous_game_that_names_no_learner(cli):
    """The learner a continuous game trains by default is SAC: its keys are not refused as
    another learner's (they were, checked against the default DQN before the game was known)."""
    import tomllib

    r = cli("config", "--env", "Pendulum-v1", "--set", "sac.tau=0.01")
    assert r.code == 0, r.err
    assert tomllib.loads(r.out)["sac"]["tau"] == 0.01
    r = cli("config", "--env", "CartPole-v1", "--set", "sac.tau=0.01")
    assert r.code == 2 and "does nothing with agent.algo=dqn" in r.err


def test_what_continuous_games_do_not_have_yet_is_refused_in_a_sentence(cli):
    cfg = sac_config()
    cfg.perf.autotune = True
    with pytest.raises(ConfigError, match=r"perf\.autotune measures actors"):
        check_setup(cfg, PENDULUM)
    r = cli("bench", "--env", "Pendulum-v1", "--seconds", "1")
    assert r.code == 2 and "Traceback" not in r.err
    assert "edgerl bench measures games of discrete actions" in r.err
