"""The PyTorch backend: a Q-network restored from an edgerl checkpoint (a run's, or its best
policy), on the CPU or a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.config import from_dict
from edgerl.device import resolve_device
from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import load
from edgerl.learn.envs import EnvSpec
from edgerl.learn.nets import NatureCNN, build_q_network


class TorchPolicy:
    """A PyTorch Q-network restored from an edgerl checkpoint."""

    backend = "torch"

    def __init__(self, state: dict[str, Any], device: str = "cpu", source: Path | None = None):
        try:
            self.spec = EnvSpec.from_dict(state["env"])
            cfg = from_dict(state["config"], f"checkpoint {source}")
            q_state = state["learner"]["q"]
        except (KeyError, TypeError) as e:
            raise CheckpointError(
                f"checkpoint {source} lacks {e}; was it written by edgerl?"
            ) from None
        self.source = source
        self.env_config = state["config"]["env"]
        self.hidden = cfg.agent.hidden
        self.layer_norm = cfg.agent.algo == "pqn"  # PQN's network normalises its layers
        self.step = int(state.get("step", 0))
        self._q_state = q_state
        self.device = resolve_device(device)
        # Built without random initial weights (they are replaced at once): an evaluation
        # beside training must not draw from torch's global RNG, which the trainer's state holds.
        with torch.device("meta"):
            net = build_q_network(self.spec, cfg.agent.hidden, self.layer_norm)
        net.load_state_dict(q_state, assign=True)
        if isinstance(net, NatureCNN):
            net.use_channels_last()
        self.net = net.to(self.device).eval()

    def state_dict_cpu(self) -> dict[str, Any]:
        """The Q-network's weights as saved in the checkpoint (CPU tensors)."""
        return self._q_state

    @classmethod
    def from_file(cls, path: Path, device: str = "cpu") -> TorchPolicy:
        return cls(load(path), device, path)

    @torch.inference_mode()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.as_tensor(obs, device=self.device)).float().cpu().numpy()

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> np.ndarray:
        q = self.net(torch.as_tensor(obs, device=self.device))
        return q.argmax(dim=1).cpu().numpy()
