"""The TensorRT backend: a policy served by a TensorRT engine that ``edgerl export --trt`` built on
this device. tensorrt and torch are imported when an engine is opened.

Execution uses the name-based tensor API (``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``), present from TensorRT 8.5 on. Device buffers are torch CUDA tensors,
allocated once for the largest batch, so no pycuda or cuda-python is needed.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.errors import EdgerlError
from edgerl.files.regular import read_regular
from edgerl.policies.sidecar import INPUT, OUTPUTS, ExportError, Sidecar, check_batch

log = logging.getLogger(__name__)

ONNX_HINT = "engines must be built on the device that runs them, and --onnx works anywhere"


@dataclass(frozen=True)
class Flavor:
    """What one TensorRT version's Python API looks like, for the parts edgerl uses."""

    version: str
    major: int
    explicit_batch_flag: bool  # 8.x needs NetworkDefinitionCreationFlag.EXPLICIT_BATCH
    precision_flags: bool  # BuilderFlag.FP16 / INT8 exist (removed in 11)
    int8_calibration: bool  # IInt8EntropyCalibrator2 with implicit quantization
    strongly_typed: bool  # precision comes from the graph's types

    @property
    def tag(self) -> str:
        return "trt" + ".".join(self.version.split(".")[:3])


def flavor(version: str) -> Flavor:
    """The API flavor of a TensorRT version string; raises ExportError if older than 8.5."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if not m:
        raise ExportError(f"cannot read the TensorRT version {version!r}")
    major, minor = int(m[1]), int(m[2])
    if (major, minor) < (8, 5):
        raise ExportError(
            f"TensorRT {version} is older than 8.5 (JetPack 5): upgrade JetPack to export engines"
        )
    return Flavor(
        version,
        major,
        explicit_batch_flag=major < 10,
        precision_flags=major < 11,
        int8_calibration=major < 11,
        strongly_typed=major >= 11,
    )


def import_tensorrt() -> Any:
    """TensorRT and a usable CUDA device, or ExportError saying which is missing (the GPU
    first: on a machine without one, installing TensorRT would not help)."""
    import torch

    if not torch.cuda.is_available():
        raise ExportError(
            "TensorRT engines are built and run on a CUDA GPU, and none is usable here; "
            + ONNX_HINT
        )
    try:
        import tensorrt
    except ImportError:
        raise ExportError(
            "--trt needs TensorRT, which is not installed (JetPack ships it on a Jetson; on a "
            f"desktop GPU: pip install tensorrt); {ONNX_HINT}"
        ) from None
    return tensorrt


class TrtLogger:
    """A TensorRT logger that forwards to ``logging`` (built lazily: needs the module)."""

    @staticmethod
    def make(trt: Any) -> Any:
        class Forward(trt.ILogger):
            def __init__(self) -> None:
                trt.ILogger.__init__(self)

            def log(self, severity: Any, msg: str) -> None:
                level = logging.DEBUG
                if severity in (trt.ILogger.ERROR, trt.ILogger.INTERNAL_ERROR):
                    level = logging.ERROR
                elif severity == trt.ILogger.WARNING:
                    level = logging.DEBUG  # TensorRT warns about int64 casts etc. on every build
                log.log(level, "TensorRT: %s", msg)

        return Forward()


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
        shape = (self.batch_max, *s.action_shape)  # an id, or a continuous action's numbers
        built = tuple(engine.get_tensor_shape(OUTPUTS[1]))[1:]  # without the batch
        if built != tuple(s.action_shape):
            raise ExportError(
                f"{path.name} outputs actions of shape {list(built)} and its description says "
                f"{list(s.action_shape)}: the two do not belong together; export it again"
            )
        self.d_action = torch.empty(shape, dtype=out_dtype, device=dev)
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
        return self._run(obs)[1].astype(self.spec.action_dtype)
