"""The ONNX Runtime backend: an exported ONNX file served by ONNX Runtime (TensorRT, CUDA or CPU
execution provider, chosen as :func:`edgerl.export.onnx.session_providers` says)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgerl.export.common import INPUT
from edgerl.export.onnx import import_ort, read_metadata, session_providers, trt_cache_dir


class OnnxPolicy:
    """A policy served by ONNX Runtime (TensorRT, CUDA or CPU execution provider)."""

    backend = "onnx"

    def __init__(self, path: Path, cpu_only: bool = False) -> None:
        ort = import_ort()
        self.path = path
        self.sidecar = s = read_metadata(path)
        self.spec = s.env_spec()
        self.env_config = s.env_config
        options = ort.SessionOptions()
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
        return self._run(obs)[1].astype(np.int64)
