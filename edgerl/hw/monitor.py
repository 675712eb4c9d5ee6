"""The load monitor: a sampling thread that shows what limits training.

Sources, in order of preference:

1. the real ``tegrastats --interval MS`` (every Jetson), read line by line;
2. jetson-stats' ``jtop`` when its service answers (e.g. in a container with ``/run/jtop.sock``
   mounted but no tegrastats);
3. procfs/sysfs (per-core load and clock from ``/proc/stat`` and cpufreq, memory, thermal zones,
   the Tegra GPU's ``load`` file) plus NVML for an NVIDIA desktop GPU (``nvidia-ml-py``).

Every sample becomes a :class:`~edgerl.hw.tegrastats.LoadRecord`. While training, the monitor writes
``<run_dir>/tegrastats.log`` (tegrastats-style lines with a date) and ``<run_dir>/load.csv``, puts
``CPU 97% max-core | GR3D 31%`` on the progress line, and at the end gives a verdict of what limited
training. It costs the trainer one thread waking once per interval.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from edgerl.config import Config, HwConfig
from edgerl.hooks import Hook, Run
from edgerl.hw.platform import hw_path, hw_root
from edgerl.hw.tegrastats import LoadRecord, format_line, parse_line
from edgerl.metrics import TrainStats
from edgerl.sidefiles import AppendFile, SideFiles

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
# Tegra GPU load files (per mille), newest layouts first.
GPU_LOAD_FILES = (
    "/sys/devices/platform/bus@0/17000000.gpu/load",
    "/sys/devices/platform/gpu.0/load",
    "/sys/devices/gpu.0/load",
    "/sys/devices/platform/17000000.ga10b/load",
)
BUSY = 85.0  # a resource this busy on average is what limits training
IDLE_CPU = 50.0  # below this mean over all cores, a hot core is one thread's limit


class LoadSource(Protocol):
    name: str

    def read(self) -> LoadRecord | None:
        """The next sample (blocks up to one interval); None when the source has ended."""
        ...

    def close(self) -> None: ...


class TegrastatsSource:
    """``tegrastats --interval MS``, one parsed line per sample; keeps the raw line for the log."""

    name = "tegrastats"

    def __init__(self, tool: str, interval_ms: int) -> None:
        self.proc = subprocess.Popen(
            [tool, "--interval", str(interval_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.last_raw: str | None = None

    def read(self) -> LoadRecord | None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = parse_line(line)
            if rec is not None:
                self.last_raw = line.strip()
                return rec
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def record_from_jtop(
    cpu: dict[str, Any],
    memory: dict[str, Any],
    gpu: dict[str, Any],
    temperature: dict[str, Any],
    power: dict[str, Any],
) -> LoadRecord:
    """Map jtop's properties (jetson-stats 4.x units: kB, kHz, %, mW) to a LoadRecord."""
    rec = LoadRecord(time=datetime.now().isoformat(timespec="seconds"))
    for core in cpu.get("cpu", []):
        if core.get("online"):
            rec.cpu.append(round(100.0 - float(core.get("idle", 100.0)), 1))
            cur = core.get("freq", {}).get("cur")
            rec.cpu_mhz.append(int(cur) // 1000 if cur else None)
        else:
            rec.cpu.append(None)
            rec.cpu_mhz.append(None)
    ram, swap = memory.get("RAM", {}), memory.get("SWAP", {})
    if ram:
        rec.ram_used_mb, rec.ram_total_mb = ram["used"] // 1024, ram["tot"] // 1024
    if swap:
        rec.swap_used_mb, rec.swap_total_mb = swap["used"] // 1024, swap["tot"] // 1024
    if "EMC" in memory:
        rec.emc = float(memory["EMC"].get("val", 0))
        cur = memory["EMC"].get("cur")
        rec.emc_mhz = int(cur) // 1000 if cur else None
    if gpu:
        first = next(iter(gpu.values()))
        rec.gr3d = float(first.get("status", {}).get("load", 0.0))
        cur = first.get("freq", {}).get("cur")
        rec.gr3d_mhz = int(cur) // 1000 if cur else None
    for name, t in temperature.items():
        if t.get("online", True) and t.get("temp") is not None and t["temp"] > -256:
            rec.temps[name] = float(t["temp"])
    for name, rail in power.get("rail", {}).items():
        rec.power_mw[name] = int(rail.get("power", 0))
    return rec


class JtopSource:
    """jetson-stats' jtop client; raises at construction when its service does not answer."""

    name = "jtop"

    def __init__(self, interval_ms: int) -> None:
        from jtop import jtop  # jetson-stats, an optional extra

        self._jetson = jtop(interval=interval_ms / 1000)
        self._jetson.start()

    def read(self) -> LoadRecord | None:
        if not self._jetson.ok():
            return None
        j = self._jetson
        return record_from_jtop(j.cpu, j.memory, j.gpu, j.temperature, j.power or {})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._jetson.close()


class ProcfsSource:
    """Load from procfs/sysfs below the hardware root, plus NVML for a desktop NVIDIA GPU."""

    name = "procfs"

    def __init__(self, interval_ms: int, root: Path | None = None, use_nvml: bool = True) -> None:
        self.interval_s = interval_ms / 1000
        self.root = root or hw_root()
        self._stop = threading.Event()
        self._prev = self._cpu_times()
        self._nvml = _Nvml() if use_nvml else None

    def _read(self, path: str) -> str | None:
        try:
            return hw_path(path, self.root).read_text()
        except OSError:
            return None

    def _cpu_times(self) -> dict[int, tuple[int, int]]:
        """core -> (busy, total) jiffies for online cores."""
        times = {}
        for line in (self._read("/proc/stat") or "").splitlines():
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                v = [int(x) for x in fields[:8]]
                idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
                times[int(name[3:])] = (sum(v) - idle, sum(v))
        return times

    def _present(self, seen: dict[int, Any]) -> int:
        from edgerl.hw.platform import count_cpus

        text = self._read("/sys/devices/system/cpu/present")
        n = count_cpus(text) if text else 0
        return max(n, max(seen, default=-1) + 1)

    def sample(self) -> LoadRecord:
        """A record for the time since the previous sample (or since construction)."""
        now = self._cpu_times()
        rec = LoadRecord(time=datetime.now().isoformat(timespec="seconds"))
        for core in range(self._present(now)):
            if core not in now:
                rec.cpu.append(None)
                rec.cpu_mhz.append(None)
                continue
            busy, total = now[core]
            pbusy, ptotal = self._prev.get(core, (0, 0))
            dt = total - ptotal
            rec.cpu.append(round(100.0 * (busy - pbusy) / dt, 1) if dt > 0 else 0.0)
            khz = self._read(f"/sys/devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq")
            rec.cpu_mhz.append(int(khz) // 1000 if khz and khz.strip().isdigit() else None)
        self._prev = now
        self._memory(rec)
        self._thermal(rec)
        self._tegra_gpu(rec)
        if self._nvml is not None and rec.gr3d is None:
            self._nvml.fill(rec)
        return rec

    def _memory(self, rec: LoadRecord) -> None:
        info = {}
        for line in (self._read("/proc/meminfo") or "").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                info[key] = int(parts[0])  # kB
        if "MemTotal" in info and "MemAvailable" in info:
            rec.ram_total_mb = info["MemTotal"] // 1024
            rec.ram_used_mb = (info["MemTotal"] - info["MemAvailable"]) // 1024
        if "SwapTotal" in info and "SwapFree" in info:
            rec.swap_total_mb = info["SwapTotal"] // 1024
            rec.swap_used_mb = (info["SwapTotal"] - info["SwapFree"]) // 1024

    def _thermal(self, rec: LoadRecord) -> None:
        pattern = str(hw_path("/sys/class/thermal/thermal_zone*", self.root))
        for zone in sorted(glob.glob(pattern)):
            try:
                name = Path(zone, "type").read_text().strip()
                milli = int(Path(zone, "temp").read_text().strip())
            except (OSError, ValueError):
                continue
            if milli > -256_000:
                rec.temps[name] = milli / 1000.0

    def _tegra_gpu(self, rec: LoadRecord) -> None:
        for path in GPU_LOAD_FILES:
            text = self._read(path)
            if text and text.strip().isdigit():
                rec.gr3d = int(text) / 10.0  # per mille
                break
        pattern = str(hw_path("/sys/class/devfreq/*gpu*/cur_freq", self.root))
        for f in sorted(glob.glob(pattern)):
            with contextlib.suppress(OSError, ValueError):
                rec.gr3d_mhz = int(Path(f).read_text()) // 1_000_000
                break

    def read(self) -> LoadRecord | None:
        if self._stop.wait(self.interval_s):
            return None
        return self.sample()

    def close(self) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._nvml.close()


class _Nvml:
    """GPU load, clock, power and temperature of the first NVIDIA GPU via nvidia-ml-py."""

    def __init__(self) -> None:
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no pynvml, no driver, no GPU: NVML simply adds nothing
            self.handle = None

    def fill(self, rec: LoadRecord) -> None:
        if self.handle is None:
            return
        nv = self.pynvml
        with contextlib.suppress(Exception):
            rec.gr3d = float(nv.nvmlDeviceGetUtilizationRates(self.handle).gpu)
            rec.gr3d_mhz = int(nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_GRAPHICS))
            rec.temps["GPU"] = float(
                nv.nvmlDeviceGetTemperature(self.handle, nv.NVML_TEMPERATURE_GPU)
            )
            rec.power_mw["GPU"] = int(nv.nvmlDeviceGetPowerUsage(self.handle))

    def close(self) -> None:
        if self.handle is not None:
            with contextlib.suppress(Exception):
                self.pynvml.nvmlShutdown()


def open_source(hw: HwConfig, interval_ms: int) -> LoadSource:
    """The best source available here: tegrastats, then jtop, then procfs (+NVML)."""
    tool = shutil.which(hw.tegrastats)
    if tool is not None:
        try:
            return TegrastatsSource(tool, interval_ms)
        except OSError as e:
            log.warning("cannot start %s (%s); trying the next load source", tool, e)
    with contextlib.suppress(ImportError):
        try:
            return JtopSource(interval_ms)
        except Exception as e:  # jtop raises JtopException when its service is not running
            log.debug("jtop is installed but its service did not answer: %s", e)
    return ProcfsSource(interval_ms)


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
        figures = f"{cpu}, {gpu}, over {self.samples} samples"
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


class LoadMonitor(Hook):
    """The sampling thread; a context manager and a trainer hook.

    ``run_dir`` None: sample only (``edgerl hw status``); else write tegrastats.log and load.csv.
    """

    csv_columns = ("cpu_max_core", "gr3d")  # added to metrics.csv

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
            # Neither file may stop training: rows wait while they cannot be written.
            self._log = AppendFile(self.run_dir / "tegrastats.log", self.side)
            self._csv = AppendFile(
                self.run_dir / "load.csv", self.side, header=_csv_line(LOAD_CSV_COLUMNS)
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
            row = _csv_line(
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

    # -- trainer hook ------------------------------------------------------------------------

    def on_start(self, run: Run) -> None:
        self.count_from_now()

    def on_tick(self, run: Run, stats: TrainStats) -> None:
        rec = self.latest
        if rec is not None:
            stats.load = {
                "load_line": rec.load_line(),
                "cpu_max_core": rec.cpu_max_core,
                "gr3d": rec.gr3d,
                "record": rec.to_dict(),
            }

    def on_reconfigure(self, run: Run, cfg: Config) -> None:
        if cfg.hw.monitor_interval_ms != self.interval_ms:
            self.set_interval(cfg.hw.monitor_interval_ms)


def _date() -> str:
    return datetime.now().strftime("%m-%d-%Y %H:%M:%S")


def _csv_line(cells: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(cells)
    return buf.getvalue()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
