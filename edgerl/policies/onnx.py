"""The ONNX Runtime backend: an exported ONNX file served by ONNX Runtime, with the TensorRT, CUDA
or CPU execution provider (:func:`session_providers`), and the policy description the file holds.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.errors import MissingDependencyError
from edgerl.policies.sidecar import INPUT, ExportError, Sidecar

log = logging.getLogger(__name__)

METADATA_KEY = "edgerl"


def import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise MissingDependencyError("onnx", "export", "edgerl export") from None
    return onnx


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
    onnx = import_onnx()
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


class OnnxPolicy:
    """A policy served by ONNX Runtime (TensorRT, CUDA or CPU execution provider)."""

    backend = "onnx"

    def __init__(self, path: Path, cpu_only: bool = False, threads: int = 0) -> None:
        """``threads``: ONNX Runtime's CPU threads within an operator (0: its own choice, one
        per core, which a busy machine makes slow as it does PyTorch's)."""
        ort = import_ort()
        self.path = path
        self.sidecar = s = read_metadata(path)
        self.spec = s.env_spec()
        self.env_config = s.env_config
        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        chosen = session_providers(
            path, ort.get_available_providers(), ort.__version__, cuda=not cpu_only
        )
        if any(isinstance(p, tuple) for p in chosen):
            trt_cache_dir(path).mkdir(parents=True, exist_ok=True)
        self.session = ort.InferenceSession(str(path), options, providers=chosen)
        self.providers = self.session.get_providers()
        self._dtype = np.dtype(s.obs_dtype)

    def _run(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q, action = self.session.run(None, {INPUT: np.ascontiguousarray(obs, dtype=self._dtype)})
        return q, action

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self._run(obs)[0]

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self._run(obs)[1].astype(self.spec.action_dtype)
