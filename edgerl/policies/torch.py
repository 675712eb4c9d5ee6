"""The PyTorch backend: a Q-network restored from an edgerl checkpoint (a run's, or its best
policy), on the CPU or a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgerl.config import from_dict
from edgerl.config.learners import LEARNERS
from edgerl.envs import EnvSpec, greedy_actions
from edgerl.errors import CheckpointError
from edgerl.files.checkpoint import POLICY_KEY, Checkpoint, load
from edgerl.hw.device import resolve_device
from edgerl.learners.kinds import learner_kind
from edgerl.learners.nets import network_bytes, weights_problem
from edgerl.memories.budget import available_memory

# Playing holds a network's weights twice: as read from the file, and as the network uses them
# (on the GPU, or in channels-last order for the Nature CNN).
COPIES = 2


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
        if checkpoint.kind not in LEARNERS:
            raise CheckpointError(
                f"checkpoint {source} holds a {checkpoint.kind!r} learner, which this edgerl does "
                f"not know (it knows {', '.join(sorted(LEARNERS))})"
            )
        cfg = from_dict(checkpoint.config, f"checkpoint {source}")
        self.source = source
        self.env_config = env_config
        self.hidden = cfg.agent.hidden
        self.kind = learner_kind(checkpoint.kind)  # builds its network (PQN's has LayerNorm)
        # how its evaluations acted (a continuous game's network outputs its greedy action)
        self.samples = self.kind.samples_when_played and not self.spec.continuous
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
            net = self.fresh_network()
        if source is not None:  # a file's settings and weights are anyone's to write
            _check_memory(net, self.device, source)
        problem = weights_problem(net, q_state, finite=source is not None)
        if problem is not None:
            raise CheckpointError(
                f"checkpoint {source}'s policy network does not fit its own settings "
                f"({problem}); was it written by edgerl?"
            )
        net.load_state_dict(q_state, assign=True)
        if hasattr(net, "use_channels_last"):  # a CNN's (a Q-network's or in a policy's)
            net.use_channels_last()
        self.net = net.to(self.device).eval()

    def fresh_network(self) -> torch.nn.Module:
        """A network of the policy's shape (its learner kind's, for its game and widths), fresh
        weights: what export traces once the checkpoint's are loaded."""
        return self.kind.network(self.spec, tuple(self.hidden))

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
        return greedy_actions(self.spec, self.q_values(obs))


def _check_memory(net: torch.nn.Module, device: torch.device, source: Path) -> None:
    """Raises CheckpointError when the network a checkpoint's settings describe (``net``, on
    the meta device) would not fit in the memory free here: its widths are the file's to say,
    and 16 layers of 65,536 are 256 GiB."""
    weights = network_bytes(net)
    places = [torch.device("cpu")] + ([device] if device.type == "cuda" else [])
    for place in places:
        free, where = available_memory(place)
        if COPIES * weights > free:
            raise CheckpointError(
                f"checkpoint {source}'s policy network has {weights / 2**30:,.1f} GiB of "
                f"weights, and using it needs {COPIES} copies, more than the "
                f"{free / 2**30:,.1f} GiB of {where} memory free here; free memory or use it "
                "elsewhere"
            )
