"""tegrastats lines <-> load records, for every Jetson generation (pure functions, no I/O).

One :class:`LoadRecord` is what the monitor knows at one instant, whatever its source (tegrastats,
jtop, procfs + NVML). Its fields are a documented contract (docs/hardware.md, "Monitoring"):

    time          "2026-05-09T18:42:06" when the line carries a date, else None
    ram_used_mb, ram_total_mb, swap_used_mb, swap_total_mb
    cpu           per-core load %, None for an offline core
    cpu_mhz       per-core clock, None where offline or unknown
    emc, emc_mhz  memory controller load % and clock
    gr3d, gr3d_mhz  GPU load % (None where the line has none, as on Thor), clock (the fastest GPC)
    temps         sensor name -> degrees C (sensors reading -256C, i.e. absent, are dropped)
    power_mw      rail name -> current mW

Forms handled (see tests/fixtures/tegrastats): the old ``cpu [a%,b%]@f`` / ``EMC x%@f`` / ``GR3D
x%@f`` (TX1, L4T 28.1); ``CPU [a%@f,off,...]`` with ``EMC_FREQ``/``GR3D_FREQ x%@f`` (TX1 28.2, TX2,
Nano, Xavier); ``GR3D_FREQ x%@[f]`` and ``x%@[f,f]`` (Xavier JP5, Orin JP6); ``GR3D_FREQ @[f,f,f]``
(Thor, no load); an optional leading ``MM-DD-YYYY HH:MM:SS`` date; rails as ``cur/avg`` (mW
implied) or ``curmW/avgmW[/maxmW]``; temperatures as ``name@tC`` or ``name@tC/maxC``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

DATE_PREFIX = re.compile(r"^\s*(?P<date>\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s+")
RAM_USED_TOTAL = re.compile(r"\bRAM (?P<used>\d+)/(?P<total>\d+)MB")
SWAP_USED_TOTAL = re.compile(r"\bSWAP (?P<used>\d+)/(?P<total>\d+)MB")
# "CPU [24%@1224,off]" (per-core clocks) or "cpu [17%,13%]@408" (one clock for all cores)
CPU_CORES = re.compile(r"\b(?:CPU|cpu) \[(?P<cores>[^\]]*)\](?:@(?P<mhz>\d+))?")
CORE_LOAD_AT_CLOCK = re.compile(r"^(?P<load>\d+)%(?:@(?P<mhz>\d+))?$")
# "EMC_FREQ 7%@408", "EMC_FREQ 0%", "EMC_FREQ @4266", old "EMC 1%@408"
EMC_LOAD_AT_CLOCK = re.compile(r"\bEMC(?:_FREQ)? +(?:(?P<load>\d+)%)?(?:@(?P<mhz>\d+))?(?=\s|$)")
# "GR3D_FREQ 0%@76", "0%@[305,305]", "@[0,0,0]", "1%", old "GR3D 3%@76"
GR3D_LOAD_AT_CLOCKS = re.compile(
    r"\bGR3D(?:_FREQ)? +(?:(?P<load>\d+)%)?(?:@(?:\[(?P<gpcs>[^\]]*)\]|(?P<mhz>\d+)))?(?=\s|$)"
)
# "tj@52.562C", "CPU@25C", "cpu@58.25C/61.75C" (now/max), "CV0@-256C" (no sensor)
TEMPERATURE = re.compile(
    r"\b(?P<name>[A-Za-z][A-Za-z0-9_]*)@(?P<deg>-?\d+(?:\.\d+)?)C(?:/-?[\d.]+C)?"
)
# "VDD_IN 2532/2698", "VDD_IN 5299mW/5299mW", "VDD_GPU 37939mW/8660mW/37939mW", "GPU 0/0"
POWER_RAIL = re.compile(
    r"\b(?P<rail>[A-Z][A-Z0-9_]*) (?P<cur>\d+)(?:mW)?/(?P<avg>\d+)(?:mW)?(?:/\d+(?:mW)?)?(?=\s|$)"
)
ABSENT_SENSOR_C = -256.0
# Rails that measure the whole module's input (Thor, most boards, Nano); others are summed.
INPUT_RAILS = ("VIN", "VDD_IN", "POM_5V_IN")
TEGRASTATS_DATE = "%m-%d-%Y %H:%M:%S"


@dataclass
class LoadRecord:
    """CPU, GPU, memory, temperature and power at one instant; see the module docstring."""

    time: str | None = None
    ram_used_mb: int | None = None
    ram_total_mb: int | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    cpu: list[float | None] = field(default_factory=list)
    cpu_mhz: list[int | None] = field(default_factory=list)
    emc: float | None = None
    emc_mhz: int | None = None
    gr3d: float | None = None
    gr3d_mhz: int | None = None
    temps: dict[str, float] = field(default_factory=dict)
    power_mw: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def cpu_mean(self) -> float | None:
        """Mean load over online cores."""
        online = [c for c in self.cpu if c is not None]
        return sum(online) / len(online) if online else None

    @property
    def cpu_max_core(self) -> float | None:
        """Load of the busiest core: the figure that shows a single-threaded bottleneck."""
        online = [c for c in self.cpu if c is not None]
        return max(online) if online else None

    @property
    def temp_max(self) -> float | None:
        return max(self.temps.values()) if self.temps else None

    @property
    def power_total_mw(self) -> int | None:
        """The board's input rail if tegrastats reports one, else the sum of the rails."""
        for rail in INPUT_RAILS:
            if rail in self.power_mw:
                return self.power_mw[rail]
        return sum(self.power_mw.values()) if self.power_mw else None

    def load_line(self) -> str:
        """The short summary shown in progress lines: ``CPU 97% max-core | GR3D 31%``."""
        cpu = self.cpu_max_core
        parts = [f"CPU {cpu:.0f}% max-core" if cpu is not None else "CPU n/a"]
        if self.gr3d is not None:
            parts.append(f"GR3D {self.gr3d:.0f}%")
        elif self.gr3d_mhz is not None:
            parts.append(f"GR3D @{self.gr3d_mhz}MHz")
        return " | ".join(parts)


def _int(s: str | None) -> int | None:
    return int(s) if s is not None else None


def _cores(text: str, shared_mhz: str | None) -> tuple[list[float | None], list[int | None]]:
    loads: list[float | None] = []
    clocks: list[int | None] = []
    for token in (t.strip() for t in text.split(",")):
        m = CORE_LOAD_AT_CLOCK.match(token)
        if m is None:  # "off", or anything unreadable: the core reports nothing
            loads.append(None)
            clocks.append(None)
            continue
        loads.append(float(m["load"]))
        clocks.append(_int(m["mhz"] or shared_mhz))
    return loads, clocks


def parse_line(line: str) -> LoadRecord | None:
    """Parse one tegrastats line; None if it carries none of RAM, CPU or GR3D (not tegrastats)."""
    rec = LoadRecord()
    found = False
    if m := DATE_PREFIX.match(line):
        rec.time = datetime.strptime(m["date"], TEGRASTATS_DATE).isoformat()
    if m := RAM_USED_TOTAL.search(line):
        rec.ram_used_mb, rec.ram_total_mb = int(m["used"]), int(m["total"])
        found = True
    if m := SWAP_USED_TOTAL.search(line):
        rec.swap_used_mb, rec.swap_total_mb = int(m["used"]), int(m["total"])
    if m := CPU_CORES.search(line):
        rec.cpu, rec.cpu_mhz = _cores(m["cores"], m["mhz"])
        found = True
    if m := EMC_LOAD_AT_CLOCK.search(line):
        rec.emc = float(m["load"]) if m["load"] is not None else None
        rec.emc_mhz = _int(m["mhz"])
    if m := GR3D_LOAD_AT_CLOCKS.search(line):
        rec.gr3d = float(m["load"]) if m["load"] is not None else None
        if m["gpcs"] is not None:
            gpcs = [int(g) for g in m["gpcs"].split(",") if g.strip().isdigit()]
            rec.gr3d_mhz = max(gpcs) if gpcs else None
        else:
            rec.gr3d_mhz = _int(m["mhz"])
        found = True
    for m in TEMPERATURE.finditer(line):
        deg = float(m["deg"])
        if deg > ABSENT_SENSOR_C:
            rec.temps[m["name"]] = deg
    for m in POWER_RAIL.finditer(line):
        rec.power_mw[m["rail"]] = int(m["cur"])
    return rec if found else None


def _pct(v: float) -> str:
    return f"{v:.0f}%"


def format_line(rec: LoadRecord) -> str:
    """A tegrastats-style line (JetPack 6 form) for a record; :func:`parse_line` reads it back."""
    parts: list[str] = []
    if rec.time:
        parts.append(datetime.fromisoformat(rec.time).strftime(TEGRASTATS_DATE))
    if rec.ram_used_mb is not None and rec.ram_total_mb is not None:
        parts.append(f"RAM {rec.ram_used_mb}/{rec.ram_total_mb}MB")
    if rec.swap_used_mb is not None and rec.swap_total_mb is not None:
        parts.append(f"SWAP {rec.swap_used_mb}/{rec.swap_total_mb}MB")
    if rec.cpu:
        cores = []
        for load, mhz in zip(rec.cpu, rec.cpu_mhz or [None] * len(rec.cpu), strict=False):
            if load is None:
                cores.append("off")
            else:
                cores.append(_pct(load) + (f"@{mhz}" if mhz is not None else ""))
        parts.append(f"CPU [{','.join(cores)}]")
    if rec.emc is not None or rec.emc_mhz is not None:
        load = _pct(rec.emc) if rec.emc is not None else ""
        parts.append(f"EMC_FREQ {load}" + (f"@{rec.emc_mhz}" if rec.emc_mhz is not None else ""))
    if rec.gr3d is not None or rec.gr3d_mhz is not None:
        load = _pct(rec.gr3d) if rec.gr3d is not None else ""
        parts.append(
            f"GR3D_FREQ {load}" + (f"@[{rec.gr3d_mhz}]" if rec.gr3d_mhz is not None else "")
        )
    parts += [f"{name}@{deg:g}C" for name, deg in rec.temps.items()]
    parts += [f"{rail} {mw}mW/{mw}mW" for rail, mw in rec.power_mw.items()]
    return " ".join(parts)


CSV_FIELDS = [
    "time",
    "ram_used_mb",
    "ram_total_mb",
    "swap_used_mb",
    "swap_total_mb",
    "cpu",
    "cpu_mhz",
    "emc",
    "emc_mhz",
    "gr3d",
    "gr3d_mhz",
    "temps",
    "power_mw",
]
