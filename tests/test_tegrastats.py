"""The tegrastats parser and formatter on real lines from every Jetson generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgerl.hw.tegrastats import LoadRecord, format_line, parse_line

LOGS = Path(__file__).parent / "fixtures" / "tegrastats"
ALL_LINES = [
    pytest.param(line, id=f"{p.stem}:{i}")
    for p in sorted(LOGS.glob("*.txt"))
    for i, line in enumerate(p.read_text().splitlines(), start=1)
    if line.strip()
]


def first(name: str, n: int = 0) -> LoadRecord:
    rec = parse_line((LOGS / name).read_text().splitlines()[n])
    assert rec is not None
    return rec


@pytest.mark.parametrize("line", ALL_LINES)
def test_every_captured_line_parses_and_round_trips(line):
    rec = parse_line(line)
    assert rec is not None
    assert rec.ram_total_mb and rec.ram_used_mb is not None
    assert rec.cpu and len(rec.cpu) == len(rec.cpu_mhz)
    again = parse_line(format_line(rec))
    assert again == rec


def test_tx1_old_form_one_clock_for_all_cores():
    rec = first("tx1_l4t28.1.txt", 1)
    assert rec.cpu == [17.0, 11.0, 65.0, 0.0]
    assert rec.cpu_mhz == [1734] * 4
    assert (rec.emc, rec.emc_mhz, rec.gr3d, rec.gr3d_mhz) == (1.0, 1600, 39.0, 76)
    assert rec.swap_used_mb == 873 and rec.time is None
    assert rec.cpu_max_core == 65.0


def test_tx1_28_2_rails_without_units():
    rec = first("tx1_l4t28.2.txt")
    assert rec.power_mw == {"VDD_IN": 2532, "VDD_CPU": 76, "VDD_GPU": 19}
    assert rec.power_total_mw == 2532
    assert rec.temps["PMIC"] == 100.0 and rec.temps["Tdiode"] == 42.75


def test_tx2_offline_cores_are_none():
    rec = first("tx2.txt")
    assert rec.cpu == [1.0, None, None, 1.0, 0.0, 2.0]
    assert rec.cpu_mhz == [345, None, None, 345, 345, 345]
    assert rec.cpu_mean == pytest.approx(1.0)
    assert rec.gr3d_mhz == 624 and rec.power_mw["VDD_SYS_DDR"] == 883


def test_nano_gr3d_without_clock():
    rec = first("nano.txt", 1)
    assert (rec.gr3d, rec.gr3d_mhz, rec.emc, rec.emc_mhz) == (0.0, None, 0.0, None)
    assert rec.power_mw == {"POM_5V_IN": 2545, "POM_5V_GPU": 0, "POM_5V_CPU": 549}


def test_xavier_jp4_short_rail_names_and_mts():
    rec = first("agx_xavier_jp4.txt")
    assert rec.power_mw == {"GPU": 0, "CPU": 311, "SOC": 932, "CV": 0, "VDDRQ": 621, "SYS5V": 1482}
    assert rec.cpu[4:] == [None] * 4 and rec.gr3d_mhz == 318


def test_xavier_nx_jp5_date_and_bracketed_clock():
    rec = first("xavier_nx.txt", 1)
    assert rec.time == "2024-07-09T13:31:31"
    assert (rec.gr3d, rec.gr3d_mhz) == (0.0, 114)
    assert rec.power_mw == {"VDD_IN": 2763, "VDD_CPU_GPU_CV": 650, "VDD_SOC": 650}


def test_orin_jp5_single_clock_and_jp6_two_gpcs():
    assert (first("orin_nx_jp5.txt").gr3d, first("orin_nx_jp5.txt").gr3d_mhz) == (0.0, 611)
    jp6 = first("agx_orin_jp6.txt")
    assert (jp6.gr3d, jp6.gr3d_mhz) == (0.0, 305)
    assert jp6.cpu[5] == 100.0 and jp6.cpu_max_core == 100.0
    assert jp6.power_mw["VIN_SYS_5V0"] == 4767
    assert jp6.power_total_mw == 3205 + 4405 + 4767  # no input rail: the sum


def test_absent_sensors_are_dropped():
    rec = first("agx_orin_jp6.txt", 3)
    assert "CV0" not in rec.temps and "GPU" not in rec.temps
    assert rec.temps["tj"] == 44.343


def test_orin_nano_line_without_emc():
    rec = first("orin_nano_jp6.txt", 1)
    assert rec.emc is None and rec.gr3d == 1.0 and rec.cpu[-2:] == [None, None]
    assert rec.power_mw["VDD_CPU_GPU_CV"] == 598  # written "598mW/598" by that tegrastats


def test_thor_reports_clocks_but_no_gpu_load():
    rec = first("thor_jp7_r38.txt")
    assert rec.gr3d is None and rec.gr3d_mhz == 0
    assert len(rec.cpu) == 14 and rec.emc_mhz == 665
    assert rec.load_line() == "CPU 3% max-core | GR3D @0MHz"


def test_thor_r39_three_value_rails_and_max_temperatures():
    loaded = first("thor_jp7_r39.txt")
    assert (loaded.gr3d, loaded.gr3d_mhz) == (87.0, 1574)
    assert loaded.power_mw["VDD_GPU"] == 37939 and loaded.power_total_mw == 124486
    assert loaded.temps["tj"] == 66.625
    assert loaded.cpu == [90.0, 75.0, None, 7.0]
    idle = first("thor_jp7_r39.txt", 1)
    assert idle.cpu == [0.0, 5.0, None] and idle.cpu_mhz == [2601, 2601, None]
    assert (idle.emc, idle.emc_mhz, idle.gr3d, idle.gr3d_mhz) == (None, 4266, None, 1574)
    assert idle.swap_total_mb is None


@pytest.mark.parametrize("text", ["", "hello", "Tegrastats started", "# comment RAM"])
def test_lines_that_are_not_tegrastats(text):
    assert parse_line(text) is None


def test_load_line_for_the_progress_bar():
    assert first("agx_orin_jp6.txt").load_line() == "CPU 100% max-core | GR3D 0%"
    assert LoadRecord(cpu=[None]).load_line() == "CPU n/a"
