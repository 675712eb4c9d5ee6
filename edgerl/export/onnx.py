"""ONNX export of the greedy policy, and how ONNX Runtime opens it (providers, engine cache).

The graph takes the uint8 observation batch exactly as the environment returns it (the scaling is
inside) and returns ``q_values`` (float32) and ``action`` (int32, the argmax; int32 because
TensorRT 8.x has no int64 outputs). The batch dimension is dynamic. Opset 17 is the newest that
TensorRT 8.5 (JetPack 5) parses; TensorRT 8.6 and 10 (JetPack 6 and 7) read it too.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgerl.errors import MissingDependencyError
from edgerl.export.common import INPUT, OUTPUTS, ExportError, Sidecar
from edgerl.learn.nets import build_q_network

log = logging.getLogger(__name__)

OPSET = 17
METADATA_KEY = "edgerl"


class GreedyPolicy(nn.Module):
    """Q-network plus argmax: the whole policy in one graph."""

    def __init__(self, q_net: nn.Module) -> None:
        super().__init__()
        self.q = q_net

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_values = self.q(obs).float()
        return q_values, q_values.argmax(dim=1).to(torch.int32)


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError("onnx", "export", "edgerl export") from None
    return onnx


def export_onnx(policy: Any, out: Path, sidecar: Sidecar, fp16: bool = False) -> Path:
    """Write the greedy policy of a TorchPolicy to ``out`` (atomically); returns ``out``.

    ``fp16`` makes an FP16-typed graph (weights and arithmetic), which TensorRT 11's strongly typed
    builder needs for FP16 engines. Raises ExportError if the exporter or the checker fails.
    """
    onnx = _import_onnx()
    spec = policy.spec
    net = build_q_network(spec, tuple(policy.hidden), policy.layer_norm)
    net.load_state_dict(policy.state_dict_cpu())
    if fp16:
        net = net.half()
        net.input_dtype = torch.float16
    module = GreedyPolicy(net).eval()
    dummy = torch.zeros((1, *spec.obs_shape), dtype=getattr(torch, spec.obs_dtype))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
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


def require_onnx() -> None:
    """Raise MissingDependencyError now when onnx or ONNX Runtime is missing: an export says so
    before it plays the game for observations or builds anything."""
    _import_onnx()
    import_ort()


def import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise MissingDependencyError("onnxruntime", "export", "ONNX policies") from None
    return onnxruntime


def providers(available: list[str], cuda: bool = True) -> list[str]:
    """ONNX Runtime providers to use, best first: TensorRT, CUDA, then the CPU."""
    order = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    if not cuda:
        order = order[2:]
    return [p for p in order if p in available] or ["CPUExecutionProvider"]


def trt_cache_dir(model: Path) -> Path:
    """Where ONNX Runtime's TensorRT provider keeps the engine it builds for ``model``."""
    return model.resolve().parent / f"{model.stem}.trt-cache"


def session_providers(
    model: Path, available: list[str], ort_version: str, cuda: bool = True
) -> list[Any]:
    """The providers to open ``model`` with, best first; the TensorRT provider with its caches.

    Without its engine cache the TensorRT provider rebuilds the engine at every session start,
    which takes minutes on a Jetson; the timing cache makes a rebuild (new model, new TensorRT)
    faster. ``trt_timing_cache_path`` is only known to ONNX Runtime 1.17 and newer, which reject
    options they do not know; older ones keep the timing cache in the engine cache directory.
    """
    names = providers(available, cuda)
    if "TensorrtExecutionProvider" not in names:
        return names
    if not os.access(model.resolve().parent, os.W_OK):
        log.warning(
            "%s is in a directory this user cannot write: ONNX Runtime's TensorRT provider "
            "will rebuild its engine at every start; copy the model somewhere writable",
            model,
        )
        return names
    cache = str(trt_cache_dir(model))
    options: dict[str, Any] = {
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": cache,
        "trt_timing_cache_enable": True,
    }
    if _release(ort_version) >= (1, 17):
        options["trt_timing_cache_path"] = cache
    return [(n, options) if n == "TensorrtExecutionProvider" else n for n in names]


def _release(version: str) -> tuple[int, ...]:
    """``1.17.3`` -> (1, 17); anything unreadable -> (0,)."""
    parts = version.split(".")[:2]
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (0,)


def read_metadata(path: Path) -> Sidecar:
    """The policy description embedded in an ONNX file (else its sidecar file)."""
    onnx = _import_onnx()
    try:
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist") from None
    except Exception as e:
        raise ExportError(f"{path} is not a readable ONNX file: {e}") from None
    if not model.graph.node:  # an empty or truncated file parses as an empty model
        raise ExportError(
            f"{path} holds no ONNX graph ({path.stat().st_size:,} bytes): it is empty or damaged; "
            "export it again with edgerl export"
        )
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            try:
                described = json.loads(prop.value)
            except (ValueError, RecursionError):
                raise ExportError(f"{path} holds a damaged policy description") from None
            return Sidecar.from_dict(described, str(path))
    return Sidecar.read(path)
