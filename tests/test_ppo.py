"""PPO (learners/ppo.py), the learner that proves the seam: advantages written out by hand, a
sampling policy whose draws and log-probabilities are the softmax's, a rollout that keeps the
extras it is told of, a real run that recomputes nothing its actor noted, and CartPole learned
through the same loop, checkpoint, play and export the other learners use."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edgerl.config import AgentConfig, PPOConfig
from edgerl.envs import EnvSpec
from edgerl.learners.nets import MLP
from edgerl.learners.ppo import PPO, Sampling, gae
from edgerl.memories.rollout import RolloutBuffer

from .conftest import run_edgerl

VEC = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
CPU = torch.device("cpu")


def test_gae_by_hand():
    """Two environments, three steps: the first runs on (bootstrapping from the rollout's
    next value), the second terminates at t=1 and is truncated at t=2."""
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0, 1.0], [0.0, 2.0], [1.0, 3.0]])
    terminated = torch.tensor([[False, False], [False, True], [False, False]])
    truncated = torch.tensor([[False, False], [False, False], [False, True]])
    values = torch.tensor([[0.5, 1.0], [0.2, 0.4], [0.1, 0.3]])
    next_values = torch.tensor([[0.2, 0.4], [0.1, 9.0], [0.7, 0.6]])  # 9.0: after a termination
    adv = gae(rewards, terminated, truncated, values, next_values, gamma, lam)
    # environment 0: deltas, then A_t = delta_t + gamma * lam * A_{t+1}
    d0 = [1 + 0.9 * 0.2 - 0.5, 0 + 0.9 * 0.1 - 0.2, 1 + 0.9 * 0.7 - 0.1]
    a2 = d0[2]
    a1 = d0[1] + 0.45 * a2
    a0 = d0[0] + 0.45 * a1
    torch.testing.assert_close(adv[:, 0], torch.tensor([a0, a1, a2]))
    # environment 1: t=2 truncated (its own bootstrap, nothing after); t=1 terminated (no
    # bootstrap, nothing after it flows back); t=0 takes t=1's advantage
    b2 = 3 + 0.9 * 0.6 - 0.3
    b1 = 2 - 0.4
    b0 = (1 + 0.9 * 0.4 - 1.0) + 0.45 * b1
    torch.testing.assert_close(adv[:, 1], torch.tensor([b0, b1, b2]))


def test_the_sampling_policy_draws_by_the_softmax_and_keeps_the_log_probability():
    """Inverse CDF: uniform noise below the first action's probability picks it, above it the
    second; the extras are the row's value and the log-probability of the action drawn. Drawn
    by a seeded generator, the frequencies are the softmax's."""
    net = torch.nn.Identity()
    policy = Sampling(net, 2)
    logits = torch.log(torch.tensor([[0.25, 0.75], [0.25, 0.75], [0.9, 0.1]]))
    out = torch.cat((logits, torch.tensor([[1.5], [2.5], [-1.0]])), dim=1)
    chosen = policy.choose(out, torch.tensor([0.2, 0.3, 0.95]))
    assert chosen[:, 0].tolist() == [0.0, 1.0, 1.0]
    assert chosen[:, 1].tolist() == [1.5, 2.5, -1.0]
    torch.testing.assert_close(chosen[:, 2], torch.log(torch.tensor([0.25, 0.75, 0.1])))
    assert policy.extras == ("value", "logp") and policy.needs_forward(1.0)
    torch.testing.assert_close(policy.per_action(out).sum(dim=1), torch.ones(3))
    rng = np.random.default_rng(0)
    n = 20_000
    noise = torch.from_numpy(policy.draw(0.0, n, rng))
    picks = policy.choose(out[:1].expand(n, 3), noise)[:, 0]
    assert picks.mean().item() == pytest.approx(0.75, abs=0.01)


def test_the_rollout_keeps_every_extra_and_hands_the_newest_ones_on():
    """A rollout stores whatever extras the policy declares, by name, and a new rollout (after
    clear or take_full) starts from the newest observation with what was noted of it."""
    buffer = RolloutBuffer(VEC, 2, 2, CPU)
    buffer.add_first(np.zeros((2, 4), np.float32))
    for t in range(2):
        buffer.note_extras({"value": np.full(2, t), "logp": np.full(2, -t - 1.0)}, 7)
        done = np.zeros(2, bool)
        buffer.add(np.ones(2), np.ones(2), done, done, np.full((2, 4), t + 1, np.float32), None)
    buffer.note_extras({"value": np.full(2, 5.0), "logp": np.full(2, -5.0)}, 8)  # the newest
    assert buffer.extra("logp")[:, 0].tolist() == [-1.0, -2.0, -5.0]
    full = buffer.take_full()
    assert full.extra("logp")[:, 0].tolist() == [-1.0, -2.0, -5.0]
    assert buffer.extra("logp")[0].tolist() == [-5.0, -5.0] and buffer.values[0, 0].item() == 5.0
    assert buffer.values_version.tolist() == [8, -1, -1]
    assert buffer.obs[0, 0, 0].item() == 2.0
    buffer.clear()  # nothing noted since: still the same newest observation and extras
    assert buffer.values_version.tolist() == [8, -1, -1]


def trainer_sets(tmp_path, *more: str) -> list[str]:
    return [
        "env.id=CartPole-v1",
        "agent.algo=ppo",
        "env.num_envs=4",
        "ppo.rollout_steps=16",
        "train.steps=640",
        f"train.run_dir={tmp_path / 'run'}",
        "hw.monitor=false",
        "display.enabled=false",
        "eval.every_steps=0",
        *more,
    ]


def test_a_ppo_run_learns_from_what_its_actor_noted_and_repeats(tmp_path):
    """A real run through the plain loop: every action's log-probability and value come from
    the actor (none recomputed at learning time), and a second run with the seed ends with the
    same weights."""
    from edgerl.config import build_layers, resolve
    from edgerl.run.train import Trainer

    weights = []
    for i in range(2):
        sets = trainer_sets(tmp_path / str(i))
        with Trainer(resolve(build_layers(None, sets, use_system=False)), quiet=True) as trainer:
            trainer.run()
            learner = trainer.learner
            assert learner.rollouts == 10 and learner.updates == 10 * 4 * 4
            assert learner.recomputed == 0
            weights.append([p.detach().clone() for p in learner.acting.parameters()])
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_rollout_learned_moves_policy_and_value_and_checkpoints_both():
    torch.manual_seed(0)
    ppo_cfg = PPOConfig(rollout_steps=4, epochs=2, minibatches=2)
    learner = PPO(MLP(4, 2, (16,)), AgentConfig(lr=1e-2), ppo_cfg, num_envs=3, device=CPU)
    buffer = RolloutBuffer(VEC, 3, 4, CPU)
    rng = np.random.default_rng(0)
    buffer.add_first(rng.normal(size=(3, 4)).astype(np.float32))
    for _ in range(4):
        done = np.zeros(3, bool)
        nxt = rng.normal(size=(3, 4)).astype(np.float32)
        buffer.add(rng.integers(0, 2, 3), np.ones(3), done, done, nxt, None)
    before = [p.detach().clone() for p in learner.acting.parameters()]
    learner.learn(buffer, 12)
    assert learner.recomputed == 12  # nothing was noted: every log-probability computed
    moved = [
        not torch.equal(a, b) for a, b in zip(before, learner.acting.parameters(), strict=True)
    ]
    assert all(moved)  # the policy's layers and the value's
    again = PPO(MLP(4, 2, (16,)), AgentConfig(), ppo_cfg, 3, CPU)
    again.load_state_dict(learner.state_dict())
    for a, b in zip(again.acting.parameters(), learner.acting.parameters(), strict=True):
        assert torch.equal(a, b)
    assert again.updates == 4 and again.rollouts == 1


@pytest.mark.slow
def test_ppo_solves_cartpole_and_its_policy_plays_and_exports(tmp_path):
    """PPO with its CartPole preset (8 environments, rollouts of 64 steps, a value network of
    its own), 200,000 steps: its best policy plays 450 or more greedily, and the ONNX file
    export writes plays the same episodes to the same returns, through the same commands as the
    Q-learners'."""
    common = ["--env", "CartPole-v1", "--set", "agent.algo=ppo"]
    train = run_edgerl("train", *common, "--steps", "200000", cwd=tmp_path, timeout=900)
    assert train.returncode == 0, train.stderr[-2000:]
    play = run_edgerl(
        "play", "--run-dir", "runs/CartPole-v1", "--episodes", "10", "--json", cwd=tmp_path
    )
    assert play.returncode == 0, play.stderr[-2000:]
    assert json.loads(play.stdout)["return_mean"] >= 450, play.stdout
    export = run_edgerl("export", "--run-dir", "runs/CartPole-v1", "--onnx", cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-2000:]
    (onnx,) = (tmp_path / "runs" / "CartPole-v1" / "export").glob("*.onnx")
    played = run_edgerl(
        "play",
        "--model",
        str(onnx),
        "--env",
        "CartPole-v1",
        "--episodes",
        "10",
        "--json",
        cwd=tmp_path,
    )
    assert played.returncode == 0, played.stderr[-2000:]
    assert json.loads(played.stdout)["backend"] == "onnx"
    # The checkpoint played as its evaluations act samples its actions; greedily, on the same
    # episodes (play's seed), it takes the exported file's actions: the file is the policy.
    greedy = run_edgerl(
        "play",
        "--run-dir",
        "runs/CartPole-v1",
        "--greedy",
        "--episodes",
        "10",
        "--json",
        cwd=tmp_path,
    )
    assert greedy.returncode == 0, greedy.stderr[-2000:]
    assert json.loads(played.stdout)["returns"] == json.loads(greedy.stdout)["returns"]
