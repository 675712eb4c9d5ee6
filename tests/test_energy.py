"""Energy from power samples (energy.py): the integral, gaps left out, load.csv read back to a
step, damaged rows skipped, and the monitor's joules so far from captured tegrastats lines."""

from __future__ import annotations

import pytest

from edgerl.hw.energy import EnergyMeter, energy_from_load_csv, integrate


def test_power_held_until_the_next_sample_is_integrated():
    # 10 W for 2 s, then 20 W for 1 s: 40 J; the last sample's power counts no time
    assert integrate([(0.0, 10_000), (2.0, 20_000), (3.0, 5_000)]) == pytest.approx(40.0)
    assert integrate([]) == 0.0 and integrate([(0.0, 10_000)]) == 0.0


def test_a_gap_or_a_sample_without_power_adds_nothing():
    meter = EnergyMeter()
    samples = [(0.0, 10_000), (1.0, 10_000), (100.0, 10_000), (101.0, None), (102.0, -5)]
    for t, p in [*samples, (103.0, 10_000)]:
        meter.add(t, p)
    # 0-1 s, then 100-103 s (the samples without power skipped); not the gap from 1 s to 100 s
    assert meter.joules == pytest.approx(10.0 + 30.0)
    assert meter.samples == 4


def test_a_runs_energy_to_a_step_is_read_back_from_its_load_csv(tmp_path):
    path = tmp_path / "load.csv"
    path.write_text(
        "time,step,cpu_mean,cpu_max_core,gr3d,gr3d_mhz,emc,ram_used_mb,temp_max_c,power_mw\n"
        "2026-11-26T17:00:00,0,50,90,10,1300,,900,40,5000\n"
        "2026-11-26T17:00:01,100,50,90,10,1300,,900,40,7000\n"
        "not a time,200,,,,,,,,9999999\n"  # damaged: skipped
        "2026-11-26T17:00:02,200,50,90,10,1300,,900,40,x\n"  # damaged: skipped
        "2026-11-26T17:00:03,300,50,90,10,1300,,900,40,7000\n"
        "2026-11-26T17:00:04,400,50,90,10,1300,,900,40,7000\n"
    )
    assert energy_from_load_csv(path, 100) == (pytest.approx(5.0), 2)  # 5 W for 1 s
    joules, samples = energy_from_load_csv(path)
    assert (joules, samples) == (pytest.approx(5.0 + 2 * 7.0 + 7.0), 4)
    assert energy_from_load_csv(tmp_path / "none.csv") == (0.0, 0)


def test_the_monitor_counts_joules_from_a_jetsons_input_rail(tmp_path):
    """Real Orin tegrastats lines at 100 ms: VDD_IN is the board's input, what energy counts."""
    import time

    from edgerl.config import HwConfig
    from edgerl.hw.monitor import LoadMonitor
    from edgerl.hw.tegrastats import parse_line

    line = (
        "11-26-2026 17:00:00 RAM 2448/30536MB (lfb 6x4MB) SWAP 0/15268MB (cached 0MB) "
        "CPU [12%@729,8%@729,5%@729,4%@729,off,off,off,off,off,off,off,off] "
        "EMC_FREQ 0%@2133 GR3D_FREQ 61%@[1300] VDD_IN 12000mW/12000mW "
        "VDD_CPU_GPU_CV 4000mW/4000mW VDD_SOC 2000mW/2000mW"
    )

    class Replay:
        name = "tegrastats"

        def __init__(self, *args):
            self.left = 6

        def read(self):
            if self.left == 0:
                return None
            self.left -= 1
            time.sleep(0.1)
            return parse_line(line)

        def close(self):
            self.left = 0

    monitor = LoadMonitor(HwConfig(monitor_interval_ms=100), tmp_path, source_factory=Replay)
    with monitor:
        deadline = time.monotonic() + 60
        while monitor.energy.samples < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    fields = monitor.latest_fields()
    assert fields is not None and monitor.energy.samples == 6
    # five intervals of about 0.1 s at 12 W (the input rail, not the sum of the rails)
    assert 12.0 * 0.4 < fields["energy_j"] < 12.0 * 5 * 1.0
