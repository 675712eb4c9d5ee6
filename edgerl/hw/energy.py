"""Energy from power samples: what training took, in joules, where the machine reports power.

A board on a battery or a solar budget asks how many watt-hours learning a game takes. Power
comes from the load monitor's samples (``power_mw``: tegrastats' input rail ``VDD_IN`` or the
sum of its rails on a Jetson, the GPU's board power from NVML on a desktop); nothing is
estimated where no source reports power. Energy is the integral of power over time, each
sample's power held until the next (a gap longer than :data:`MAX_GAP_S` is not filled in: the
monitor was not running, and nothing is claimed for it).

``<run_dir>/load.csv`` keeps every sample with the env step it was taken at, so the energy up to
any step, that of an evaluation that reached a target included, is read back from it
(:func:`energy_from_load_csv`) by a tolerant reader: a damaged row is skipped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from edgerl.files.csvread import CsvReader

MAX_GAP_S = 10.0  # a longer gap between two samples is not filled in
J_PER_WH = 3600.0

log = logging.getLogger(__name__)


@dataclass
class EnergyMeter:
    """Joules so far from ``(seconds, milliwatts)`` samples, fed one at a time."""

    joules: float = 0.0
    samples: int = 0
    _last: tuple[float, float] | None = None

    def add(self, t_s: float, power_mw: float | None) -> None:
        """One sample: at time ``t_s`` (seconds, any origin) the power was ``power_mw``."""
        if power_mw is None or not math.isfinite(power_mw) or power_mw < 0:
            return
        if self._last is not None:
            t0, p0 = self._last
            dt = t_s - t0
            if 0 < dt <= MAX_GAP_S:
                self.joules += p0 / 1000.0 * dt
        self._last = (t_s, power_mw)
        self.samples += 1


def integrate(samples: Iterable[tuple[float, float | None]]) -> float:
    """Joules over ``(seconds, milliwatts)`` samples in time order."""
    meter = EnergyMeter()
    for t, p in samples:
        meter.add(t, p)
    return meter.joules


def energy_from_load_csv(path: Path, until_step: int | None = None) -> tuple[float, int]:
    """(joules, samples with power) in a run's ``load.csv`` up to the samples taken at env step
    ``until_step`` (all, by default); (0.0, 0) where it has no power or cannot be read. Damaged
    lines and rows whose cells are not a time and numbers are skipped; damage is logged once."""
    reader = CsvReader(path)
    meter = EnergyMeter()
    try:
        for cells in reader.rows():
            row = dict(zip(reader.header or [], cells, strict=False))
            try:
                t = datetime.fromisoformat(row.get("time") or "").timestamp()
                step = int(row.get("step") or 0)
                power = float(row["power_mw"]) if row.get("power_mw") else None
            except (ValueError, TypeError, KeyError, OverflowError, OSError):
                continue
            if until_step is not None and step > until_step:
                break
            meter.add(t, power)
    except OSError:
        return 0.0, 0
    if (damage := reader.damage()) is not None:
        log.warning("%s has %s: skipped in its energy count", path, damage)
    return meter.joules, meter.samples


def watt_hours(joules: float) -> float:
    return joules / J_PER_WH
