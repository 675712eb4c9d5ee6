"""A checkpoint's training state beside its network, checked as a run resumes from it: finite
values throughout the learner's state, the replay's entry, and every random state.

A checkpoint's hash proves only that the file is whole, not who wrote it. Each of these, damaged,
was an internal error halfway through resuming (``rng.actor = "x"``, ``rng = {}``, a
``rng.torch`` of another size, ``replay.learn_from = "ab"``) or a run that trained on NaN; here
each is one sentence naming the field (:class:`SavedStateError`), said before the run goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import MAX_STEP
from edgerl.memories import Memory

MAX_DEPTH = 64  # nothing a learner saves nests deeper


class SavedStateError(CheckpointError):
    """A field of a checkpoint's training state is damaged: one sentence naming it."""

    def __init__(self, path: object, key: str, detail: str) -> None:
        super().__init__(
            f"checkpoint {path} has a damaged {key} ({detail}); was it written by edgerl? Move "
            "it aside to resume from the one before"
        )


def nonfinite(state: Any, where: str = "learner") -> str | None:
    """Where in ``state`` (a learner's saved state) a floating-point tensor holds NaN or
    infinite values (``learner.optimizer.state.0.exp_avg``), or None: weights, a target
    network or an optimizer's moments that hold them train on NaN from the first update."""
    stack: list[tuple[Any, str, int]] = [(state, where, 0)]
    while stack:
        value, at, depth = stack.pop()
        if depth > MAX_DEPTH:
            return at
        if isinstance(value, torch.Tensor):
            if (value.is_floating_point() or value.is_complex()) and not bool(
                torch.isfinite(value).all()
            ):
                return at
        elif isinstance(value, dict):
            stack.extend((v, f"{at}.{str(k)[:40]}", depth + 1) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, f"{at}.{i}", depth + 1) for i, v in enumerate(value))
    return None


def check_replay_entry(saved: dict[str, Any] | None, path: object) -> None:
    """Raises SavedStateError when the checkpoint's replay entry (the replay files it resumes
    with, :meth:`edgerl.run.checkpointer.Checkpointer.save`) is not what edgerl writes."""
    if not saved:
        return
    manifest, learn_from = saved.get("manifest"), saved.get("learn_from")
    if not isinstance(manifest, str):
        raise SavedStateError(path, "replay.manifest", "not a file name")
    counts = isinstance(learn_from, (list, tuple)) and len(learn_from) == 2
    if not counts or not all(_count(v) for v in learn_from):  # type: ignore[union-attr]
        raise SavedStateError(path, "replay.learn_from", "not a step and an update count")
    if "train_freq" in saved and not _count(saved["train_freq"]):
        raise SavedStateError(path, "replay.train_freq", "not a count of steps")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def restore_rngs(
    rng: dict[str, Any],
    actor: np.random.Generator,
    memory: Memory,
    device: torch.device,
    path: object,
) -> None:
    """Set the actor's, the memory's and torch's random states (and CUDA's on a GPU) from a
    checkpoint's ``rng``; raises SavedStateError naming the first one missing or damaged."""

    def set_actor(state: object) -> None:
        actor.bit_generator.state = state  # type: ignore[assignment]

    restores: dict[str, Callable[[Any], None]] = {
        "actor": set_actor,
        "replay": memory.set_rng_state,
        "torch": torch.set_rng_state,
    }
    for key, restore in restores.items():
        if key not in rng:
            raise SavedStateError(path, f"rng.{key}", "missing")
        try:
            restore(rng[key])
        except (TypeError, ValueError, KeyError, RuntimeError, OverflowError) as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            detail = (lines or [type(e).__name__])[0][:160]
            raise SavedStateError(path, f"rng.{key}", detail) from None
    cuda = rng.get("cuda")
    if device.type == "cuda" and cuda is not None:
        if not isinstance(cuda, torch.Tensor) or cuda.dtype != torch.uint8:
            raise SavedStateError(path, "rng.cuda", "not a random state")
        with contextlib.suppress(RuntimeError):
            torch.cuda.set_rng_state(cuda, device)
