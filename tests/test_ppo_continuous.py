"""PPO for games whose actions are numbers (edgerl/learners/gaussian.py): the Gaussian's
log-probability and entropy against torch.distributions', the running statistics against numpy,
the reward scale written out by hand, the actor's noted
log-probabilities against the learner's own, and a short real Pendulum run whose policy
normalises its observations in play and in the ONNX file export writes; CarRacing's frames with
its actions as numbers (the CNN's Gaussian), a short run, its export and play."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Normal

from edgerl.config import Config
from edgerl.envs import probe
from edgerl.learners.factory import build_learner
from edgerl.learners.gaussian import (
    GaussianPolicy,
    RewardScale,
    RunningNorm,
    gaussian_terms,
)
from edgerl.learners.ppo import PPO
from edgerl.run.actor import Actor, ActorWeights

from .conftest import run_edgerl

PENDULUM = probe("Pendulum-v1")


def test_the_gaussians_log_probability_and_entropy_are_torchs():
    torch.manual_seed(0)
    mean, log_std = torch.randn(7, 3), torch.randn(3).expand(7, 3) * 0.3
    out = torch.cat((mean, log_std, torch.zeros(7, 1)), dim=1)
    actions = torch.randn(7, 3) * 2
    logp, entropy = gaussian_terms(out, actions)
    dist = Normal(mean, log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(dim=1))
    torch.testing.assert_close(entropy, dist.entropy().sum(dim=1))


def test_the_running_statistics_are_the_observations_mean_and_variance():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (5, 50, 1)]
    norm = RunningNorm(4, True)
    for b in batches:
        norm.take_in(torch.from_numpy(b))
    every = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), every.var(axis=0), rtol=1e-4)
    x = torch.from_numpy(every[:3]).float()
    expected = (every[:3] - every.mean(axis=0)) / np.sqrt(every.var(axis=0) + 1e-8)
    np.testing.assert_allclose(norm(x).numpy(), np.clip(expected, -10, 10), rtol=1e-3)
    off = RunningNorm(4, False)
    torch.testing.assert_close(off(x), x)


def test_the_reward_scale_divides_by_the_running_deviation_of_the_returns():
    """The reward scale written out by hand: each environment's return ``r * gamma + reward``,
    started again where its episode ended (terminated or truncated), one running variance over
    every environment's returns so far, each reward divided by that step's deviation (the
    reference's NormalizeReward keeps a variance per environment and starts again at
    terminations only: gaussian.py says so)."""
    rng = np.random.default_rng(1)
    rewards = rng.normal(-5, 3, size=(20, 2))
    ended = rng.random((20, 2)) < 0.3
    cut = ended & (rng.random((20, 2)) < 0.5)  # some ends are truncations
    gamma, returns, seen = 0.9, np.zeros(2), []
    expected = np.empty_like(rewards)
    for t in range(20):
        returns = returns * gamma + rewards[t]
        seen += list(returns)
        expected[t] = np.clip(rewards[t] / np.sqrt(np.var(seen) + 1e-8), -10, 10)
        returns[ended[t]] = 0.0
    assert cut.any() and (ended & ~cut).any()
    scale = RewardScale(2, gamma)
    got = [  # in two rollouts: the returns go on across them
        scale(
            torch.from_numpy(rewards[s]).float(),
            torch.from_numpy(ended[s] & ~cut[s]),
            torch.from_numpy(cut[s]),
        )
        for s in (slice(0, 10), slice(10, 20))
    ]
    np.testing.assert_allclose(torch.cat(got).numpy(), expected, rtol=2e-3, atol=1e-5)


def ppo_config() -> Config:
    cfg = Config()
    cfg.agent.algo, cfg.env.id, cfg.env.num_envs = "ppo", "Pendulum-v1", 4
    cfg.agent.hidden = (16, 16)
    cfg.ppo.normalize_obs = True
    return cfg


def test_the_actor_notes_what_the_learner_would_compute():
    """The log-probability and value the actor notes of its sampled action are the learner's
    own of that action (the first epoch's ratio is 1), with observations normalised."""
    torch.manual_seed(0)
    learner = build_learner(ppo_config(), PENDULUM, torch.device("cpu"))
    assert isinstance(learner, PPO) and isinstance(learner.q, GaussianPolicy)
    rng = np.random.default_rng(0)
    obs = rng.normal(5.0, 3.0, size=(4, 3)).astype(np.float32)
    learner.q.norm.take_in(torch.from_numpy(obs))  # statistics away from 0 and 1
    policy = learner.policy
    actor = Actor(ActorWeights(policy.net, False), policy, 4, rng, (3,), "float32", False)
    actions, shown = actor.act(obs, 0.0, shown=1)
    assert actions.shape == (4, 1) and actions.dtype == np.float32
    with torch.no_grad():
        out = learner.acting(torch.from_numpy(obs))
        logp, _ = learner.terms(out, torch.from_numpy(actions))
        greedy = learner.q(torch.from_numpy(obs))
    np.testing.assert_allclose(actor.extras["logp"], logp.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(actor.extras["value"], out[:, -1].numpy(), rtol=1e-5)
    np.testing.assert_allclose(shown, greedy[1].numpy(), rtol=1e-5)
    assert (greedy.abs() <= 2.0).all()


def exported_plays_as_checkpoint(run, cwd, episodes: int, env: str) -> None:
    """`edgerl export --onnx` of ``run``'s newest checkpoint, then ``episodes`` of ``env``
    played from the checkpoint and from the file: the same returns."""
    export = run_edgerl("export", "--run-dir", run, "--last", "--onnx", cwd=cwd, timeout=600)
    assert export.returncode == 0, export.stderr[-2000:]
    (onnx,) = (run / "export").glob("*.onnx")
    results = []
    for source in (["--run-dir", str(run), "--last"], ["--model", str(onnx)]):
        played = run_edgerl("play", *source, "--episodes", str(episodes), "--json", cwd=cwd)
        assert played.returncode == 0, played.stderr[-2000:]
        summary = json.loads(played.stdout)
        assert summary["env"] == env
        results.append(summary["returns"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-3)


def test_a_short_ppo_run_on_pendulum_plays_and_exports(tmp_path):
    """Pendulum with PPO's Gaussian head, observations and rewards normalised: it trains
    (evaluated greedily), a resume without the normalisation is refused, and the ONNX file
    export writes, which normalises as the checkpoint does, plays the same episodes to the
    same returns."""
    train = run_edgerl(
        "train", "--env", "Pendulum-v1", "--set", "agent.algo=ppo", "--steps", "2048",
        "--set", "ppo.rollout_steps=256", "--set", "ppo.normalize_obs=true",
        "--set", "ppo.normalize_rewards=true", "--set", "eval.every_steps=1024",
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-2000:]
    run = tmp_path / "runs" / "Pendulum-v1"
    assert "greedy actions" in train.stderr and len((run / "eval.csv").read_text().split()) == 3
    # The policy's observation statistics were made with normalisation on: resuming without is
    # refused, not run with statistics that no longer mean anything.
    other = run_edgerl(
        "train", "--env", "Pendulum-v1", "--set", "agent.algo=ppo", "--steps", "4096",
        "--set", "ppo.rollout_steps=256", "--set", "ppo.normalize_obs=false",
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert other.returncode != 0 and "Traceback" not in other.stderr
    assert "ppo.normalize_obs=True" in other.stderr and "not False" in other.stderr
    exported_plays_as_checkpoint(run, tmp_path, episodes=2, env="Pendulum-v1")


def test_a_resume_with_other_environments_keeps_the_reward_statistics_only():
    """A checkpoint of 4 environments' returns, resumed with 2 environments: the variance
    goes on, each return starts again (it crashed the first rollout)."""
    scale = RewardScale(4, 0.99)
    done = torch.zeros(3, 4, dtype=torch.bool)
    scale(torch.ones(3, 4), done, done)
    resumed = RewardScale(2, 0.99)
    resumed.load_state_dict(scale.state_dict())
    assert torch.equal(resumed.norm.var, scale.norm.var)
    assert torch.equal(resumed.returns, torch.zeros(2, dtype=torch.float64))
    out = resumed(torch.ones(1, 2), done[:1, :2], done[:1, :2])
    assert out.shape == (1, 2) and torch.isfinite(out).all()


def car_config() -> Config:
    """CarRacing-v3 with its continuous steering, gas and brake, seen as frames."""
    cfg = Config()
    cfg.agent.algo, cfg.env.id, cfg.env.num_envs = "ppo", "CarRacing-v3", 2
    return cfg


def test_a_game_of_frames_and_numbers_gets_the_cnns_gaussian():
    """CarRacing's frames with its actions as numbers: the Nature CNN gives the mean (its last
    layer one number per action) and, through a head on the same features, the value, so the
    value's gradient reaches the convolutions; the actor notes what the learner computes, and
    the greedy action lies within the bounds."""
    pytest.importorskip("Box2D", reason="CarRacing needs the box2d extra")
    car = probe(car_config().env)
    assert car.has_frames and car.continuous and car.action_shape == (3,)
    torch.manual_seed(0)
    learner = build_learner(car_config(), car, torch.device("cpu"))
    assert isinstance(learner, PPO) and isinstance(learner.q, GaussianPolicy)
    assert learner.q.frames and learner.q.channels_last
    assert isinstance(learner.value_head, nn.Linear) and learner.value_head.in_features == 512
    assert learner.q.cnn.last.out_features == 3
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, size=(2, *car.obs_shape), dtype=np.uint8)
    policy = learner.policy
    actor = Actor(ActorWeights(policy.net, False), policy, 2, rng, car.obs_shape, "uint8", False)
    actions, shown = actor.act(obs, 0.0, shown=0)
    assert actions.shape == (2, 3) and actions.dtype == np.float32
    with torch.no_grad():
        out = learner.acting(torch.from_numpy(obs))
        logp, _ = learner.terms(out, torch.from_numpy(actions))
        greedy = learner.q(torch.from_numpy(obs))
    assert out.shape == (2, 7)  # 3 means, 3 log-stds, the value
    np.testing.assert_allclose(actor.extras["logp"], logp.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(actor.extras["value"], out[:, -1].numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(shown, greedy[0].numpy(), rtol=1e-5, atol=1e-6)
    low, high = torch.tensor(car.action_low), torch.tensor(car.action_high)
    assert ((greedy >= low) & (greedy <= high)).all()
    first_conv = learner.q.cnn.features[0].weight
    learner.acting(torch.from_numpy(obs))[:, -1].sum().backward()
    assert first_conv.grad is not None and first_conv.grad.abs().sum() > 0


def test_a_short_ppo_run_on_carracings_numbers_plays_and_exports(tmp_path):
    """CarRacing-v3 as gymnasium makes it (continuous actions), no learner named: PPO, the
    continuous learner for frames (SAC learns from vectors), trains it; the ONNX file export
    writes plays the same episodes to the same returns as the checkpoint."""
    pytest.importorskip("Box2D", reason="CarRacing needs the box2d extra")
    train = run_edgerl(
        "train", "--env", "CarRacing-v3", "--set", "env.make_kwargs={max_episode_steps = 80}",
        "--set", "env.num_envs=2", "--set", "ppo.rollout_steps=32", "--set", "ppo.epochs=2",
        "--set", "ppo.minibatches=4", "--steps", "128",
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-2000:]
    assert "PPO, channels_last" in train.stderr
    run = tmp_path / "runs" / "CarRacing-v3"
    exported_plays_as_checkpoint(run, tmp_path, episodes=1, env="CarRacing-v3")
