"""PQN (pqn.py, rollout.py): Q(lambda) returns written out by hand, the rollout's writes, a
learning step that moves the weights, and on a GPU the captured pass that learns what the eager
one does."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest
import torch

from edgerl.config import AgentConfig, Config, PerfConfig, PQNConfig
from edgerl.envs import EnvSpec
from edgerl.learners.nets import MLP
from edgerl.learners.pqn import KIND, PQN, make_radam, minibatch_shape
from edgerl.learners.radam import FusedRAdam
from edgerl.memories.rollout import RolloutBuffer, lambda_returns

VEC = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
CPU = torch.device("cpu")


def test_lambda_returns_by_hand():
    """One environment, 4 steps, gamma 0.5, lambda 0.5: a truncation at t=1 and a termination
    at t=3; the values of each next observation are given."""
    r = torch.tensor([[1.0], [2.0], [4.0], [8.0]])
    term = torch.tensor([[False], [False], [False], [True]])
    trunc = torch.tensor([[False], [True], [False], [False]])
    v = torch.tensor([[10.0], [20.0], [30.0], [40.0]])  # max Q of each transition's next obs
    g = lambda_returns(r, term, trunc, v, gamma=0.5, lam=0.5)[:, 0].tolist()
    g3 = 8.0  # terminated: the reward alone
    g2 = 4 + 0.5 * (0.5 * g3 + 0.5 * 30)  # lambda mix of the next return and the next value
    g1 = 2 + 0.5 * 20  # truncated: bootstraps from its (final) next observation's value only
    g0 = 1 + 0.5 * (0.5 * g1 + 0.5 * 10)
    assert g == [g0, g1, g2, g3]
    # The rollout's last transition bootstraps from its next value alone.
    last = lambda_returns(r[:3], term[:3], torch.zeros_like(trunc[:3]), v[:3], 0.5, 0.5)
    assert last[2, 0].item() == 4 + 0.5 * 30


def fill(buffer: RolloutBuffer, steps: int, truncate_at: int = -1) -> None:
    obs = np.zeros((buffer.num_envs, 4), np.float32)
    buffer.add_first(obs)
    for t in range(steps):
        nxt = np.full((buffer.num_envs, 4), t + 1, np.float32)
        trunc = np.array([t == truncate_at] * buffer.num_envs)
        final = np.full((buffer.num_envs, 4), 100 + t, np.float32) if trunc.any() else None
        done = np.zeros(buffer.num_envs, bool)
        buffer.add(np.ones(buffer.num_envs), np.ones(buffer.num_envs), done, trunc, nxt, final)


def test_the_rollout_keeps_whole_steps_and_starts_the_next_from_the_newest():
    buffer = RolloutBuffer(VEC, 3, 4, CPU)
    fill(buffer, 4, truncate_at=2)
    assert buffer.full and len(buffer) == 12
    assert buffer.obs[:, 0, 0].tolist() == [0, 1, 2, 3, 4]
    ((t, rows, final),) = buffer.finals
    assert t == 2 and rows.tolist() == [0, 1, 2] and final[0, 0].item() == 102
    with pytest.raises(ValueError, match="full"):
        buffer.add(*([np.zeros(3)] * 4), np.zeros((3, 4), np.float32), None)
    buffer.clear()
    assert not buffer.full and buffer.obs[0, 0, 0].item() == 4 and not buffer.finals
    with pytest.raises(ValueError, match="every environment"):
        buffer.add_first(np.zeros((2, 4), np.float32), envs=np.array([0, 1]))


def test_the_cpu_radam_steps_every_tensor_at_once_and_learns_as_the_plain_one():
    """PQN's RAdam on a CPU is FusedRAdam: multi-tensor steps (torch would pick them by itself
    only on a GPU), then fused ones; it moves the weights as the one-tensor-at-a-time step does,
    up to rounding."""
    torch.manual_seed(0)
    net = MLP(4, 2, (16,), layer_norm=True)
    plain_net, start = copy.deepcopy(net), copy.deepcopy(net)
    optimizer, captured = make_radam(net, 1e-3, 1e-5, capturable=False)
    assert optimizer.param_groups[0]["foreach"] is True and not captured
    assert isinstance(optimizer, FusedRAdam)
    plain = torch.optim.RAdam(plain_net.parameters(), lr=1e-3, eps=1e-5, foreach=False)
    x = torch.randn(32, 4)
    for _ in range(10):
        for model, opt in ((net, optimizer), (plain_net, plain)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for a, b in zip(net.parameters(), plain_net.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = [
        not torch.equal(a, b) for a, b in zip(net.parameters(), start.parameters(), strict=True)
    ]
    assert all(moved)


def test_a_rollout_is_one_learning_step_that_moves_the_weights():
    torch.manual_seed(0)
    net = MLP(4, 2, (16,), layer_norm=True)
    pqn_cfg = PQNConfig(rollout_steps=4, epochs=2, minibatches=3)
    learner = PQN(net, AgentConfig(lr=1e-3), pqn_cfg, num_envs=3, device=CPU)
    buffer = RolloutBuffer(VEC, 3, 4, CPU)
    assert learner.owed(11) == 0
    fill(buffer, 4, truncate_at=1)
    assert learner.owed(12) == 1  # 4 steps of 3 environments
    before = [p.detach().clone() for p in net.parameters()]
    learner.learn(buffer, 12)
    assert learner.updates == 2 * 3 and learner.rollouts == 1 and learner.owed(12) == 0
    assert not buffer.full
    assert any(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    learner.losses.flush()
    assert learner.losses.take() > 0
    state = learner.state_dict()
    again = PQN(MLP(4, 2, (16,), layer_norm=True), AgentConfig(), pqn_cfg, 3, CPU)
    again.load_state_dict(state)
    assert again.updates == 6 and again.rollouts == 1
    again.resume_at(100)
    assert again.owed(111) == 0 and again.owed(112) == 1  # the first rollout starts at 100


def test_the_actors_values_stand_in_for_a_second_forward_pass_with_the_same_weights():
    """Values noted with the current weights are taken as they are and give the learning the
    computed ones give; a row noted with older weights, or not at all, is computed."""
    pqn_cfg = PQNConfig(rollout_steps=4, epochs=1, minibatches=2)
    learners, buffers = [], []
    for _ in range(2):
        torch.manual_seed(0)
        net = MLP(4, 2, (16,), layer_norm=True)
        learners.append(PQN(net, AgentConfig(lr=1e-2), pqn_cfg, num_envs=3, device=CPU))
        buffers.append(RolloutBuffer(VEC, 3, 4, CPU))
    noted, plain = learners
    for buffer in buffers:
        buffer.add_first(np.zeros((3, 4), np.float32))
    rng = np.random.default_rng(0)
    for t in range(4):
        nxt = rng.normal(size=(3, 4)).astype(np.float32)
        done = np.zeros(3, bool)
        for buffer in buffers:
            buffer.add(np.ones(3), np.ones(3), done, done, nxt, None)
        if t < 3:  # as the trainer does: the actor acts on the newest observations
            with torch.no_grad():
                values = noted.q(torch.from_numpy(nxt)).max(dim=1).values.numpy()
            version = noted.updates if t != 1 else noted.updates - 1
            buffers[0].note_extras({"value": values}, version)
    computed: list[int] = []
    noted.q.register_forward_hook(lambda module, args, out: computed.append(len(args[0])))
    noted.learn(buffers[0], 12)
    plain.learn(buffers[1], 12)
    assert computed[0] == 3 and computed[1] == 3  # the stale row (t=1) and the last one
    for a, b in zip(noted.q.parameters(), plain.q.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert (buffers[0].values_version[1:] == -1).all()  # a new rollout knows no values yet


def test_a_pqn_run_computes_only_the_values_its_actor_did_not(tmp_path, monkeypatch):
    """A real PQN run (CartPole, the plain loop): at learning time only each rollout's last
    observations are evaluated again (the actor acts on them after learning)."""
    from edgerl.config import build_layers, resolve
    from edgerl.run.train import Trainer

    rows: list[int] = []
    original = PQN._greedy_values

    def counting(self, obs):
        rows.append(len(obs))
        return original(self, obs)

    monkeypatch.setattr(PQN, "_greedy_values", counting)
    sets = [
        "env.id=CartPole-v1",
        "agent.algo=pqn",
        "env.num_envs=4",
        "pqn.rollout_steps=8",
        "train.steps=320",
        f"train.run_dir={tmp_path / 'run'}",
        "hw.monitor=false",
        "display.enabled=false",
        "eval.every_steps=0",
    ]
    with Trainer(resolve(build_layers(None, sets, use_system=False)), quiet=True) as trainer:
        trainer.run()
        assert trainer.learner.rollouts == 10
    # Episodes that end by truncation add their final observations; CartPole's 320 steps
    # truncate none, so each rollout evaluates its 4 last observations and nothing else.
    assert rows == [4] * 10


def test_a_pass_makes_the_minibatches_asked_for():
    assert minibatch_shape(12, 3) == (4, 3)
    assert minibatch_shape(12, 5) == (2, 5)  # 2 rows wait for the next pass's order
    assert minibatch_shape(4, 32) == (1, 4)  # fewer transitions than minibatches


def random_rollout(buffer: RolloutBuffer, rng: np.random.Generator) -> None:
    """A full rollout of random observations, actions and rewards, one truncation."""
    n = buffer.num_envs
    buffer.add_first(rng.normal(size=(n, 4)).astype(np.float32))
    for t in range(buffer.steps):
        nxt = rng.normal(size=(n, 4)).astype(np.float32)
        trunc = np.arange(n) == t % n
        done = rng.random(n) < 0.2
        final = rng.normal(size=(n, 4)).astype(np.float32)
        buffer.add(rng.integers(0, 2, n), rng.normal(size=n), done, trunc, nxt, final)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_pass_learns_what_the_eager_one_does():
    """On a GPU a pass over the rollout is one CUDA graph launch: three rollouts later, with the
    learning rate annealed inside the graph and the epochs moved from 2 to 1 after the first
    (as the learning balance moves them: the captured pass is one epoch's), its weights are the
    eager update's; its checkpoint (a capturable optimizer's) loads into a CPU learner, which
    learns on at the epochs it left."""
    cuda = torch.device("cuda")
    pqn_cfg = PQNConfig(rollout_steps=4, epochs=2, minibatches=3)
    agent = AgentConfig(lr=1e-2, lr_end=1e-3)
    learners = []
    for graphs in ("on", "off"):
        torch.manual_seed(0)
        net = MLP(4, 2, (16,), layer_norm=True)
        perf = PerfConfig(amp="off", cuda_graphs=graphs, compile="off")
        learner = PQN(net, agent, pqn_cfg, num_envs=3, device=cuda, perf=perf, total_steps=36)
        buffer = RolloutBuffer(VEC, 3, 4, cuda)
        KIND.prepare(learner, Config(), VEC, buffer, remaining_updates=0)
        rng = np.random.default_rng(1)
        for rollout in range(3):
            random_rollout(buffer, rng)
            learner.learn(buffer, 12 * (rollout + 1))
            learner.set_ratio(1)
        learners.append(learner)
    graphed, eager = learners
    assert graphed.cuda_graphs and not eager.cuda_graphs
    assert "CUDA graph" in graphed.describe()
    assert graphed.updates == eager.updates == (2 + 1 + 1) * 3
    for a, b in zip(graphed.q.parameters(), eager.q.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    graphed.losses.flush()
    eager.losses.flush()
    assert graphed.losses.take() == pytest.approx(eager.losses.take(), rel=1e-4)

    saved = io.BytesIO()
    torch.save(graphed.state_dict(), saved)
    saved.seek(0)
    state = torch.load(saved, map_location="cpu", weights_only=False)
    cpu = PQN(MLP(4, 2, (16,), layer_norm=True), agent, pqn_cfg, 3, CPU, total_steps=36)
    cpu.load_state_dict(state)
    assert cpu.ratio == 1
    assert not torch.is_tensor(cpu.optimizer.param_groups[0]["lr"])
    buffer = RolloutBuffer(VEC, 3, 4, CPU)
    random_rollout(buffer, np.random.default_rng(2))
    before = [p.detach().clone() for p in cpu.q.parameters()]
    cpu.learn(buffer, 48)
    assert any(not torch.equal(a, b) for a, b in zip(before, cpu.q.parameters(), strict=True))
