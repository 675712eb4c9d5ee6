"""ONNX export of the greedy policy (ONNX Runtime opens it as :mod:`edgerl.policies.onnx` says).

The graph takes the uint8 observation batch exactly as the environment returns it (the scaling is
inside) and returns ``q_values`` (float32) and ``action`` (int32, the argmax; int32 because
TensorRT 8.x has no int64 outputs; for a continuous game, the network's output is the action:
both are its float32 numbers). The batch dimension is dynamic. Opset 17 is the newest that
TensorRT 8.5 (JetPack 5) parses; TensorRT 8.6 and 10 (JetPack 6 and 7) read it too.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgerl.files.atomic import claim_temp, temp_path
from edgerl.learners.nets import network_bytes
from edgerl.memories.budget import available_memory
from edgerl.policies.onnx import METADATA_KEY, import_onnx, import_ort
from edgerl.policies.sidecar import INPUT, OUTPUTS, ExportError, Sidecar

log = logging.getLogger(__name__)

OPSET = 17
EXPORT_COPIES = 3  # of the weights, beside the policy's own (see check_export_memory)


class GreedyPolicy(nn.Module):
    """Q-network plus argmax: the whole policy in one graph. For a ``continuous`` game the
    network outputs the action itself: both outputs are its float32 numbers."""

    def __init__(self, q_net: nn.Module, continuous: bool = False) -> None:
        super().__init__()
        self.q = q_net
        self.continuous = continuous

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_values = self.q(obs).float()
        if self.continuous:
            return q_values, q_values.clone()
        return q_values, q_values.argmax(dim=1).to(torch.int32)


def export_onnx(policy: Any, out: Path, sidecar: Sidecar, fp16: bool = False) -> Path:
    """Write the greedy policy of a TorchPolicy to ``out`` (atomically); returns ``out``.

    ``fp16`` makes an FP16-typed graph (weights and arithmetic), which TensorRT 11's strongly typed
    builder needs for FP16 engines. Raises ExportError if the exporter or the checker fails.
    """
    onnx = import_onnx()
    spec = policy.spec
    if fp16 and spec.continuous:
        raise ExportError(
            f"an FP16 graph is for a policy of discrete actions for now, and {spec.id}'s are "
            "numbers (its network normalises and squashes in fp32): export it in fp32"
        )
    check_export_memory(policy, out)
    net = policy.fresh_network()
    net.load_state_dict(policy.state_dict_cpu())
    if fp16:
        net = net.half()
        net.input_dtype = torch.float16
    module = GreedyPolicy(net, spec.continuous).eval()
    dummy = torch.zeros((1, *spec.obs_shape), dtype=getattr(torch, spec.obs_dtype))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(out)
    axes = {INPUT: {0: "batch"}, OUTPUTS[0]: {0: "batch"}, OUTPUTS[1]: {0: "batch"}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            options: dict[str, Any] = {
                "input_names": [INPUT],
                "output_names": list(OUTPUTS),
                "dynamic_axes": axes,
                "opset_version": OPSET,
            }
            if "dynamo" in inspect.signature(torch.onnx.export).parameters:
                options["dynamo"] = False  # TorchScript exporter: opset 17, read by TensorRT 8.5
            claim_temp(out)
            torch.onnx.export(module, (dummy,), str(tmp), **options)
            sidecar.onnx_opset = OPSET
        model = onnx.load(str(tmp))
        onnx.checker.check_model(model)
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, sidecar.to_json()
        onnx.save(model, str(tmp))
        os.replace(tmp, out)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"ONNX export to {out} failed: {type(e).__name__}: {e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return out


def check_export_memory(policy: Any, out: Path) -> None:
    """Raises ExportError when exporting the network of a TorchPolicy's settings would not fit
    in the memory free here, before any of it is built: the export holds its weights
    :data:`EXPORT_COPIES` more times (the network it traces, the traced graph's constants, the
    ONNX model checked and saved)."""
    with torch.device("meta"):
        weights = network_bytes(policy.fresh_network())
    free, _ = available_memory(torch.device("cpu"))
    if EXPORT_COPIES * weights > free:
        raise ExportError(
            f"exporting {out.name} needs {EXPORT_COPIES} more copies of the policy's "
            f"{weights / 2**30:,.1f} GiB of weights, more than the {free / 2**30:,.1f} GiB of "
            "memory free here; free memory or export it elsewhere"
        )


def require_onnx() -> None:
    """Raise MissingDependencyError now when onnx or ONNX Runtime is missing: an export says so
    before it plays the game for observations or builds anything."""
    import_onnx()
    import_ort()
