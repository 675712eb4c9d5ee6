"""Q-networks (and PPO's policy networks: the same shapes, their outputs the actions' logits):
the Nature CNN for Atari frame stacks, an MLP for vector observations.

Either can put a LayerNorm after every hidden layer (``layer_norm``), as PQN does: normalised
features keep Q-learning without a target network stable (Gallici et al. 2024).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgerl.envs import EnvSpec
from edgerl.files.checkpoint_check import tensor_problem


def output_layer(layer: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """The Q-values from the last hidden layer, computed in the layer's own precision.

    Under autocast the hidden layers run in bf16/fp16 and the output would too: bf16 carries
    8 bits of mantissa, so Q-values of about 2 were off by 0.7% of max|Q| on Pong frames, the
    size of typical action gaps and of one discount step. Outside autocast, in the weights'
    dtype (fp32, or fp16 for an FP16-typed export), the error fell to 4e-5. The layer is small
    (512 x actions), so this costs almost nothing.
    """
    if hidden.dtype == layer.weight.dtype:
        return layer(hidden)
    with torch.autocast(hidden.device.type, enabled=False):  # hidden came from autocast
        return layer(hidden.to(layer.weight.dtype))


def nhwc_layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm(x)`` for a channels-last picture ``x`` of shape (N, C, H, W) and a LayerNorm over
    (C, H, W), without the NCHW copies ``norm(x)`` makes of ``x`` and of its gradient: the
    permuted view (N, H, W, C) is contiguous, and the weights are permuted to match."""
    c, h, w = norm.normalized_shape
    weight = None if norm.weight is None else norm.weight.permute(1, 2, 0)
    bias = None if norm.bias is None else norm.bias.permute(1, 2, 0)
    y = F.layer_norm(x.permute(0, 2, 3, 1), (h, w, c), weight, bias, norm.eps)
    return y.permute(0, 3, 1, 2)


def channels_last_copy(obs: torch.Tensor) -> torch.Tensor:
    """``obs`` (N, C, H, W) as a channels-last tensor: itself where it already is one, else a
    copy, made on a CPU one channel plane at a time.

    For the uint8 frame stack (C = 4) the planes are 2.4x faster than ``obs.contiguous(
    memory_format=torch.channels_last)`` on a 2-core Xeon (0.79 ms against 1.86 for 128 Pong
    stacks): that copy moves one byte at a time, each plane copy runs along a contiguous source
    (docs/performance.md, "Gathering and reordering frames, and page faults"). The values
    are the same bytes."""
    if obs.is_contiguous(memory_format=torch.channels_last):
        return obs
    if obs.device.type != "cpu":
        return obs.contiguous(memory_format=torch.channels_last)
    n, c, h, w = obs.shape
    out = torch.empty((n, h, w, c), dtype=obs.dtype, device=obs.device)
    for i in range(c):
        out[..., i] = obs[:, i]
    return out.permute(0, 3, 1, 2)


class NatureCNN(nn.Module):
    """Mnih et al. (2015): three convolutions and two dense layers.

    Takes the uint8 frame stack as it comes from the environment and scales it inside, so the replay
    buffer, the actor and an exported ONNX/TensorRT graph all feed raw bytes.
    """

    def __init__(self, in_channels: int, num_actions: int, layer_norm: bool = False) -> None:
        super().__init__()

        def block(layer: nn.Module, shape: tuple[int, ...]) -> list[nn.Module]:
            # Without LayerNorm the layers keep the indices (and checkpoint keys) they always had.
            return [layer, nn.LayerNorm(shape), nn.ReLU()] if layer_norm else [layer, nn.ReLU()]

        self.layer_norm = layer_norm
        self.features = nn.Sequential(
            *block(nn.Conv2d(in_channels, 32, kernel_size=8, stride=4), (32, 20, 20)),
            *block(nn.Conv2d(32, 64, kernel_size=4, stride=2), (64, 9, 9)),
            *block(nn.Conv2d(64, 64, kernel_size=3, stride=1), (64, 7, 7)),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            *block(nn.Linear(64 * 7 * 7, 512), (512,)), nn.Linear(512, num_actions)
        )
        self.channels_last = False
        self.input_dtype = torch.float32  # float16 for an FP16-typed export

    def use_channels_last(self, enabled: bool = True) -> NatureCNN:
        """Store weights NHWC: cuDNN's and oneDNN's fast convolution layout (~1.1-1.5x here).

        ``enabled=False`` goes back to NCHW, the eager baseline ``edgerl bench`` and
        ``edgerl doctor --deep`` compare against.
        """
        self.channels_last = enabled
        fmt = torch.channels_last if enabled else torch.contiguous_format
        return self.to(memory_format=fmt)

    @property
    def last(self) -> nn.Linear:
        """The output layer (a policy learner puts a value head of its own beside it)."""
        return self.head[-1]

    def hidden(self, obs: torch.Tensor) -> torch.Tensor:
        """The last hidden layer's features, 512 per observation."""
        if self.channels_last:
            x = self._features_nhwc(obs)
        else:
            x = self.features(obs.to(self.input_dtype) / 255.0)
        return self.head[:-1](x)  # Linear(3136, 512), (LayerNorm,) ReLU

    def _features_nhwc(self, obs: torch.Tensor) -> torch.Tensor:
        """The convolutions' features with every picture kept NHWC, computed as the NCHW path
        computes them (the same operations, sums in another order: tests/test_nets.py holds the
        two within 1e-5).

        Two things the plain path does cost about a fifth of a CPU update at batch 128
        (docs/performance.md, "Layout copies"): scaling the frames before making them NHWC
        (three passes over the float stack: convert, divide, copy; here the bytes are reordered
        first, one plane at a time, then converted and divided in place), and LayerNorm, which
        takes an NHWC picture to NCHW and back, forward and backward. Each sample's (C, H, W)
        block is contiguous in either layout, so the same normalisation over (H, W, C) of a
        permuted view, its weights permuted alike, needs no copy.
        """
        x = channels_last_copy(obs).to(self.input_dtype, copy=True)
        x = x.div_(255.0)  # a copy of the caller's tensor: obs itself is never written
        *body, relu, flatten = self.features
        for layer in body:
            # Each LayerNorm here is over a picture's (C, H, W).
            x = nhwc_layer_norm(layer, x) if isinstance(layer, nn.LayerNorm) else layer(x)
        # Flatten takes the picture to NCHW order (the dense layer's weights are in it), and
        # its gradient comes back so: the last ReLU runs after that copy, not before, or its
        # backward pass meets a gradient in one layout and its output in the other (1.1 ms of a
        # Pong update on a 2-core Xeon, 0.14 after the copy; the update 37.8 ms against 38.6).
        return flatten(relu(x.contiguous()))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return output_layer(self.last, self.hidden(obs))


def hidden_layers(
    inputs: int, hidden: tuple[int, ...], activation: type[nn.Module] = nn.ReLU
) -> tuple[nn.Sequential, int]:
    """Linear layers of widths ``hidden``, each followed by ``activation``, from ``inputs``
    numbers; and the last width (the actor-critic learners' trunks: SAC's ReLU, PPO's
    Gaussian head's tanh)."""
    layers: list[nn.Module] = []
    width = inputs
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    return nn.Sequential(*layers), width


class MLP(nn.Module):
    """A plain ReLU MLP for small vector observations (CartPole and friends)."""

    def __init__(
        self, obs_dim: int, num_actions: int, hidden: tuple[int, ...], layer_norm: bool = False
    ) -> None:
        super().__init__()
        self.layer_norm = layer_norm
        layers: list[nn.Module] = []
        width = obs_dim
        for h in hidden:
            norm = [nn.LayerNorm(h)] if layer_norm else []  # without: the keys of old checkpoints
            layers += [nn.Linear(width, h), *norm, nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_actions))
        self.net = nn.Sequential(*layers)
        self.input_dtype = torch.float32

    @property
    def last(self) -> nn.Linear:
        """The output layer (a policy learner puts a value head of its own beside it)."""
        return self.net[-1]

    def hidden(self, obs: torch.Tensor) -> torch.Tensor:
        """The last hidden layer's features."""
        return self.net[:-1](obs.to(self.input_dtype))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return output_layer(self.last, self.hidden(obs))


def build_q_network(spec: EnvSpec, hidden: tuple[int, ...], layer_norm: bool = False) -> nn.Module:
    """The Q-network for an environment: Nature CNN for frames, MLP for vectors."""
    if spec.has_frames:
        return NatureCNN(spec.obs_shape[0], spec.num_actions, layer_norm)
    return MLP(spec.obs_shape[0], spec.num_actions, hidden, layer_norm)


def num_actions_of(net: nn.Module) -> int:
    """How many actions ``net`` (a Q-network of this module) scores: its last layer's width."""
    last = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    return last.out_features


def weights_problem(net: nn.Module, state: object, finite: bool = True) -> str | None:
    """What keeps ``state`` (weights read from a file) from being ``net``'s (None: nothing): a
    name missing or of its own, a value that is no tensor, a shape of its own, a tensor that is
    not plain and dense (:func:`~edgerl.files.checkpoint_check.tensor_problem`), a dtype other
    than the network's (float16 weights in a float32 network fail in its first layer, integer
    ones in loading), NaN or infinite values (unless not ``finite``: a run's own snapshot of a
    network that diverged is evaluated as it is). ``net`` may be on the meta device: only its
    names, shapes and dtypes are read."""
    if not isinstance(state, dict):
        return "weights that are not a table of tensors"
    want = net.state_dict()
    for name in sorted(set(want) ^ set(state), key=str):
        return f"{'no' if name in want else 'an unknown'} weight {str(name)[:80]!r}"
    for name, tensor in want.items():
        value = state[name]
        if not isinstance(value, torch.Tensor):
            return f"weight {name!r} is not a tensor"
        if value.shape != tensor.shape:
            return f"weight {name!r} has shape {list(value.shape)}, not {list(tensor.shape)}"
        form = tensor_problem(value)
        if form is not None:
            return f"weight {name!r} is {form}"
        if value.dtype != tensor.dtype:
            return f"weight {name!r} is {dtype_name(value.dtype)}, not {dtype_name(tensor.dtype)}"
        if finite and not bool(torch.isfinite(value).all()):
            return f"weight {name!r} holds NaN or infinite values"
    return None


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def network_bytes(net: nn.Module) -> int:
    """The bytes of ``net``'s weights (``net`` may be on the meta device)."""
    return sum(t.numel() * t.element_size() for t in net.state_dict().values())
