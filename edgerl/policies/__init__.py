"""Learned policies behind one interface, and :func:`load_policy`, which opens one from a file.

A :class:`Policy` maps a batch of observations (numpy, exactly as the environment returns them) to
its network's outputs (Q-values, logits, or a continuous game's action) and greedy actions.
Backends, each in a module of its own and imported only when used: ``torch.py`` (a policy
network restored from a checkpoint), ``onnx.py`` (an exported ONNX file on ONNX Runtime)
and ``tensorrt.py`` (a TensorRT engine). They read the files :mod:`edgerl.export` writes; ``edgerl
play`` plays them, and the export's checks compare them with each other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgerl.envs import EnvSpec
from edgerl.errors import CheckpointError


class Policy(Protocol):
    backend: str
    spec: EnvSpec
    env_config: dict[str, Any]  # the [env] section the policy was trained with

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """The network's outputs, shape (batch, num_actions), float32: Q-values or logits;
        for a continuous game, the greedy action's numbers."""
        ...

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions: shape (batch,), int64; for a continuous game (batch, numbers),
        float32 within the bounds."""
        ...


def newest_checkpoint(run_dir: Path) -> Path:
    """The newest valid checkpoint of a run; raises CheckpointError if there is none."""
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory {run_dir} does not exist")
    from edgerl.files.checkpoint import CheckpointStore  # torch: not for those who only watch

    found = CheckpointStore(run_dir / "checkpoints", keep=1 << 30).newest_valid()
    if found is None:
        raise CheckpointError(f"run directory {run_dir} has no checkpoint yet")
    return found[0].path


# A model's file name says what plays it (``--backend`` says so for any other name).
MODEL_SUFFIXES = {
    ".ckpt": "torch",
    ".pt": "torch",
    ".onnx": "onnx",
    ".engine": "trt",
    ".plan": "trt",
}


def load_policy(
    *,
    model: Path | None = None,
    run_dir: Path | None = None,
    checkpoint: Path | None = None,
    backend: str = "auto",
    device: str = "cpu",
    threads: int = 0,
) -> Policy:
    """A policy from ``--model`` (checkpoint, .onnx or .engine) or a run's checkpoint.

    Raises CheckpointError / EdgerlError with a sentence when the file cannot be used.
    """
    if model is None:
        if checkpoint is not None:
            model = checkpoint
        elif run_dir is not None:
            model = newest_checkpoint(run_dir)
        else:
            raise CheckpointError("give a model with --model FILE or a run with --run-dir RUN")
    kind = backend
    if kind == "auto":
        suffix = model.suffix.lower()
        if suffix not in MODEL_SUFFIXES:
            raise CheckpointError(
                f"{model} is not a file edgerl plays (its name ends in {suffix or 'no suffix'!r}):"
                " give a checkpoint (.ckpt), an ONNX file (.onnx) or a TensorRT engine (.engine),"
                " or say which it is with --backend"
            )
        kind = MODEL_SUFFIXES[suffix]
    if not model.exists():  # said before a backend is loaded: a missing TensorRT is not the news
        what = {"torch": "checkpoint", "onnx": "ONNX file", "trt": "engine"}.get(kind, "model")
        raise CheckpointError(f"{what} {model} does not exist")
    if kind == "torch":
        from edgerl.policies.torch import TorchPolicy

        return TorchPolicy.from_file(model, device)
    if kind == "onnx":
        from edgerl.policies.onnx import OnnxPolicy

        return OnnxPolicy(model, threads=threads)
    if kind == "trt":
        from edgerl.policies.tensorrt import TensorRTPolicy

        return TensorRTPolicy(model)
    raise CheckpointError(f"unknown backend {backend!r}; use auto, torch, onnx or trt")
