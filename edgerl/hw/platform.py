"""What machine this is: a Jetson (which board, which L4T) or not, CPUs, GPU."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

L4T_RELEASE = re.compile(r"^# R(?P<major>\d+) \(release\), REVISION: (?P<revision>[\d.]+)")
CPU_RANGE = re.compile(r"(?P<first>\d+)(?:-(?P<last>\d+))?")


def hw_root() -> Path:
    """Where hardware files are read: ``EDGERL_HW_ROOT`` or ``/``."""
    return Path(os.environ.get("EDGERL_HW_ROOT") or "/")


def hw_path(path: str, root: Path | None = None) -> Path:
    """``path`` (absolute, e.g. ``/proc/stat``) below the hardware root."""
    return (root or hw_root()) / path.lstrip("/")


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86's AMX and AVX-512 ones, Arm's


def cpu_bf16_flags(root: Path | None = None) -> tuple[str, ...]:
    """The flags of /proc/cpuinfo (x86's ``flags``, Arm's ``Features``) that say the CPU does
    bf16 arithmetic in hardware, of :data:`CPU_BF16_FLAGS`; () where none or unreadable."""
    text = _read(hw_path("/proc/cpuinfo", root)) or ""
    found: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            found.update(value.split())
    return tuple(flag for flag in CPU_BF16_FLAGS if flag in found)


def parse_l4t_release(text: str) -> str | None:
    """``# R36 (release), REVISION: 4.4, ...`` -> ``36.4.4``; None if it does not look like one."""
    m = L4T_RELEASE.match(text.strip())
    return f"{m['major']}.{m['revision']}" if m else None


def count_cpus(text: str) -> int:
    """CPUs in a kernel CPU list such as ``0-5`` or ``0-3,6``."""
    total = 0
    for m in CPU_RANGE.finditer(text):
        first = int(m["first"])
        last = int(m["last"]) if m["last"] else first
        total += last - first + 1
    return total


@dataclass(frozen=True)
class Platform:
    is_jetson: bool
    model: str | None  # /proc/device-tree/model, e.g. "NVIDIA Jetson AGX Orin Developer Kit"
    l4t: str | None  # e.g. "36.4.4"
    cpu_count: int
    gpu: str  # "integrated Tegra GPU (GR3D)", an NVML device name, or "none"
    memory_gb: float | None = None  # MemTotal of /proc/meminfo (a Jetson's GPU shares it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        if self.is_jetson:
            l4t = f", L4T {self.l4t}" if self.l4t else ""
            return f"{self.model or 'Jetson'}{l4t}, {self.cpu_count} CPUs, {self.gpu}"
        return f"not a Jetson ({self.cpu_count} CPUs, GPU: {self.gpu})"


def nvml_gpu_name() -> str | None:
    """The first NVIDIA GPU's name through NVML, or None (no pynvml, no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml raises NVMLError subclasses for every "no driver/GPU" case
        return None
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def detect(root: Path | None = None) -> Platform:
    """Detect the platform from files below ``root`` (default: the hardware root)."""
    root = root or hw_root()
    model_raw = _read(hw_path("/proc/device-tree/model", root))
    model = model_raw.strip("\x00\n ") if model_raw else None
    release = _read(hw_path("/etc/nv_tegra_release", root))
    l4t = parse_l4t_release(release) if release else None
    compatible = _read(hw_path("/proc/device-tree/compatible", root)) or ""
    is_jetson = (
        l4t is not None
        or "nvidia,tegra" in compatible
        or (model is not None and "jetson" in model.lower())
    )
    present = _read(hw_path("/sys/devices/system/cpu/present", root))
    cpus = count_cpus(present) if present else (os.cpu_count() or 1)
    gpu = "integrated Tegra GPU (GR3D)" if is_jetson else (nvml_gpu_name() or "none")
    return Platform(is_jetson, model, l4t, cpus, gpu, mem_total_gb(root))


def mem_total_gb(root: Path | None = None) -> float | None:
    """The machine's memory in GiB (``MemTotal`` of /proc/meminfo), or None where unreadable."""
    text = _read(hw_path("/proc/meminfo", root)) or ""
    m = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    return int(m[1]) / 2**20 if m else None
