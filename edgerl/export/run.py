"""The export command: a checkpoint to a checked ONNX file and, optionally, a TensorRT engine.

:func:`run_export` resolves the checkpoint, writes the ONNX file, checks it in ONNX Runtime against
PyTorch on real game observations, optionally builds and checks a TensorRT engine, and returns a
summary row per file.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.export.common import (
    Agreement,
    check_agreement,
    collect_observations,
    compare,
    latency_us,
    outputs_of,
)
from edgerl.files.atomic import fsync_dir, temp_path, write_atomic
from edgerl.files.checkpoint import file_sha256
from edgerl.files.private import ensure_own_dir
from edgerl.policies.sidecar import ExportError, Sidecar, sidecar_path

log = logging.getLogger(__name__)


@dataclass
class ExportRow:
    """One line of the summary table."""

    file: Path
    backend: str
    precision: str
    agreement: Agreement
    latency: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return self.file.stat().st_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": str(self.file),
            "backend": self.backend,
            "precision": self.precision,
            "size_bytes": self.size_bytes,
            "agreement": self.agreement.to_dict(),
            "latency_us": self.latency,
            **self.extra,
        }


def render_table(rows: list[ExportRow], measured_under: str = "") -> str:
    """The summary of an export as a text table (``measured_under``: the threads and load the
    latencies were measured with)."""
    from rich.console import Console
    from rich.table import Table

    under = f" ({measured_under})" if measured_under else ""
    table = Table(title=f"edgerl export: batch-1 action latency on this machine{under}")
    for col in (
        "file",
        "size",
        "backend",
        "precision",
        "agreement with PyTorch",
        "p50 us",
        "p99 us",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r.file.name,
            f"{r.size_bytes / 2**20:.1f} MiB",
            r.backend,
            r.precision,
            r.agreement.describe(),
            f"{r.latency['p50']:.0f}",
            f"{r.latency['p99']:.0f}",
        )
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


@dataclass
class ExportRequest:
    checkpoint: Path
    out: Path | None = None  # a file (.onnx/.engine) or a directory
    onnx: bool = True
    trt: bool = False
    fp16: bool = True
    int8: bool = False
    batch: int = 8
    workspace_mb: int = 1024
    observations: int = 96
    threads: int = 0  # CPU threads of ONNX Runtime's session (0: its own choice)
    # Filled in as it goes, for what a Ctrl-C leaves: the files that have their names, checked,
    # and those written under their names before their check (TensorRT's engine, its FP16 ONNX).
    written: list[Path] = field(default_factory=list)
    unchecked: list[Path] = field(default_factory=list)


def _out_dir(req: ExportRequest) -> Path:
    if req.out is not None and req.out.suffix in (".onnx", ".engine", ".plan"):
        return req.out.parent
    if req.out is not None:
        return req.out
    # <run_dir>/checkpoints/ckpt-... -> <run_dir>/export: the run's own folder, never a link
    out = req.checkpoint.resolve().parent.parent / "export"
    try:
        return ensure_own_dir(out)
    except OSError as e:
        raise ExportError(
            f"cannot write the export into {out}: {e.strerror or e}; give another folder with -o"
        ) from None


@contextlib.contextmanager
def staged(path: Path) -> Iterator[tuple[Path, Path]]:
    """Temporary names for ``path`` and its sidecar, in the same directory: the files are
    written and checked there, and :func:`publish` renames them; on any other way out (a failed
    check, Ctrl-C) they are removed, so no unverified file ever has the name."""
    files = (temp_path(path), temp_path(sidecar_path(path)))
    try:
        yield files
    finally:
        for f in files:
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


def publish(files: tuple[Path, Path], path: Path, sidecar: Sidecar) -> None:
    """Give checked files their names: ``sidecar`` written beside, then both renamed."""
    policy_tmp, sidecar_tmp = files
    write_atomic(sidecar_tmp, sidecar.to_json().encode())
    os.replace(policy_tmp, path)
    os.replace(sidecar_tmp, sidecar_path(path))
    fsync_dir(path.parent)


def check_tools(trt: bool) -> None:
    """Say at once, before any work, when onnx or ONNX Runtime is missing, and with ``trt``
    when TensorRT or a GPU is; raises MissingDependencyError or ExportError."""
    from edgerl.export.onnx import require_onnx

    require_onnx()
    if trt:
        from edgerl.policies.tensorrt import flavor, import_tensorrt

        flavor(import_tensorrt().__version__)


def run_export(req: ExportRequest) -> list[ExportRow]:
    """Export (and verify) a checkpoint; raises ExportError/EdgerlError with a sentence.

    The ONNX file and its sidecar get their names only once ONNX Runtime agreed with PyTorch on
    them: an export that fails its check or is interrupted leaves nothing under those names."""
    from edgerl.envs import greedy_actions, short_env_name
    from edgerl.export.onnx import export_onnx
    from edgerl.policies.onnx import OnnxPolicy
    from edgerl.policies.torch import TorchPolicy

    check_tools(req.trt)
    torch_policy = TorchPolicy.from_file(req.checkpoint)
    spec = torch_policy.spec
    env_short = short_env_name(spec.id)
    out_dir = _out_dir(req)
    base = Sidecar.of(
        spec,
        env_config=dict(torch_policy.env_config),
        source_checkpoint=str(req.checkpoint.resolve()),
        source_sha256=file_sha256(req.checkpoint),
        step=torch_policy.step,
        batch_max=req.batch,
    )
    log.info("collecting %d observations from %s for the checks", req.observations, spec.id)
    obs = collect_observations(torch_policy.env_config, req.observations)
    reference = torch_policy.q_values(obs).astype(np.float64)
    rows: list[ExportRow] = []

    onnx_path = (
        req.out
        if req.out is not None and req.out.suffix == ".onnx"
        else out_dir / f"policy-{env_short}-step{torch_policy.step}.onnx"
    )
    with staged(onnx_path) as files:
        export_onnx(torch_policy, files[0], base)
        ort_policy = OnnxPolicy(files[0], cpu_only=True, threads=req.threads)
        agreement = check_agreement(ort_policy, obs, reference, outputs=outputs_of(torch_policy))
        if not agreement.ok:
            raise ExportError(
                f"ONNX Runtime disagrees with PyTorch on {onnx_path.name}: {agreement.describe()}"
            )
        ort_latency = latency_us(ort_policy.act, obs)
        base.agreement, base.latency_us = agreement.to_dict(), ort_latency
        publish(files, onnx_path, base)
    req.written.append(onnx_path)
    rows.append(
        ExportRow(
            onnx_path, f"onnxruntime ({ort_policy.providers[0]})", "fp32", agreement, ort_latency
        )
    )

    if req.trt:
        rows.append(
            _export_trt(req, base, onnx_path, out_dir, env_short, obs, reference, torch_policy)
        )
    torch_latency = latency_us(torch_policy.act, obs)
    rows.append(
        ExportRow(
            req.checkpoint,
            "torch (eager, CPU)",
            "fp32",
            compare(
                reference,
                reference,
                greedy_actions(spec, reference),
                continuous=spec.continuous,
                outputs=outputs_of(torch_policy),
            ),
            torch_latency,
        )
    )
    return rows


def _export_trt(
    req: ExportRequest,
    base: Sidecar,
    onnx_path: Path,
    out_dir: Path,
    env_short: str,
    obs: np.ndarray,
    reference: np.ndarray,
    torch_policy: Any,
) -> ExportRow:
    import dataclasses

    from edgerl.export.onnx import export_onnx
    from edgerl.export.tensorrt import Calibration, build_engine
    from edgerl.policies.tensorrt import TensorRTPolicy, flavor, import_tensorrt

    trt = import_tensorrt()
    fl = flavor(trt.__version__)
    precision = "int8" if req.int8 else ("fp16" if req.fp16 else "fp32")
    onnx_fp16 = None
    if precision == "fp16" and fl.strongly_typed:
        onnx_fp16 = export_onnx(
            torch_policy,
            onnx_path.with_name(onnx_path.stem + "-fp16.onnx"),
            dataclasses.replace(base, precision="fp16"),
            fp16=True,
        )
        req.unchecked.append(onnx_fp16)
    calibration = None  # INT8 only: game frames to calibrate on (seconds of emulation)
    if precision == "int8":
        frames = collect_observations(torch_policy.env_config, max(256, req.batch * 32), seed=1)
        calibration = Calibration(frames, base.source_sha256)
    result = build_engine(
        onnx_path,
        out_dir,
        env_short,
        tuple(base.obs_shape),
        precision,
        req.batch,
        req.workspace_mb,
        calibration,
        onnx_fp16,
    )
    req.unchecked.append(result.engine)
    if req.out is not None and req.out.suffix in (".engine", ".plan"):
        result.engine.replace(req.out)
        result.engine = req.unchecked[-1] = req.out
    import torch

    sidecar = dataclasses.replace(
        base,
        backend="trt",
        precision=result.precision,
        tensorrt_version=trt.__version__,
        gpu=torch.cuda.get_device_name(0),
    )
    write_atomic(sidecar_path(result.engine), sidecar.to_json().encode())
    engine_policy = TensorRTPolicy(result.engine)
    agreement = check_agreement(
        engine_policy, obs, reference, result.precision, outputs_of(torch_policy)
    )
    latency = latency_us(engine_policy.act, obs)
    sidecar.agreement, sidecar.latency_us = agreement.to_dict(), latency
    write_atomic(sidecar_path(result.engine), sidecar.to_json().encode())
    if not agreement.ok:
        raise ExportError(
            f"the TensorRT engine {result.engine.name} disagrees with PyTorch: "
            f"{agreement.describe()}"
        )
    req.unchecked.remove(result.engine)
    req.written.append(result.engine)
    return ExportRow(
        result.engine,
        f"tensorrt {trt.__version__}",
        result.precision,
        agreement,
        latency,
        {"build_s": round(result.build_s, 1)},
    )
