"""TensorRT engines from the ONNX policy (their backend is :mod:`edgerl.policies.tensorrt`).

Engines are specific to the GPU and TensorRT version that built them, so they are built on the
device that runs them. The builder branches on the TensorRT version where the API changed:

* 8.5-8.6 (JetPack 5, JetPack 6.0): explicit-batch flag, memory-pool limits, precision flags,
  INT8 entropy calibration;
* 10.x (JetPack 6.1+, JetPack 7): explicit batch is implied; the same flags and calibrator;
* 11+: networks are strongly typed: FP16 comes from an FP16-typed ONNX graph, and INT8 needs
  explicit Q/DQ quantization, which edgerl does not do.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.export.common import slug
from edgerl.files.atomic import write_atomic
from edgerl.hw.device import fast_fp16
from edgerl.policies.sidecar import INPUT, ExportError
from edgerl.policies.tensorrt import Flavor, TrtLogger, flavor, import_tensorrt

log = logging.getLogger(__name__)


def engine_name(env_short: str, precision: str, batch: int, fl: Flavor, gpu: str) -> str:
    """``policy-Pong-v5-fp16-b8-trt10.3.0-jetson-agx-orin.engine``: what it is for, by name."""
    return f"policy-{env_short}-{precision}-b{batch}-{fl.tag}-{slug(gpu)}.engine"


def _calibrator(trt: Any, frames: np.ndarray, batch: int, cache: ScalesCache) -> Any:
    """INT8 entropy calibration on real game frames (implicit quantization, TensorRT < 11)."""
    import torch

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.index = 0
            self.device = torch.empty((batch, *frames.shape[1:]), dtype=torch.uint8, device="cuda")

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.index + batch > len(frames):
                return None
            self.device.copy_(torch.from_numpy(frames[self.index : self.index + batch]))
            self.index += batch
            return [int(self.device.data_ptr())]

        def read_calibration_cache(self) -> bytes | None:
            return cache.read()  # None: TensorRT calibrates on the frames, then writes

        def write_calibration_cache(self, data: Any) -> None:
            cache.write(bytes(data))

    return Calibrator()


@dataclass(frozen=True)
class Calibration:
    """What INT8 calibration needs: game frames, and the checkpoint whose weights they scale."""

    frames: np.ndarray
    source_sha256: str


def calibration_cache_path(out_dir: Path, env_short: str, source_sha256: str) -> Path:
    """Where the INT8 scales of one checkpoint are cached.

    Scales belong to one set of weights: keyed by the checkpoint's SHA-256, a newer checkpoint of
    the same game never silently reuses an older one's.
    """
    return out_dir / f"{env_short}-{source_sha256[:16]}.int8-calibration.cache"


class ScalesCache:
    """One checkpoint's INT8 scales on disk (:func:`calibration_cache_path`), checked on reading.

    TensorRT trusts whatever the calibrator hands back, and a cache cut short or edited would
    quantize the network wrongly without a word. So the file starts with a line holding the
    SHA-256 of the scales that follow; a file whose line or digest does not match is named in a
    warning and calibration runs again (its result then replaces the damaged file).
    """

    MAGIC = b"edgerl-int8-scales sha256="

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> bytes | None:
        """The cached scales, or None when there are none (or they are damaged: said once)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("INT8 scales cache %s cannot be read (%s): calibrating again", self.path, e)
            return None
        head, _, data = raw.partition(b"\n")
        digest = head.removeprefix(self.MAGIC)
        if head == digest or digest.decode("ascii", "replace") != hashlib.sha256(data).hexdigest():
            log.warning(
                "INT8 scales cache %s is damaged (its checksum does not match): calibrating "
                "again, and the new scales replace it",
                self.path,
            )
            return None
        log.info("INT8 scales from %s (calibration skipped)", self.path)
        return data

    def write(self, data: bytes) -> None:
        """Keep ``data`` (TensorRT's calibration table) with its checksum, atomically."""
        write_atomic(
            self.path, self.MAGIC + hashlib.sha256(data).hexdigest().encode() + b"\n" + data
        )


Shapes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def profile_shapes(obs_shape: tuple[int, ...], batch: int) -> tuple[Shapes, Shapes]:
    """(min, opt, max) input shapes of the engine's profile and of the calibration profile.

    The engine accepts 1..``batch`` and is tuned for 1 (play acts on one observation at a time).
    TensorRT calibrates at the profile's ``opt`` shape, so calibrating with that profile would
    use 1 frame of every ``batch`` the calibrator hands over; the calibration profile is fixed
    at the calibration batch instead.
    """
    one, full = (1, *obs_shape), (batch, *obs_shape)
    return (one, one, full), (full, full, full)


@dataclass
class BuildResult:
    engine: Path
    precision: str
    build_s: float
    timing_cache: Path


def build_engine(
    onnx_path: Path,
    out_dir: Path,
    env_short: str,
    obs_shape: tuple[int, ...],
    precision: str,
    batch: int,
    workspace_mb: int,
    calibration: Calibration | None,
    onnx_fp16: Path | None = None,
) -> BuildResult:
    """Build and save an engine for ``onnx_path``; raises ExportError on any failure.

    ``precision`` is "fp32", "fp16" or "int8" (which needs ``calibration``). On TensorRT 11+,
    FP16 builds from ``onnx_fp16`` (an FP16-typed graph). The timing cache next to the engine
    makes rebuilds fast.
    """
    import torch

    trt = import_tensorrt()
    fl = flavor(trt.__version__)
    gpu = torch.cuda.get_device_name(0)
    capability = torch.cuda.get_device_capability(0)
    if precision == "fp16" and not fast_fp16(capability):
        log.warning("%s (compute %d.%d) has no fast FP16; building FP32", gpu, *capability)
        precision = "fp32"
    if precision == "int8" and not fl.int8_calibration:
        raise ExportError(
            f"TensorRT {fl.version} builds INT8 only from explicitly quantized (Q/DQ) graphs, "
            "which edgerl does not make; use --fp16"
        )
    source = onnx_fp16 if (precision == "fp16" and fl.strongly_typed) else onnx_path
    if source is None:
        raise ExportError("an FP16-typed ONNX graph is needed for FP16 on TensorRT 11+")

    logger = TrtLogger.make(trt)
    builder = trt.Builder(logger)
    flags = 0
    if fl.explicit_batch_flag:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if fl.strongly_typed:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(source.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"TensorRT cannot parse {source.name}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    if fl.precision_flags and precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)  # INT8 layers fall back to FP16, not FP32
    run_shapes, calibration_shapes = profile_shapes(obs_shape, batch)
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT, *run_shapes)
    config.add_optimization_profile(profile)
    if precision == "int8":
        if calibration is None or len(calibration.frames) < batch:
            raise ExportError("INT8 needs calibration frames from the game")
        scales = ScalesCache(calibration_cache_path(out_dir, env_short, calibration.source_sha256))
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = _calibrator(trt, calibration.frames, batch, scales)
        calibration_profile = builder.create_optimization_profile()
        calibration_profile.set_shape(INPUT, *calibration_shapes)
        config.set_calibration_profile(calibration_profile)

    cache_path = out_dir / f"timing-{fl.tag}-{slug(gpu)}.cache"
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)

    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(
            f"TensorRT could not build an engine from {source.name} (run with --debug for its log)"
        )
    build_s = time.monotonic() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    engine = out_dir / engine_name(env_short, precision, batch, fl, gpu)
    write_atomic(engine, bytes(serialized))
    write_atomic(cache_path, bytes(config.get_timing_cache().serialize()))
    return BuildResult(engine, precision, build_s, cache_path)
