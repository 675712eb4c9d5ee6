"""The PyTorch backend: a Q-network restored from an edgerl checkpoint (a run's, or its best
policy), on the CPU or a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.config import from_dict
from edgerl.config.learners import LEARNERS
from edgerl.envs import EnvSpec
from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import POLICY_KEY, Checkpoint, load
from edgerl.hw.device import resolve_device
from edgerl.learners.nets import NatureCNN, build_q_network, weights_problem


class TorchPolicy:
    """A PyTorch Q-network restored from an edgerl checkpoint."""

    backend = "torch"

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu", source: Path | None = None):
        try:
            self.spec = EnvSpec.from_dict(checkpoint.env)
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {source} has a damaged game description ({e}); was it written by "
                "edgerl?"
            ) from None
        env_config = checkpoint.config.get("env")
        if not isinstance(env_config, dict):
            raise CheckpointError(
                f"checkpoint {source} lacks its [env] settings; was it written by edgerl?"
            )
        entry = LEARNERS.get(checkpoint.kind)
        if entry is None:
            raise CheckpointError(
                f"checkpoint {source} holds a {checkpoint.kind!r} learner, which this edgerl does "
                f"not know (it knows {', '.join(sorted(LEARNERS))})"
            )
        cfg = from_dict(checkpoint.config, f"checkpoint {source}")
        self.source = source
        self.env_config = env_config
        self.hidden = cfg.agent.hidden
        self.layer_norm = entry.layer_norm  # PQN's network normalises its layers
        self.step = checkpoint.step
        q_state = checkpoint.learner.get(POLICY_KEY)
        if not isinstance(q_state, dict):
            raise CheckpointError(
                f"checkpoint {source} holds no policy network; was it written by edgerl?"
            )
        self._q_state = q_state
        self.device = resolve_device(device)
        # Built without random initial weights (they are replaced at once): an evaluation
        # beside training must not draw from torch's global RNG, which the trainer's state holds.
        with torch.device("meta"):
            net = build_q_network(self.spec, cfg.agent.hidden, self.layer_norm)
        problem = weights_problem(net, q_state)
        if problem is not None:
            raise CheckpointError(
                f"checkpoint {source}'s policy network does not fit its own settings "
                f"({problem}); was it written by edgerl?"
            )
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
