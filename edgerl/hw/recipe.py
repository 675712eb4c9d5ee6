"""The recipe a machine's class trains by default: the fastest one proven (or, for a Jetson,
estimated) for its class. The calibration (:mod:`edgerl.run.calibrate`: ``--preset board`` and
the service) starts from it, measures it beside the recipes it may be traded for and trains the
fastest; with ``hw.calibrate = false`` it is trained as it is.

- **No GPU PyTorch can use**: ``pong-cpu`` (PQN on the CPU cores; on record on two cores).
- **A GPU of its own** (a desktop or server card): ``pong-gpu`` (PQN in the lagged pipeline
  with a graphed update; on record on an H100 and an H200).
- **An integrated GPU** (a Jetson: the GPU shares the board's memory and the emulators take the
  CPU cores): ``pong-jetson``, pong-gpu's recipe with the precision PyTorch's checks choose,
  and 64 environments on a board of less than 16 GiB (a Nano or an Orin Nano: the rollout's
  frames and the emulators share its memory with the GPU), 128 on larger ones. Estimated: no
  Jetson run is on record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgerl.config import Layer
from edgerl.config.presets import NAMED_PRESETS
from edgerl.hw.platform import Platform, detect

SMALL_BOARD_GIB = 16.0  # below this, a Jetson's recipe runs 64 environments, not 128
SMALL_BOARD_ENVS = 64


@dataclass(frozen=True)
class Recipe:
    """A named preset chosen for a machine, why, and what the machine changes in it."""

    preset: str  # a name of NAMED_PRESETS
    why: str  # the machine's class, in words
    changes: dict[str, Any]  # values over the preset's (env.num_envs on a small board)

    @property
    def values(self) -> dict[str, Any]:
        return {**NAMED_PRESETS[self.preset].values, **self.changes}

    @property
    def name(self) -> str:
        """The preset and the values the recipe changes in it: ``pong-cpu pqn.epochs=1``."""
        return " ".join([self.preset, *(f"{k}={v}" for k, v in self.changes.items())])

    def describe(self) -> str:
        return f"{self.name} ({self.why})"

    def layer(self, keep_game: bool = False) -> Layer:
        """The recipe as a config layer, naming itself in ``train.recipe``; ``keep_game``
        leaves ``env.id`` out (a config that names another game keeps it)."""
        values = {**self.values, "train.recipe": self.describe()}
        if keep_game:
            values.pop("env.id", None)
        return Layer(f"the recipe for this machine, {self.name}", values)


def board_recipe(
    platform: Platform | None = None, cuda: bool | None = None, integrated: bool | None = None
) -> Recipe:
    """The recipe for this machine (or for ``platform`` with or without a usable CUDA GPU,
    integrated or not: what the tests give for boards that are not here)."""
    platform = platform or detect()
    if cuda is None or integrated is None:
        import torch

        from edgerl.hw.device import integrated_gpu

        cuda = torch.cuda.is_available() if cuda is None else cuda
        if integrated is None:
            integrated = cuda and integrated_gpu(torch.device("cuda"))
    if not cuda:
        board = "a Jetson whose GPU PyTorch cannot use" if platform.is_jetson else "no CUDA GPU"
        return Recipe("pong-cpu", f"{board}: PQN on {platform.cpu_count} CPU cores", {})
    if integrated or platform.is_jetson:
        memory = platform.memory_gb
        small = memory is not None and memory < SMALL_BOARD_GIB
        changes = {"env.num_envs": SMALL_BOARD_ENVS} if small else {}
        shared = f"{memory:.0f} GiB" if memory is not None else "its memory"
        envs = SMALL_BOARD_ENVS if small else 128
        return Recipe(
            "pong-jetson",
            f"an integrated GPU sharing {shared} with {platform.cpu_count} CPU cores: PQN on "
            f"the GPU with {envs} environments, estimated (no Jetson run on record)",
            changes,
        )
    return Recipe("pong-gpu", "a CUDA GPU of its own: PQN in the lagged pipeline", {})
