"""The load monitor: a sampling thread that shows what limits training.

It reads the best load source this machine has (tegrastats, jtop, or procfs+NVML: see
:mod:`edgerl.hw.load_sources`); every sample is a :class:`~edgerl.hw.tegrastats.LoadRecord`.
While training, the monitor writes ``<run_dir>/tegrastats.log`` (tegrastats-style lines with a
date) and ``<run_dir>/load.csv``, puts ``CPU 97% max-core | GR3D 31%`` on the progress line, and
at the end gives a verdict of what limited training. It costs the trainer one thread waking once
per interval.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from edgerl.config import HwConfig
from edgerl.files.sidefiles import AppendFile, SideFiles, csv_line
from edgerl.hw.energy import EnergyMeter, energy_from_load_csv
from edgerl.hw.load_sources import LoadSource, ProcfsSource, open_source
from edgerl.hw.tegrastats import LoadRecord, format_line
from edgerl.words import plural

log = logging.getLogger(__name__)

LOAD_CSV_COLUMNS = [
    "time",
    "step",
    "cpu_mean",
    "cpu_max_core",
    "gr3d",
    "gr3d_mhz",
    "emc",
    "ram_used_mb",
    "temp_max_c",
    "power_mw",
]
BUSY = 85.0  # a resource this busy on average is what limits training
IDLE_CPU = 50.0  # below this mean over all cores, a hot core is one thread's limit


@dataclass(frozen=True)
class Verdict:
    """What limited training, from the mean load over the run."""

    kind: str  # "cpu-bound", "gpu-bound", "balanced" or "unknown"
    samples: int
    cpu_max_core: float | None
    cpu_mean: float | None
    gr3d: float | None

    def sentence(self) -> str:
        if self.kind == "unknown":
            return f"too few load samples ({self.samples}) to say what limited training"
        cpu = f"busiest CPU core {self.cpu_max_core:.0f}% (all cores {self.cpu_mean:.0f}%)"
        gpu = f"GR3D {self.gr3d:.0f}%" if self.gr3d is not None else "no GPU load reported"
        figures = f"{cpu}, {gpu}, over {plural(self.samples, 'sample')}"
        if self.kind == "cpu-bound" and self.gr3d is None:
            return f"CPU-bound: {figures}; training runs on the CPU alone"
        if self.kind == "cpu-bound" and self.cpu_mean is not None and self.cpu_mean < IDLE_CPU:
            return (
                f"CPU-bound on one core: {figures}; one thread (the Python loop, or a single "
                "emulator thread) is the limit while the other cores idle and the GPU waits for it"
            )
        if self.kind == "cpu-bound":
            return (
                f"CPU-bound (emulator or Python loop): {figures}; the GPU waits for the CPU, "
                "so more environments or a faster CPU help, a faster GPU does not"
            )
        if self.kind == "gpu-bound":
            return f"GPU-bound: {figures}; the CPU waits for the GPU"
        return f"balanced: {figures}; neither side is saturated alone"


def judge(
    samples: int, cpu_max_core: float | None, cpu_mean: float | None, gr3d: float | None
) -> Verdict:
    """The verdict for mean loads: CPU-bound, GPU-bound or balanced (pure, for tests)."""
    if samples < 2 or cpu_max_core is None:
        return Verdict("unknown", samples, cpu_max_core, cpu_mean, gr3d)
    cpu_hot = cpu_max_core >= BUSY
    # A GPU busy 58% of the time with small kernels is not saturated: a hot core with a GPU that
    # is not is CPU-bound (seen on an H100, where one Python core at 94% set the pace).
    if cpu_hot and (gr3d is None or gr3d < BUSY):
        kind = "cpu-bound"
    elif gr3d is not None and gr3d >= BUSY and not cpu_hot:
        kind = "gpu-bound"
    else:
        kind = "balanced"
    return Verdict(kind, samples, cpu_max_core, cpu_mean, gr3d)


class LoadMonitor:
    """The sampling thread, a context manager (a training run follows it through
    :class:`edgerl.service.session.LoadHook`).

    ``run_dir`` None: sample only (``edgerl hw status``); else write tegrastats.log and load.csv.
    """

    def __init__(
        self,
        hw: HwConfig,
        run_dir: Path | None = None,
        step: Callable[[], int] | None = None,
        source_factory: Callable[[HwConfig, int], LoadSource] = open_source,
        side: SideFiles | None = None,
    ) -> None:
        self.hw = hw
        self.side = side or SideFiles()
        self.interval_ms = hw.monitor_interval_ms
        self.run_dir = run_dir
        self.step = step or (lambda: 0)
        self.source_factory = source_factory
        self.latest: LoadRecord | None = None
        self.source_name = "none"
        self._source: LoadSource | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._reopen = threading.Event()  # the interval changed: restart the same kind of source
        self._log: AppendFile | None = None
        self._csv: AppendFile | None = None
        self._sums = {"n": 0, "max": 0.0, "mean": 0.0, "gpu": 0.0, "gpu_n": 0}
        self._count_from = 0.0  # monotonic time from which samples count for the verdict
        self.energy = EnergyMeter()  # this session's samples (edgerl.hw.energy)
        self.energy_before_j = 0.0  # the run's earlier sessions, from its load.csv

    def __enter__(self) -> LoadMonitor:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._source = self.source_factory(self.hw, self.interval_ms)
        self.source_name = self._source.name
        if self.run_dir is not None:
            self.energy_before_j = energy_from_load_csv(self.run_dir / "load.csv")[0]
            # Neither file may stop training: rows wait while they cannot be written.
            self._log = AppendFile(self.run_dir / "tegrastats.log", self.side)
            self._csv = AppendFile(
                self.run_dir / "load.csv", self.side, header=csv_line(LOAD_CSV_COLUMNS)
            )
            self._log.flush()
            self._csv.flush()
        self._thread = threading.Thread(target=self._loop, name="edgerl-monitor", daemon=True)
        self._thread.start()
        log.info("load monitor: %s every %d ms", self.source_name, self.interval_ms)

    def _loop(self) -> None:
        assert self._source is not None
        while not self._stopping.is_set():
            try:
                rec = self._source.read()
            except Exception:
                log.exception("load monitor source %s failed", self.source_name)
                rec = None
            if rec is None and self._reopen.is_set():
                self._reopen.clear()
                self._source = self.source_factory(self.hw, self.interval_ms)
                self.source_name = self._source.name
                continue
            if rec is None:
                if not self._stopping.is_set() and self.source_name != "procfs":
                    log.warning("load source %s ended; falling back to procfs", self.source_name)
                    with contextlib.suppress(Exception):
                        self._source.close()
                    self._source = ProcfsSource(self.interval_ms)
                    self.source_name = "procfs"
                    continue
                return
            self._record(rec)

    def _record(self, rec: LoadRecord) -> None:
        dated = rec.time is not None
        if not dated:
            rec.time = datetime.now().isoformat(timespec="seconds")
        self.latest = rec
        self.energy.add(time.monotonic(), rec.power_total_mw)
        if time.monotonic() >= self._count_from and rec.cpu_max_core is not None:
            s = self._sums
            s["n"] += 1
            s["max"] += rec.cpu_max_core
            s["mean"] += rec.cpu_mean or 0.0
            if rec.gr3d is not None:
                s["gpu"] += rec.gr3d
                s["gpu_n"] += 1
        if self._log is not None:
            raw = getattr(self._source, "last_raw", None)
            if raw and self.source_name == "tegrastats":
                line = raw if dated else f"{_date()} {raw}"
            else:
                line = format_line(rec)
            self._log.append(line + "\n")
        if self._csv is not None:
            row = csv_line(
                [
                    _cell(v)
                    for v in (
                        rec.time,
                        self.step(),
                        rec.cpu_mean,
                        rec.cpu_max_core,
                        rec.gr3d,
                        rec.gr3d_mhz,
                        rec.emc,
                        rec.ram_used_mb,
                        rec.temp_max,
                        rec.power_total_mw,
                    )
                ]
            )
            self._csv.append(row)

    def set_interval(self, interval_ms: int) -> None:
        """Sample every ``interval_ms`` from now on (the service's SIGHUP reload)."""
        self.interval_ms = interval_ms
        self._reopen.set()
        if self._source is not None:
            self._source.close()  # read() returns None at once; the loop reopens it

    def count_from_now(self) -> None:
        """Only samples from now on count for the verdict (skips set-up time)."""
        self._count_from = time.monotonic()
        self._sums = {"n": 0, "max": 0.0, "mean": 0.0, "gpu": 0.0, "gpu_n": 0}

    def verdict(self) -> Verdict:
        s = self._sums
        n = s["n"]
        if n == 0:
            return judge(0, None, None, None)
        gpu = s["gpu"] / s["gpu_n"] if s["gpu_n"] else None
        return judge(int(n), s["max"] / n, s["mean"] / n, gpu)

    def stop(self) -> None:
        self._stopping.set()
        if self._source is not None:
            with contextlib.suppress(Exception):
                self._source.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for f in (self._log, self._csv):
            if f is not None:
                f.close()

    def latest_fields(self) -> dict[str, Any] | None:
        """The newest sample as a metrics row and the log line use it, or None before the
        first: its tegrastats-style line, the busiest core, GR3D and the whole record."""
        rec = self.latest
        if rec is None:
            return None
        measured = self.energy.samples > 0 or self.energy_before_j > 0
        return {
            "load_line": rec.load_line(),
            "cpu_max_core": rec.cpu_max_core,
            "gr3d": rec.gr3d,
            "record": rec.to_dict(),
            # the run's energy so far, where a source reports power (None: nothing measured)
            "energy_j": self.energy_before_j + self.energy.joules if measured else None,
        }


def _date() -> str:
    return datetime.now().strftime("%m-%d-%Y %H:%M:%S")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
