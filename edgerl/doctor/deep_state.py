"""What ``edgerl doctor --deep``'s checks hand on to each other (:mod:`edgerl.doctor.deep`,
:mod:`edgerl.doctor.modes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

UPDATES = 3  # updates (units of learning) each check makes


@dataclass
class Outcome:
    losses: list[float]
    weights: list[torch.Tensor]  # after the updates, fp32 on the CPU
    describe: str
    learner: Any


@dataclass
class DeepState:
    """What the deep checks hand on to each other."""

    device: torch.device
    spec: Any = None
    cfg: Any = None
    batches: list[Any] | None = None
    replay: Any = None
    init: dict[str, torch.Tensor] | None = None
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    workdir: Path | None = None
    checkpoint: Path | None = None
    onnx: Path | None = None

    @property
    def trained(self) -> Outcome | None:
        """The learner the exports take: the eager updates, or the learner's own learning."""
        return self.outcomes.get("eager") or self.outcomes.get("rollout")
