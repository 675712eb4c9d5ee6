"""The first run (``edgerl train --quick``, ``make run``) and how long a run takes on a CPU.

``--quick`` trains what shows learning within minutes on the machine at hand, as CleanRL's and
RL Zoo's first examples do: CartPole-v1 for 60,000 steps on a CPU (its preset solves it: greedy
return 500), and Pong with the settings of the classic fast-Pong recipes for 500,000 steps where
a CUDA GPU is. An ``--env`` given with it keeps that game and takes the quick settings of its kind.

Atari on a CPU is slow (a few hundred env steps/s on two cores), so a long Atari run on a CPU is
said so once its pace is measured (:mod:`edgerl.report.estimate`), with the quick run instead.
"""

from __future__ import annotations

from typing import Any

import torch

from edgerl.config import Config, Layer
from edgerl.config.presets import QUICK

QUICK_SOURCE = "--quick"
CARTPOLE = "CartPole-v1"
PONG = "ALE/Pong-v5"
LONG_RUN_S = 2 * 3600.0  # an Atari run on a CPU longer than this is said to be long


def uses_cuda(perf_device: str) -> bool:
    """Whether training would run on a CUDA GPU for ``perf.device``."""
    if perf_device == "cpu":
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver: training says so itself
        return False


def quick_layer(cfg: Config) -> Layer:
    """The settings of ``--quick`` for a config resolved without it: the game by the device
    unless one was given, and the quick values of the game's kind (never over a key the
    command line sets, since those layers come after this one)."""
    from edgerl.envs import ale_game, probe
    from edgerl.errors import EdgerlError

    values: dict[str, Any] = {}
    if "env.id" in cfg.explicit:
        try:  # a picture game takes the frames' values too
            frames = probe(cfg.env).has_frames
        except EdgerlError:  # said when training starts; here, the kind its id suggests
            frames = ale_game(cfg.env.id) is not None
    else:
        frames = uses_cuda(cfg.perf.device)
        values["env.id"] = PONG if frames else CARTPOLE
    values.update(QUICK["frames" if frames else "vector"])
    return Layer(QUICK_SOURCE, values)


def hours(seconds: float) -> str:
    """``seconds`` as people say a long time: ``about 28 hours``, ``about 3 days``."""
    h = seconds / 3600
    if h >= 72:
        return f"about {h / 24:.0f} days"
    return f"about {h:.0f} hours" if h >= 2 else f"about {seconds / 60:.0f} minutes"
