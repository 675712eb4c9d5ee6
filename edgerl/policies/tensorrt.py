"""The TensorRT backend: a policy served by a TensorRT engine that ``edgerl export --trt`` built on
this device. tensorrt and torch are imported when an engine is opened.

Execution uses the name-based tensor API (``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``), present from TensorRT 8.5 on. Device buffers are torch CUDA tensors,
allocated once for the largest batch, so no pycuda or cuda-python is needed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.errors import EdgerlError
from edgerl.export.common import INPUT, OUTPUTS, ExportError, Sidecar, check_batch
from edgerl.export.tensorrt import TrtLogger, flavor, import_tensorrt
from edgerl.files.regular import read_regular


class TensorRTPolicy:
    """A policy served by a TensorRT engine; device buffers allocated once, one CUDA stream."""

    backend = "trt"

    def __init__(self, path: Path) -> None:
        import torch

        trt = import_tensorrt()
        self.sidecar = s = Sidecar.read(path)
        self.spec = s.env_spec()
        self.env_config = s.env_config
        flavor(trt.__version__)
        self._logger = TrtLogger.make(trt)
        runtime = trt.Runtime(self._logger)
        try:
            data = read_regular(path)
        except OSError as e:
            raise ExportError(f"cannot read {path}: {e.strerror or e}") from None
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            raise ExportError(
                f"{path.name} does not load here: it was built for another GPU or TensorRT "
                f"{s.tensorrt_version} (this is {trt.__version__}); rebuild it on this device "
                "with edgerl export --trt"
            )
        self.engine = engine
        self.context = engine.create_execution_context()
        self.batch_max = s.batch_max
        dev = torch.device("cuda")
        in_dtype = getattr(torch, s.obs_dtype)
        self.d_obs = torch.empty((self.batch_max, *s.obs_shape), dtype=in_dtype, device=dev)
        self.h_obs = torch.empty_like(self.d_obs, device="cpu").pin_memory()
        self.d_q = torch.empty(
            (self.batch_max, len(s.action_meanings)), dtype=torch.float32, device=dev
        )
        out_dtype = self._dtype_of(trt, OUTPUTS[1])
        self.d_action = torch.empty((self.batch_max,), dtype=out_dtype, device=dev)
        self.stream = torch.cuda.Stream()
        self._torch = torch

    def _dtype_of(self, trt: Any, name: str) -> Any:
        torch_dtype = {trt.int32: "int32", trt.float32: "float32"}
        with contextlib.suppress(AttributeError):
            torch_dtype[trt.int64] = "int64"
        kind = torch_dtype.get(self.engine.get_tensor_dtype(name), "int32")
        import torch

        return getattr(torch, kind)

    def _run(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        n = len(obs)
        check_batch(n, self.batch_max)
        self.h_obs[:n].copy_(torch.from_numpy(np.ascontiguousarray(obs)))
        with torch.cuda.stream(self.stream):
            self.d_obs[:n].copy_(self.h_obs[:n], non_blocking=True)
            self.context.set_input_shape(INPUT, (n, *self.sidecar.obs_shape))
            self.context.set_tensor_address(INPUT, self.d_obs.data_ptr())
            self.context.set_tensor_address(OUTPUTS[0], self.d_q.data_ptr())
            self.context.set_tensor_address(OUTPUTS[1], self.d_action.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise EdgerlError("TensorRT failed to run the engine")
            q = self.d_q[:n].to("cpu", non_blocking=True)
            action = self.d_action[:n].to("cpu", non_blocking=True)
        self.stream.synchronize()
        return q.numpy(), action.numpy()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self._run(obs)[0]

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self._run(obs)[1].astype(np.int64)
