"""Helpers shared by test modules: small real configs, batches and frames, a fresh Python
process's output."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

from edgerl.config import build_layers, resolve
from edgerl.memories.replay.sampling import Batch
from edgerl.stream import FrameMeta

CUDA = torch.cuda.is_available()
# Unindexed on purpose: learners and replays must take "cuda" for the "cuda:0" tensors report.
CPU, GPU = torch.device("cpu"), torch.device("cuda")


def pong_config(tmp_path, *sets: str, steps: int = 1600):
    return resolve(
        build_layers(
            None,
            [
                "agent.learning_starts=400",
                "agent.batch_size=8",
                "agent.train_freq=4",
                "replay.capacity=4000",
                "hw.monitor=false",
                "display.enabled=false",
                *sets,
            ],
            {"env.id": "ALE/Pong-v5", "train.steps": steps, "train.run_dir": str(tmp_path / "run")},
            use_system=False,
        )
    )


def random_batch(b: int = 16) -> Batch:
    torch.manual_seed(1)
    obs = torch.randint(0, 256, (b, 4, 84, 84), dtype=torch.uint8)
    return Batch(
        obs,
        torch.randint(0, 6, (b,)),
        torch.randn(b),
        torch.roll(obs, 1, 0),
        0.99 * (torch.rand(b) >= 0.2).float(),
        torch.ones(b),
    )


ACTIONS = ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"]


def frame_for(step: int) -> np.ndarray:
    return np.full((84, 84), step % 251, dtype=np.uint8)


def meta_for(step: int) -> FrameMeta:
    return FrameMeta(
        step=step,
        episode=1,
        episode_return=-3.0,
        epsilon=0.5,
        action=step % 6,
        q_values=tuple(float(i + step) for i in range(6)),
    )


def fresh_python_lines(code: str, *args: str, env: dict[str, str]) -> list[str]:
    """The stdout lines of ``code`` run by a fresh Python with ``args`` and exactly ``env``
    (a failure raises, with its stderr)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.splitlines()
