"""The actor (actor.py): epsilon-greedy actions from one forward pass, no forward pass at epsilon 1,
double-buffered weights that the learner refreshes and the actor switches to without waiting; on a
GPU, the captured forward pass agrees with the eager one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgerl.learners.acting import EpsilonGreedy
from edgerl.learners.explore import exploration
from edgerl.learners.nets import MLP, NatureCNN
from edgerl.run.actor import Actor, ActorWeights

from .cuda_standins import FakeStream, fake_streams_and_graphs
from .helpers import CUDA, GPU

OBS = (4,)


def make(net: torch.nn.Module, double: bool = False, seed: int = 0, n: int = 8) -> Actor:
    rng = np.random.default_rng(seed)
    return Actor(ActorWeights(net, double), EpsilonGreedy(net, 3), n, rng, OBS, "float32", False)


def test_epsilon_one_picks_random_actions_without_a_forward_pass():
    net = MLP(4, 3, (8,))
    net.register_forward_pre_hook(lambda *_: pytest.fail("a forward pass at epsilon 1"))
    obs = np.zeros((8, 4), np.float32)
    a1, q1 = make(net, seed=5).act(obs, 1.0, shown=0)
    a2, _ = make(net, seed=5).act(obs, 1.0, shown=0)
    assert q1 is None and a1.shape == (8,) and set(a1.tolist()) <= {0, 1, 2}
    assert np.array_equal(a1, a2)  # the actor's generator: a seeded run repeats


def test_epsilon_zero_is_greedy_and_shows_the_q_values():
    torch.manual_seed(0)
    net = MLP(4, 3, (8,))
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    actions, q_shown = make(net).act(obs, 0.0, shown=2)
    with torch.no_grad():
        q = net(torch.from_numpy(obs)).numpy()
    assert np.array_equal(actions, q.argmax(1))
    np.testing.assert_allclose(q_shown, q[2])


def test_the_learner_refreshes_the_copy_not_in_use_and_the_actor_switches_at_its_next_step():
    torch.manual_seed(0)
    learner_net = MLP(4, 3, (8,))
    weights = ActorWeights(learner_net, double=True)
    actor = make(learner_net, double=True)
    actor.weights = weights
    obs = np.ones((8, 4), np.float32)
    _, before = actor.act(obs, 0.0, shown=0)
    with torch.no_grad():
        for p in learner_net.parameters():
            p.add_(1.0)  # the learner's updates
    _, unchanged = actor.act(obs, 0.0, shown=0)
    np.testing.assert_array_equal(before, unchanged)  # nothing published: the old weights act
    in_use = weights.active
    assert weights.publish(updates=7)
    assert weights.active == in_use  # written to the other copy; the switch is the actor's
    assert not weights.publish(updates=8)  # one copy at a time until the actor has switched
    _, after = actor.act(obs, 0.0, shown=0)
    assert weights.active != in_use and weights.version == 7
    with torch.no_grad():
        want = learner_net(torch.from_numpy(obs[:1]))[0].numpy()
    np.testing.assert_allclose(after, want, rtol=1e-5)  # batch 8 vs 1: summation order
    assert weights.publish(updates=9)  # the old copy is free again


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("use_graph", [False, True])
def test_the_gpu_actor_agrees_with_the_network(use_graph):
    torch.manual_seed(0)
    net = NatureCNN(4, 6).to(GPU).eval()
    rng = np.random.default_rng(0)
    policy = EpsilonGreedy(net, 6)
    actor = Actor(ActorWeights(net, True), policy, 8, rng, (4, 84, 84), "uint8", use_graph)
    obs = rng.integers(0, 256, size=(8, 4, 84, 84), dtype=np.uint8)
    actions, q_shown = actor.act(obs, 0.0, shown=3)
    with torch.no_grad():
        q = net(torch.from_numpy(obs).to(GPU)).float().cpu().numpy()
    assert np.array_equal(actions, q.argmax(1))
    np.testing.assert_allclose(q_shown, q[3], rtol=1e-4, atol=1e-4)
    rng_state = torch.cuda.get_rng_state()
    explored = np.concatenate([actor.act(obs, 1.0 - 1e-9)[0] for _ in range(20)])
    assert len(set(explored.tolist())) > 1  # exploration drawn on the host reaches the graph
    # The learner's sampling graph, on another thread, owns the CUDA generator.
    assert torch.equal(rng_state, torch.cuda.get_rng_state())
    again = Actor(
        ActorWeights(net, True),
        policy,
        8,
        np.random.default_rng(0),
        (4, 84, 84),
        "uint8",
        use_graph=use_graph,
    )
    again.rng.integers(0, 256, size=(8, 4, 84, 84), dtype=np.uint8)  # as rng drew obs above
    again.act(obs, 0.0, shown=3)
    repeated = np.concatenate([again.act(obs, 1.0 - 1e-9)[0] for _ in range(20)])
    assert np.array_equal(explored, repeated)  # the actor's seed decides, as on the CPU


class ByEnvironment(torch.nn.Module):
    """A network per environment, as a population learner's: environment e's greedy action is
    e % 3 whatever it sees (its policy says ``per_env``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, obs: torch.Tensor, envs: torch.Tensor) -> torch.Tensor:
        q = ((envs % 3).unsqueeze(1) == torch.arange(3, device=envs.device)).float() * self.scale
        return q + 0.0 * obs.float().sum(dim=1, keepdim=True)


@pytest.mark.parametrize(
    "device, use_graph",
    [
        ("cpu", False),
        pytest.param(
            "cuda", False, marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no GPU")]
        ),
        pytest.param(
            "cuda", True, marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="no GPU")]
        ),
    ],
)
def test_a_network_per_environment_is_given_the_rows_environments(device, use_graph):
    """The rows of one step may be some environments in any order (ALE's async batches): a
    per-environment network is told which, on the CPU and through the GPU's staged buffers and
    graph, and with none given the rows are every environment in order."""
    net = ByEnvironment().to(device)
    rng = np.random.default_rng(0)
    policy = EpsilonGreedy(net, 3, per_env=True)
    actor = Actor(ActorWeights(net, False), policy, 4, rng, OBS, "float32", use_graph)
    obs = np.zeros((4, 4), np.float32)
    envs = np.array([5, 0, 7, 4])
    actions, q_shown = actor.act(obs, 0.0, shown=2, envs=envs)
    assert actions.tolist() == (envs % 3).tolist()
    assert q_shown.tolist() == [0.0, 1.0, 0.0]  # row 2 is environment 7
    assert actor.act(obs, 0.0)[0].tolist() == [0, 1, 2, 0]
    if device == "cpu":  # what the GPU's graph captures, run here: the ids staged as inputs
        actor._make_buffers(OBS, "float32", pin=False)
        actor._stage(obs, 0.0, 2, envs)
        actor._body(net)
        assert actor._out[:4].tolist() == (envs % 3).tolist()


def test_what_the_actors_graph_captures_explores_with_the_actors_generator_and_no_torch_one():
    """The body of the actor's CUDA graph, run on CPU tensors standing in for its device
    buffers: where it explores comes from the actor's numpy generator through the input
    buffers, so a seeded run explores as the CPU actor does, and it draws nothing from a torch
    generator (the learner's sampling graph, replayed on another thread, owns the CUDA one)."""
    torch.manual_seed(0)
    net = MLP(4, 3, (8,))
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    want, want_shown = make(net, seed=5).act(obs, 0.5, shown=2)
    assert 0 < np.count_nonzero(exploration(0.5, 3, 8, np.random.default_rng(5)) >= 0) < 8
    device_side = make(net, seed=5)
    device_side._make_buffers(OBS, "float32", pin=False)
    rng_state = torch.get_rng_state()
    device_side._stage(obs, 0.5, 2)
    device_side._body(net)
    assert torch.equal(rng_state, torch.get_rng_state())
    out = device_side._out.numpy()
    assert np.array_equal(out[:8].astype(np.int64), want)
    np.testing.assert_allclose(out[8:], want_shown, rtol=1e-6)


def test_the_actors_stream_follows_the_default_stream_before_it_reads_its_buffers(monkeypatch):
    """The actor's buffers and weight copies are written on the default stream; its own stream
    must wait for that before the graphs' warm-up or a first eager forward reads them.
    Stand-ins: streams, events and graphs that record, CPU tensors for the device's."""
    default = fake_streams_and_graphs(monkeypatch)
    monkeypatch.setattr(torch.cuda, "Event", FakeStream)
    actor = make(MLP(4, 3, (8,)), double=True)
    seen: list[list] = []
    body = actor._body
    monkeypatch.setattr(
        actor, "_body", lambda net: (seen.append(list(actor.stream.waited)), body(net))
    )
    actor._open_device(OBS, "float32", use_graph=True)
    assert isinstance(actor.stream, FakeStream) and actor.stream.waited == [default]
    assert len(actor._graphs) == 2 and seen and all(w == [default] for w in seen)


class Sampling:
    """A policy of another kind than epsilon-greedy, written here as a learner would: each row
    samples its action from the softmax of the network's output, by the inverse of its
    cumulative distribution at the row's uniform noise, and keeps the action's log-probability
    and the row's mean output as its extras."""

    action_shape: tuple[int, ...] = ()  # an action id
    noise_dtype = "float32"
    noise_shape: tuple[int, ...] = ()
    extras = ("logp", "mean")
    per_env = False

    def __init__(self, net: torch.nn.Module, num_actions: int) -> None:
        self.net = net
        self.num_actions = num_actions

    def draw(self, epsilon, n, rng):
        return rng.random(n, dtype=np.float32)

    def needs_forward(self, epsilon):
        return True  # it samples from the network's output at every step

    def choose(self, out, noise):
        logp = torch.log_softmax(out.float(), dim=1)
        below = (logp.exp().cumsum(dim=1) < noise.unsqueeze(1)).sum(dim=1)
        actions = below.clamp(max=self.num_actions - 1)
        taken = logp.gather(1, actions.unsqueeze(1)).squeeze(1)
        return torch.stack((actions.float(), taken, out.float().mean(dim=1)), dim=1)

    def per_action(self, out):
        return torch.softmax(out.float(), dim=1)


def test_the_actor_acts_with_whatever_policy_the_learner_gives_and_returns_its_extras():
    """The actor knows no algorithm: a policy that samples (noise of its own dtype, two
    extras) acts through it as epsilon-greedy does, on the CPU and in what the GPU's graph
    captures (its body, on CPU tensors), from the actor's generator: a seeded actor repeats,
    and the two paths pick the same actions and extras."""
    torch.manual_seed(0)
    net = MLP(4, 3, (8,))
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)

    def sampler(seed: int) -> Actor:
        rng = np.random.default_rng(seed)
        return Actor(ActorWeights(net, False), Sampling(net, 3), 8, rng, OBS, "float32", False)

    actor = sampler(5)
    actions, probs = actor.act(obs, 0.0, shown=2)
    with torch.no_grad():
        out = net(torch.from_numpy(obs))
    want_logp = torch.log_softmax(out, dim=1).numpy()[np.arange(8), actions]
    np.testing.assert_allclose(actor.extras["logp"], want_logp, rtol=1e-6)
    np.testing.assert_allclose(actor.extras["mean"], out.mean(dim=1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(probs, torch.softmax(out, dim=1)[2].numpy(), rtol=1e-6)
    again = sampler(5)
    assert np.array_equal(again.act(obs, 0.0)[0], actions)
    many = np.concatenate([actor.act(obs, 0.0)[0] for _ in range(200)])
    assert set(many.tolist()) == {0, 1, 2}  # it samples, not argmax
    device_side = sampler(5)
    device_side._make_buffers(OBS, "float32", pin=False)
    device_side._stage(obs, 0.0, 2)
    device_side._body(net)
    chosen = device_side._out[:24].numpy().reshape(8, 3)
    assert np.array_equal(chosen[:, 0].astype(np.int64), actions)
    np.testing.assert_allclose(chosen[:, 1], want_logp, rtol=1e-6)
    np.testing.assert_allclose(device_side._out[24:].numpy(), probs, rtol=1e-6)


def test_training_explores_as_play_and_evaluations_do_and_keeps_the_greedy_values():
    """Epsilon-greedy through the actor picks exactly what the one exploration of play and
    evaluations picks from the same generator (a seeded run's actions did not change when
    acting became the learner's), and PQN's policy keeps each row's greedy value beside it;
    at epsilon 1 no forward pass runs and nothing is kept."""
    from edgerl.learners.explore import epsilon_greedy

    torch.manual_seed(0)
    net = MLP(4, 3, (8,))
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    with torch.no_grad():
        q = net(torch.from_numpy(obs)).numpy()
    rng = np.random.default_rng(9)
    actor = Actor(
        ActorWeights(net, False),
        EpsilonGreedy(net, 3, keep_values=True),
        8,
        rng,
        OBS,
        "float32",
        False,
    )
    reference = np.random.default_rng(9)
    for epsilon in (0.0, 0.3, 0.9):
        actions, _ = actor.act(obs, epsilon)
        assert np.array_equal(actions, epsilon_greedy(q, epsilon, 3, 8, reference))
        np.testing.assert_allclose(actor.extras["value"], q.max(axis=1), rtol=1e-6)
    actor.act(obs, 1.0)
    assert actor.extras == {}
