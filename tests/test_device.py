"""Device choices (device.py): mixed precision and CUDA graphs per GPU generation, their errors,
and the grad scaler on old torch."""

from __future__ import annotations

import pytest
import torch

from edgerl.config import PerfConfig
from edgerl.device import make_grad_scaler, resolve_amp, resolve_cuda_graphs
from edgerl.errors import ConfigError

from .helpers import CPU, GPU


@pytest.mark.parametrize(
    ("setting", "capability", "expected"),
    [
        ("auto", (8, 7), torch.bfloat16),  # Orin
        ("auto", (7, 2), torch.float16),  # Xavier
        ("auto", (5, 3), torch.float16),  # Nano
        ("auto", (6, 1), None),  # consumer Pascal: slow fp16
        ("off", (8, 7), None),
        ("fp16", (8, 7), torch.float16),
    ],
)
def test_mixed_precision_choice(setting, capability, expected):
    assert resolve_amp(setting, GPU, capability) is expected


def test_mixed_precision_errors():
    assert resolve_amp("auto", CPU) is None
    with pytest.raises(ConfigError, match=r"perf\.amp=fp16 needs a CUDA GPU"):
        resolve_amp("fp16", CPU)
    with pytest.raises(ConfigError, match=r"compute capability 8\.0 or newer"):
        resolve_amp("bf16", GPU, (7, 2))


def test_cuda_graph_choice():
    assert resolve_cuda_graphs("auto", GPU, torch.bfloat16)
    assert not resolve_cuda_graphs("auto", GPU, torch.float16)  # the grad scaler syncs
    assert not resolve_cuda_graphs("auto", CPU, None)
    with pytest.raises(ConfigError, match="cannot capture the fp16 grad scaler"):
        resolve_cuda_graphs("on", GPU, torch.float16)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        resolve_cuda_graphs("on", CPU, None)


def test_auto_precision_leaves_a_small_mlp_in_fp32():
    """Vector observations lose precision in bf16 before the first layer (0.5% on CartPole-like
    inputs here), and a small MLP's update gains nothing from it."""
    from edgerl.device import resolve_amp

    perf = PerfConfig(amp="auto", cuda_graphs="off", compile="off")
    assert resolve_amp(perf.amp, torch.device("cuda"), (8, 7), frames=False) is None
    assert resolve_amp(perf.amp, torch.device("cuda"), (8, 7), frames=True) is torch.bfloat16
    assert resolve_amp("bf16", torch.device("cuda"), (8, 7), frames=False) is torch.bfloat16


def test_grad_scaler_falls_back_to_the_cuda_amp_name(monkeypatch):
    """NVIDIA's torch 2.3 pre-releases for JetPack 6.0 predate torch.amp.GradScaler."""
    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    with pytest.warns((UserWarning, FutureWarning)):  # no CUDA here / the old name's notice
        scaler = make_grad_scaler()
    assert isinstance(scaler, torch.cuda.amp.GradScaler)
