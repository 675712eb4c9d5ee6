"""The learner (dqn.py): its precision handling, checked on the CPU where the logic allows, and
optimizer state saved on a GPU loading on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from edgerl.config import AgentConfig, PerfConfig
from edgerl.envs import EnvSpec
from edgerl.export.common import collect_observations
from edgerl.learners.dqn import DQN
from edgerl.learners.nets import MLP, NatureCNN
from edgerl.memories.replay.sampling import example_batch

from .helpers import random_batch

CPU = torch.device("cpu")
PONG = EnvSpec("ALE/Pong-v5", "frames", (4, 84, 84), "uint8", 6, ("NOOP",) * 6)
FULL = PerfConfig(amp="off", cuda_graphs="off", compile="off")


def pong_like_network(seed: int = 0) -> NatureCNN:
    """A Nature CNN whose Q-values look like a trained agent's: about 2, with small gaps."""
    torch.manual_seed(seed)
    net = NatureCNN(4, 6)
    with torch.no_grad():
        net.head[2].bias += 2.0
    return net


def bf16_learner(net: torch.nn.Module) -> DQN:
    """A learner doing its update under CPU bf16 autocast, as a GPU learner does under
    ``perf.amp=bf16`` (and a CPU learner where the CPU does bf16 in hardware)."""
    learner = DQN(net, AgentConfig(), CPU, FULL)
    learner.amp = torch.bfloat16
    return learner


def test_a_bf16_update_keeps_its_gradient_moves_the_weights_and_matches_fp32():
    batch = example_batch(PONG, 32, CPU, random=True)
    fp32 = DQN(pong_like_network(), AgentConfig(), CPU, FULL)
    bf16 = bf16_learner(copy.deepcopy(fp32.q))

    loss = bf16.loss(batch)
    assert loss.grad_fn is not None  # backward() would raise without it
    assert loss.dtype == torch.float32
    reference = fp32.loss(batch)
    got, want = float(loss.detach()), float(reference.detach())
    assert abs(got - want) <= 2e-2 * max(1.0, abs(want))

    before = [p.detach().clone() for p in bf16.q.parameters()]
    bf16.update(batch)
    moved = [not torch.equal(b, p) for b, p in zip(before, bf16.q.parameters(), strict=True)]
    assert all(moved)


def test_the_bf16_update_casts_weights_afresh_in_every_pass():
    """The autocast weight cache stays off: with it, a cast made in the no-grad pass over the
    next observations is reused by the gradient pass, which on torch before pytorch#112583 (the
    builds JetPack 6 ships) leaves the loss without a gradient; CUDA graph capture needs it off
    too."""
    learner = bf16_learner(pong_like_network())
    seen: list[bool] = []
    learner.q.register_forward_pre_hook(lambda *_: seen.append(torch.is_autocast_cache_enabled()))
    learner.update(example_batch(PONG, 8, CPU, random=True))
    assert seen == [False, False]  # the next-action pass and the gradient pass


def test_q_values_stay_fp32_under_mixed_precision():
    """bf16 keeps 8 bits of mantissa: computed in bf16, Q-values of about 2 were off by 0.7% of
    max|Q| on Pong frames, the size of an action gap; the output layer runs in fp32."""
    net = pong_like_network()
    obs = torch.from_numpy(collect_observations({"id": "ALE/Pong-v5"}, 64, every=3))
    with torch.no_grad():
        reference = net(obs)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q = net(obs)
    assert q.dtype == torch.float32
    error = float((q - reference).abs().max() / reference.abs().max())
    assert error < 1e-3


def test_the_mlp_also_returns_fp32_q_values_under_autocast():
    torch.manual_seed(1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert MLP(4, 2, (64, 64))(torch.randn(8, 4)).dtype == torch.float32


def test_an_fp16_typed_network_keeps_its_output_layer_in_fp16():
    """The FP16-typed ONNX export runs the whole network in fp16, outside autocast."""
    net = pong_like_network().half()
    net.input_dtype = torch.float16
    obs = torch.zeros((2, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert net(obs).dtype == torch.float16


def test_optimizer_state_from_a_capturable_optimizer_loads_on_the_cpu():
    gpu_like = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    gpu_like.update(random_batch())
    state = gpu_like.state_dict()
    for group in state["optimizer"]["param_groups"]:  # as a CUDA-graph run saves it
        group.update(lr=torch.tensor(group["lr"]), capturable=True, fused=None)
    here = DQN(NatureCNN(4, 6), AgentConfig(), CPU)
    here.load_state_dict(state)
    assert isinstance(here.optimizer.param_groups[0]["lr"], float)
    assert not here.optimizer.param_groups[0]["capturable"]
    here.update(random_batch())  # and it steps


@pytest.mark.parametrize(
    ("setting", "graph_samples", "target_period", "max_ahead", "k"),
    [
        (0, False, 1000, 8, 1),  # no graph that samples: one update per call
        (0, True, 1000, 8, 4),  # auto: 4, which divides the target period
        (0, True, 1002, 8, 3),  # the largest up to 4 that divides it: syncs between launches
        (0, True, 1001, 8, 1),  # 1001 = 7 x 11 x 13: only 1 divides it below 4
        (0, True, 1000, 2, 2),  # never more than perf.max_ahead lets the learner run ahead
        (6, False, 1000, 8, 6),  # a number is taken as it is
    ],
)
def test_updates_per_launch(setting, graph_samples, target_period, max_ahead, k):
    from edgerl.learners.dqn import resolve_updates_per_launch

    assert resolve_updates_per_launch(setting, graph_samples, target_period, max_ahead) == k


def test_one_online_forward_over_obs_and_next_obs_is_the_two_forwards():
    batch = random_batch()
    cfg = AgentConfig(adam_eps=1e-5)
    perf = PerfConfig(amp="off", cuda_graphs="off", compile="off")
    apart = DQN(pong_like_network(), cfg, CPU, perf)
    joint = DQN(pong_like_network(), cfg, CPU, perf)
    joint.joint_forward = True  # what CUDA uses (on a CPU the joint backward costs more)
    assert not apart.joint_forward
    losses = [learner.loss(batch) for learner in (apart, joint)]
    torch.testing.assert_close(losses[0], losses[1])
    for loss in losses:
        loss.backward()
    for a, j in zip(apart.q.parameters(), joint.q.parameters(), strict=True):
        torch.testing.assert_close(a.grad, j.grad, rtol=1e-5, atol=1e-7)
    assert all(g["eps"] == 1e-5 for g in joint.optimizer.param_groups)  # agent.adam_eps


def test_a_learner_made_on_cuda_samples_in_its_graph_from_a_replay_on_cuda_0(monkeypatch):
    """``cuda`` and ``cuda:0`` are one device: a learner handed ``torch.device("cuda")`` (as
    the GPU tests' helpers do) captures the graph that samples the replay on ``cuda:0``
    (which a replay always reports), instead of silently taking the path where each batch is
    sampled apart. Stand-ins: the current CUDA device is 0, a CPU learner plays the CUDA one,
    and the captures are recorded, not made."""
    from types import SimpleNamespace

    from edgerl.config import Config
    from edgerl.hw.device import same_device
    from edgerl.learners.dqn import KIND

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert same_device("cuda", torch.device("cuda", 0)) and same_device(CPU, "cpu")
    assert not same_device("cuda:1", "cuda") and not same_device(CPU, "cuda:0")

    learner = DQN(MLP(4, 2, (8,)), AgentConfig(), CPU)
    learner.device = torch.device("cuda")  # how a caller may name the GPU
    learner.fast.cuda_graphs = True
    captured: list[str] = []
    monkeypatch.setattr(learner.fast, "prepare_sampling", lambda *a: captured.append("samples"))
    monkeypatch.setattr(learner.fast, "prepare", lambda *a: captured.append("batch copied in"))
    replay = SimpleNamespace(device=torch.device("cuda", 0))
    spec = EnvSpec("CartPole-v1", "vector", (4,), "float32", 2, ("l", "r"))
    monkeypatch.setattr("edgerl.learners.dqn.example_batch", lambda *a: None)  # no CUDA tensors
    KIND.prepare(learner, Config(), spec, replay, remaining_updates=1000)
    assert captured == ["samples"]
    assert learner.per_launch > 1  # auto: several sampled updates per launch
