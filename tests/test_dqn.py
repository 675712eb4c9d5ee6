"""The learner's precision and device handling, checked on the CPU where the logic allows."""

from __future__ import annotations

import copy

import pytest
import torch

from edgerl.config import AgentConfig, PerfConfig
from edgerl.device import make_grad_scaler
from edgerl.dqn import DQN
from edgerl.envs import EnvSpec
from edgerl.errors import DeviceError
from edgerl.export.common import collect_observations
from edgerl.nets import MLP, NatureCNN
from edgerl.replay import available_memory, example_batch

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
    ``perf.amp=bf16`` (the CPU path refuses AMP by choice, not because it cannot)."""
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


def test_auto_precision_leaves_a_small_mlp_in_fp32():
    """Vector observations lose precision in bf16 before the first layer (0.5% on CartPole-like
    inputs here), and a small MLP's update gains nothing from it."""
    from edgerl.device import resolve_amp

    perf = PerfConfig(amp="auto", cuda_graphs="off", compile="off")
    assert resolve_amp(perf.amp, torch.device("cuda"), (8, 7), frames=False) is None
    assert resolve_amp(perf.amp, torch.device("cuda"), (8, 7), frames=True) is torch.bfloat16
    assert resolve_amp("bf16", torch.device("cuda"), (8, 7), frames=False) is torch.bfloat16


def test_an_fp16_typed_network_keeps_its_output_layer_in_fp16():
    """The FP16-typed ONNX export runs the whole network in fp16, outside autocast."""
    net = pong_like_network().half()
    net.input_dtype = torch.float16
    obs = torch.zeros((2, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert net(obs).dtype == torch.float16


def test_grad_scaler_falls_back_to_the_cuda_amp_name(monkeypatch):
    """NVIDIA's torch 2.3 pre-releases for JetPack 6.0 predate torch.amp.GradScaler."""
    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    with pytest.warns((UserWarning, FutureWarning)):  # no CUDA here / the old name's notice
        scaler = make_grad_scaler()
    assert isinstance(scaler, torch.cuda.amp.GradScaler)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_an_unusable_gpu_is_one_sentence_not_a_traceback():
    with pytest.raises(DeviceError, match=r"cannot read the free memory of the CUDA GPU .*doctor"):
        available_memory(torch.device("cuda"))


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("2.3.0a0+ebedce2.nv24.02", True),  # NVIDIA, JetPack 6.0: a pre-release of the floor
        ("2.4.0a0+07cecf4168.nv24.05", True),
        ("2.5.0a0+872d972e41.nv24.08", True),  # JetPack 6.1
        ("2.13.0+cpu", True),
        ("2.2.2", False),
        ("2.0.0.nv23.05", False),  # JetPack 5
        ("1.10.0", False),  # JetPack 4
        ("unknown", False),
    ],
)
def test_the_torch_floor_counts_nvidia_prereleases_by_their_release(version, ok):
    from edgerl.versions import PlatformError, check_torch

    if ok:
        check_torch(version)
    else:
        with pytest.raises(PlatformError, match=r"needs PyTorch 2\.3 or newer .* this is "):
            check_torch(version)


def test_a_too_old_torch_is_one_sentence_at_start_up(cli, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.1.2+cu121")
    r = cli("train", "--env", "CartPole-v1", "--steps", "10")
    assert r.code == 2 and r.out == ""
    assert r.err.startswith("edgerl: error: edgerl needs PyTorch 2.3 or newer")
    assert "Traceback" not in r.err


def test_compiling_the_update_prints_no_profiler_warning():
    """Adam's step carries a profiler marker that dynamo warns about, through the progress bar."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from edgerl.fast_update import quiet_profiler_notes\n"
        "quiet_profiler_notes()\n"
        "def f(x):\n"
        "    with torch.autograd.profiler.record_function('marker'):\n"
        "        return x * 2\n"
        "print(torch.compile(f, backend='eager')(torch.ones(3)).sum().item())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "6.0", r.stderr
    assert "Profiler" not in r.stderr
