"""Where load samples come from, in order of preference:

1. the real ``tegrastats --interval MS`` (every Jetson), read line by line;
2. jetson-stats' ``jtop`` when its service answers (e.g. in a container with ``/run/jtop.sock``
   mounted but no tegrastats);
3. procfs/sysfs (per-core load and clock from ``/proc/stat`` and cpufreq, memory, thermal zones,
   the Tegra GPU's ``load`` file) plus NVML for an NVIDIA desktop GPU (``nvidia-ml-py``).

Each source yields one :class:`~edgerl.hw.tegrastats.LoadRecord` per interval until it is
closed; :func:`open_source` picks the first that works here. The load monitor
(:mod:`edgerl.hw.monitor`) reads them on its own thread.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import shutil
import subprocess
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from edgerl.config import HwConfig
from edgerl.hw.platform import hw_path, hw_root
from edgerl.hw.tegrastats import LoadRecord, parse_line

log = logging.getLogger(__name__)

# Tegra GPU load files (per mille), newest layouts first.
GPU_LOAD_FILES = (
    "/sys/devices/platform/bus@0/17000000.gpu/load",
    "/sys/devices/platform/gpu.0/load",
    "/sys/devices/gpu.0/load",
    "/sys/devices/platform/17000000.ga10b/load",
)


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
