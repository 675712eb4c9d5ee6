"""What learning costs in arithmetic, and what this machine can do: ``edgerl bench``'s compute
figures.

On a CPU the update is what limits training, so the useful question is how much of the machine's
arithmetic the update turns into learning. This module counts the network's multiply-adds per
forward pass (from its layers, on one real observation), turns them into FLOPs per env step for
the configured learner, and measures the machine's own peak in the same run: a large fp32 matrix
product (what the cores can do at best) and the network's forward pass alone at a batch that
keeps them busy (what its convolutions can do here). The update's GFLOP/s against that peak is
the share of the physical limit training reaches.

FLOPs are counted as 2 per multiply-add, and a backward pass as twice its forward (the usual
estimate; the first layer's gradient for the input, which nobody needs, is not skipped in it).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn

from edgerl.config import Config
from edgerl.learners.kinds import learner_kind

PEAK_MATMUL_SIZE = 2048
PEAK_FORWARD_BATCH = 256


def macs_per_forward(net: nn.Module, obs_shape: tuple[int, ...], obs_dtype: str) -> int:
    """Multiply-adds of one observation's forward pass through ``net``'s convolutions and dense
    layers (normalisation and activations are a few per value: left out)."""
    total = 0

    def count(module: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0]
            total += out[0].numel() * per_output * module.kernel_size[1]
        elif isinstance(module, nn.Linear):
            total += module.in_features * module.out_features

    hooks = [
        m.register_forward_hook(count)
        for m in net.modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    ]
    try:
        device = next(net.parameters()).device
        with torch.no_grad():
            net(torch.zeros((1, *obs_shape), dtype=getattr(torch, obs_dtype), device=device))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def forwards_per_env_step(cfg: Config, values_reused: bool) -> dict[str, float]:
    """Forward-pass equivalents per env step of ``cfg``'s learner, by what they are for:
    ``act`` (one forward per observation), ``values`` (PQN's greedy values of the next
    observations: all of them, or only each rollout's last when the actor's are reused),
    ``targets`` (DQN's target and Double-DQN passes) and ``gradients`` (forward and backward).
    Each learner's kind counts its own."""
    return learner_kind(cfg.agent.algo).forwards_per_env_step(cfg, values_reused)


def learning_forwards_per_update(cfg: Config) -> float:
    """Forward-pass equivalents of one of the learner's gradient updates, as ``edgerl bench``'s
    learner-alone measurement makes it (its kind's)."""
    return learner_kind(cfg.agent.algo).forwards_per_update(cfg)


def matmul_peak_gflops(
    device: torch.device, seconds: float, dtype: torch.dtype = torch.float32
) -> float:
    """GFLOP/s of a large matrix product of ``dtype`` on ``device`` with this process's
    threads: the best this machine's cores (or GPU) do in that precision."""
    n = PEAK_MATMUL_SIZE
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return _gflops(lambda: a @ b, 2.0 * n**3, device, seconds)


def hardware_precisions(device: torch.device) -> dict[str, torch.dtype]:
    """The precisions whose matrix products ``device`` runs in hardware, by ``perf.amp``'s
    names: fp32 always, bf16 where ``perf.amp=bf16`` is allowed there (a CPU with AMX or
    AVX-512 BF16, or Arm's bf16; a GPU of compute capability 8.0 or newer)."""
    from edgerl.errors import ConfigError
    from edgerl.hw.device import resolve_amp

    found = {"fp32": torch.float32}
    with contextlib.suppress(ConfigError):  # raised where bf16 is not in the hardware
        found["bf16"] = resolve_amp("bf16", device) or torch.bfloat16
    return found


def forward_gflops(
    net: nn.Module, obs_shape: tuple[int, ...], obs_dtype: str, macs: int, seconds: float
) -> float:
    """GFLOP/s of ``net``'s forward pass alone at :data:`PEAK_FORWARD_BATCH` observations:
    what its layers reach here when nothing else runs."""
    device = next(net.parameters()).device
    x = torch.zeros(
        (PEAK_FORWARD_BATCH, *obs_shape), dtype=getattr(torch, obs_dtype), device=device
    )

    def forward() -> None:
        with torch.no_grad():
            net(x)

    return _gflops(forward, 2.0 * macs * PEAK_FORWARD_BATCH, device, seconds)


def _gflops(work: Any, flops: float, device: torch.device, seconds: float) -> float:
    cuda = device.type == "cuda"
    for _ in range(2):  # warm-up: allocations, kernel selection
        work()
    if cuda:
        torch.cuda.synchronize()
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or n < 3:
        work()
        if cuda:
            torch.cuda.synchronize()
        n += 1
    return n * flops / (time.perf_counter() - started) / 1e9
