"""The hw package: platform detection, clocks (store -> max -> restore), the load sources and the
load monitor, and `edgerl hw` (the tegrastats parser has test_tegrastats.py)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from edgerl.config import HwConfig
from edgerl.errors import HardwareError
from edgerl.hw.clocks import (
    MaxClocks,
    ToolError,
    default_state_dir,
    parse_nvpmodel_query,
    parse_show,
    resolve_power_mode,
    run_tool,
)
from edgerl.hw.load_sources import ProcfsSource, record_from_jtop
from edgerl.hw.monitor import LoadMonitor, judge
from edgerl.hw.platform import detect

from .conftest import FIXTURES, PONG_FAST, edgerl_cmd
from .damage import RANDOM_4K, WRONG_DOCUMENTS, damaged_json, dumps

BOARDS = FIXTURES / "boards"


@pytest.mark.parametrize(
    ("board", "model", "l4t", "cpus"),
    [
        ("nano_jp4", "NVIDIA Jetson Nano Developer Kit", "32.7.1", 4),
        ("agx_orin_jp6", "NVIDIA Jetson AGX Orin Developer Kit", "36.4.4", 12),
        ("thor_jp7", "NVIDIA Jetson AGX Thor Developer Kit", "38.4.0", 14),
    ],
)
def test_detects_jetsons_from_their_files(board, model, l4t, cpus):
    p = detect(BOARDS / board)
    assert (p.is_jetson, p.model, p.l4t, p.cpu_count) == (True, model, l4t, cpus)
    assert p.gpu == "integrated Tegra GPU (GR3D)"


def test_this_machine_is_not_a_jetson(tmp_path):
    p = detect(tmp_path)
    assert not p.is_jetson and p.l4t is None and p.cpu_count == os.cpu_count()
    assert p.describe().startswith("not a Jetson")


@pytest.mark.parametrize("group", [("hw",), ("hw", "clocks"), ()])
def test_a_command_group_alone_shows_its_commands(cli, group):
    r = cli(*group)
    assert r.code == 0 and r.err == ""
    assert r.out.startswith(f"Usage: edgerl {' '.join(group)}".rstrip()) and "Commands:" in r.out


@pytest.mark.parametrize(
    ("name", "maxed", "mode"),
    [
        ("nano_5w_dynamic.txt", False, "5W"),
        ("nano_5w_max.txt", True, "5W"),
        ("orin_nano_super_dynamic.txt", False, "25W"),
        ("tx1_l4t28.txt", True, None),
    ],
)
def test_parse_jetson_clocks_show(name, maxed, mode):
    state = parse_show((FIXTURES / "jetson_clocks" / name).read_text())
    assert (state.maxed, state.power_mode) == (maxed, mode)


def test_parse_nvpmodel_query():
    assert parse_nvpmodel_query((FIXTURES / "jetson_clocks/nvpmodel_q_5w.txt").read_text()) == (
        "5W",
        1,
    )


def test_clocks_store_max_restore_in_order(fake_jetson, tmp_path):
    hw = HwConfig(nvpmodel="0")
    (fake_jetson.state / "nvpmodel.mode").write_text("1")
    with MaxClocks(hw, tmp_path / "state") as clocks:
        assert clocks.active
        assert (fake_jetson.state / "clocks.maxed").exists()
        assert (tmp_path / "state" / "clocks.json").exists()
    store = str(tmp_path / "state" / "jetson_clocks.store")
    assert fake_jetson.calls() == [
        ["nvpmodel", "-q"],
        ["jetson_clocks", "--store", store],
        ["nvpmodel", "-m", "0"],
        ["jetson_clocks"],
        ["nvpmodel", "-m", "1"],
        ["jetson_clocks", "--restore", store],
    ]
    assert not (fake_jetson.state / "clocks.maxed").exists()
    assert (fake_jetson.state / "nvpmodel.mode").read_text() == "1"
    assert not (tmp_path / "state" / "clocks.json").exists()


def test_power_mode_names_come_from_nvpmodel_conf(fake_jetson):
    assert resolve_power_mode("MAXN") == 0 and resolve_power_mode("5W") == 1
    assert resolve_power_mode("2") == 2
    with pytest.raises(HardwareError, match=r"'10W' is not a power mode .*MAXN \(0\), 5W \(1\)"):
        resolve_power_mode("10W")


def test_clocks_with_a_power_mode_name(fake_jetson, tmp_path):
    with MaxClocks(HwConfig(nvpmodel="5W"), tmp_path / "s"):
        assert (fake_jetson.state / "nvpmodel.mode").read_text() == "1"
    assert ["-m", "1"] in fake_jetson.calls("nvpmodel")
    assert fake_jetson.calls("nvpmodel")[-1] == ["-m", "0"]  # back to MAXN


def test_clocks_are_restored_when_training_raises(fake_jetson, tmp_path):
    with pytest.raises(RuntimeError), MaxClocks(HwConfig(), tmp_path / "s"):
        raise RuntimeError("the loop crashed")
    assert fake_jetson.calls("jetson_clocks")[-1][0] == "--restore"
    assert not (fake_jetson.state / "clocks.maxed").exists()


def test_not_root_leaves_clocks_alone(fake_jetson, tmp_path, caplog):
    with MaxClocks(HwConfig(), tmp_path / "s", is_root=lambda: False) as clocks:
        assert not clocks.active
    assert fake_jetson.calls() == []
    assert "maximum clocks need root" in caplog.text


def test_not_a_jetson_leaves_clocks_alone(fake_jetson, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("EDGERL_HW_ROOT", str(tmp_path / "empty"))
    with caplog.at_level("INFO"), MaxClocks(HwConfig(), tmp_path / "s") as clocks:
        assert not clocks.active
    assert fake_jetson.calls() == [] and "not a Jetson: leaving clocks alone" in caplog.text


def test_a_stale_marker_is_restored_before_storing_again(fake_jetson, tmp_path):
    state = tmp_path / "s"
    first = MaxClocks(HwConfig(), state)
    first.start()  # then the process is killed: no restore
    with MaxClocks(HwConfig(), state):
        pass
    calls = fake_jetson.calls("jetson_clocks")
    assert calls[2][0] == "--restore"  # the stale state, before the new --store
    assert calls[3][0] == "--store"
    assert not (fake_jetson.state / "clocks.maxed").exists()


def test_tool_timeouts_are_reported(fake_jetson, monkeypatch):
    monkeypatch.setenv("EDGERL_STANDIN_SLEEP_JETSON_CLOCKS", "5")
    with pytest.raises(ToolError, match="did not finish within 1 s"):
        run_tool(["jetson_clocks", "--show"], timeout=1)


def test_restore_after_a_kill_through_the_cli(fake_jetson, tmp_path, cli):
    state = tmp_path / "s"
    MaxClocks(HwConfig(), state).start()
    assert (fake_jetson.state / "clocks.maxed").exists()
    r = cli("hw", "clocks", "restore", "--set", f"hw.state_dir={state}")
    assert r.code == 0 and "clocks restored" in r.out
    assert not (fake_jetson.state / "clocks.maxed").exists()
    r = cli("hw", "clocks", "restore", "--set", f"hw.state_dir={state}")
    assert r.code == 0 and "nothing to restore" in r.out


# -- restoring needs only the marker; a damaged marker still ends safe -------------------------


def killed_after_maxing() -> Path:
    """Clocks maxed in root's default place, then the process killed: the marker stays."""
    MaxClocks(HwConfig(), default_state_dir()).start()
    marker = default_state_dir() / "clocks.json"
    assert marker.exists()
    return marker


@pytest.mark.parametrize(
    "config",
    [
        b"[env",
        b"[hw]\nmonitor_interval_ms = 1\n",
        b"[agent]\nlr = nan\n",
        b"[nope]\n",
        RANDOM_4K,  # not UTF-8
        b"[env]\nid = " + b"[" * 100_000 + b"]" * 100_000 + b"\n",  # nested beyond reason
        "fifo",
    ],
    ids=lambda c: c if isinstance(c, str) else repr(c[:20]),
)
def test_restore_needs_only_the_marker_whatever_the_config_holds(
    fake_jetson, tmp_path, cli, monkeypatch, config
):
    killed_after_maxing()
    broken = tmp_path / "edgerl.toml"
    if config == "fifo":
        os.mkfifo(broken)  # would block a reader that opened it as a file
    else:
        broken.write_bytes(config)
    monkeypatch.setenv("EDGERL_SYSTEM_CONFIG", str(broken))
    r = cli("hw", "clocks", "restore")
    assert r.code == 0 and "clocks restored" in r.out, r.err
    assert "the config cannot be read" in r.err and str(broken) in r.err
    assert not (fake_jetson.state / "clocks.maxed").exists()


def left_maxed(fake_jetson) -> Path:
    """The files killed_after_maxing() leaves, written directly (the stand-ins' --store writes
    "maxed=False" while the clocks are dynamic): quicker for many cases."""
    marker = default_state_dir() / "clocks.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    (marker.parent / "jetson_clocks.store").write_text("maxed=False\n")
    (fake_jetson.state / "clocks.maxed").touch()
    marker.write_text(json.dumps(GOOD_MARKER))
    return marker


GOOD_MARKER = {
    "jetson_clocks": "/usr/bin/jetson_clocks",
    "store": "/run/edgerl-clocks/jetson_clocks.store",
    "nvpmodel": "/usr/sbin/nvpmodel",
    "previous_mode": 1,
    "pid": 4242,
    "since": "2026-01-01T00:00:00+0000",
}


@pytest.mark.parametrize(
    "damage",
    [
        *WRONG_DOCUMENTS,
        dumps({**GOOD_MARKER, "jetson_clocks": 5}),
        dumps({**GOOD_MARKER, "store": None}),
        dumps({**GOOD_MARKER, "jetson_clocks": "rm"}),  # no absolute path: never run
        dumps({**GOOD_MARKER, "previous_mode": "1"}),
        dumps({**GOOD_MARKER, "previous_mode": 10**30}),
        dumps({**GOOD_MARKER, "nvpmodel": ["x"]}),
        dumps({**GOOD_MARKER, "nvpmodel": "/x\0"}),  # no program's name holds a NUL
        dumps({**GOOD_MARKER, "jetson_clocks": "/bin/\ud800"}),  # nor a lone surrogate
        dumps({**GOOD_MARKER, "store": "/x\ud800"}),
    ],
)
def test_a_damaged_marker_restores_the_clocks_stored_beside_it(fake_jetson, cli, damage):
    marker = left_maxed(fake_jetson)
    marker.write_bytes(damage)
    r = cli("hw", "clocks", "restore")
    assert r.code == 0 and "clocks restored" in r.out, r.err
    assert f"{marker} was damaged" in r.err and "nvpmodel -q shows it" in r.err
    assert not (fake_jetson.state / "clocks.maxed").exists() and not marker.exists()


def test_an_unreadable_config_that_may_name_the_state_dir_is_not_nothing_to_restore(
    fake_jetson, tmp_path, cli, monkeypatch
):
    elsewhere = tmp_path / "hw-state"
    MaxClocks(HwConfig(state_dir=str(elsewhere)), elsewhere).start()
    broken = tmp_path / "edgerl.toml"
    broken.write_text(f'[hw]\nstate_dir = "{elsewhere}"\n[env')
    monkeypatch.setenv("EDGERL_SYSTEM_CONFIG", str(broken))
    r = cli("hw", "clocks", "restore")
    assert r.code == 2 and "internal error" not in r.err
    assert "--state-dir DIR" in r.err.strip().splitlines()[-1]
    r = cli("hw", "clocks", "restore", "--state-dir", elsewhere)
    assert r.code == 0 and "clocks restored" in r.out, r.err
    assert not (fake_jetson.state / "clocks.maxed").exists()


@pytest.mark.parametrize("place", ["fifo", "device", "huge", "directory"])
def test_something_else_than_a_marker_in_its_place_restores_the_clocks_beside_it(
    fake_jetson, cli, place
):
    marker = left_maxed(fake_jetson)
    marker.unlink()
    if place == "fifo":
        os.mkfifo(marker)
    elif place == "device":
        marker.symlink_to("/dev/zero")
    elif place == "directory":
        marker.mkdir()
    else:
        marker.write_bytes(b" " * (1 << 20) + json.dumps(GOOD_MARKER).encode())
    r = cli("hw", "clocks", "restore")
    assert r.code == 0 and "clocks restored" in r.out, r.err
    assert f"{marker} was damaged" in r.err
    assert not (fake_jetson.state / "clocks.maxed").exists()


def test_a_damaged_marker_without_stored_clocks_says_what_to_run(fake_jetson, cli):
    marker = killed_after_maxing()
    marker.write_bytes(b"{}")
    (marker.parent / "jetson_clocks.store").unlink()
    r = cli("hw", "clocks", "restore")
    assert r.code == 2 and "internal error" not in r.err
    assert "sudo jetson_clocks --restore FILE" in r.err and "reboot" in r.err
    assert r.err.strip().splitlines()[-1].startswith("edgerl: error: the clocks were not restored")
    assert marker.exists()  # kept, so a later restore can try again


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(damage=damaged_json(GOOD_MARKER))
def test_any_marker_ends_restored_or_in_a_sentence(fake_jetson, damage):
    from edgerl.hw.commands import clocks_restore

    marker = left_maxed(fake_jetson)
    marker.write_bytes(damage)
    try:
        assert clocks_restore([marker.parent]) == "clocks restored"
        assert not (fake_jetson.state / "clocks.maxed").exists()
    except HardwareError as e:
        assert "the clocks were not restored" in str(e) and marker.exists()
    marker.unlink(missing_ok=True)
    (fake_jetson.state / "clocks.maxed").unlink(missing_ok=True)


def test_root_runs_nothing_from_a_marker_others_could_write(fake_jetson, cli):
    if os.geteuid() != 0:
        pytest.skip("the check is root's")
    marker = killed_after_maxing()
    marker.write_text(json.dumps({**GOOD_MARKER, "jetson_clocks": "/bin/false"}))
    os.chmod(marker.parent, 0o777)  # a directory anyone may write into
    calls = len(fake_jetson.calls())
    r = cli("hw", "clocks", "restore")
    assert r.code == 2 and "could have been written by another user than root" in r.err
    assert len(fake_jetson.calls()) == calls  # nothing was run


def test_the_services_clock_steps_and_its_unprivileged_trainer(fake_jetson, cli, caplog, tmp_path):
    r = cli("hw", "clocks", "max", "--service")  # ExecStartPre=+...
    assert r.code == 0 and "clocks at maximum" in r.out, r.err
    with caplog.at_level("INFO"), MaxClocks(HwConfig(), is_root=lambda: False) as trainer:
        assert not trainer.active  # the trainer leaves them to the privileged steps
    assert "maximum, set by edgerl hw clocks max" in str(trainer.skipped)
    assert "need root" not in caplog.text
    off = tmp_path / "off.toml"
    off.write_text("[hw]\nmax_clocks = false\n")
    r = cli("hw", "clocks", "max", "--service", "--config", off)
    assert r.code == 0 and "hw.max_clocks is false: leaving clocks alone" in r.out
    assert cli("hw", "clocks", "restore").out.strip() == "clocks restored"  # ExecStopPost=+...
    assert not (fake_jetson.state / "clocks.maxed").exists()


def test_the_service_max_step_off_a_jetson_is_no_error(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGERL_HW_ROOT", str(tmp_path))
    r = cli("hw", "clocks", "max", "--service")
    assert r.code == 0 and "not a Jetson: leaving clocks alone" in r.out


def test_hw_clocks_show_and_max(fake_jetson, tmp_path, cli):
    r = cli("hw", "clocks", "show")
    assert r.code == 0 and "edgerl: clocks are dynamic, power mode 5W" in r.out
    r = cli("hw", "clocks", "max", "--set", f"hw.state_dir={tmp_path / 's'}")
    assert r.code == 0 and "clocks at maximum" in r.out
    assert "maximum (pinned)" in cli("hw", "clocks", "show").out


def test_hw_status_on_a_fake_board(fake_jetson, cli):
    r = cli("hw", "status", "--json")
    assert r.code == 0, r.err
    s = json.loads(r.out)
    assert s["board"] == "NVIDIA Jetson Nano Developer Kit" and s["l4t"] == "32.7.1"
    assert s["clocks"].startswith("dynamic") and s["power_mode"] == "5W"
    assert s["load_source"] == "tegrastats" and s["load"].startswith("RAM 4412/7772MB")


def test_hw_status_here(cli):
    r = cli("hw", "status")
    assert r.code == 0 and "not a Jetson" in r.out and "procfs" in r.out


def test_hw_clocks_show_off_a_jetson_is_a_clear_error(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGERL_HW_ROOT", str(tmp_path))
    r = cli("hw", "clocks", "show")
    assert r.code == 2 and "this is not a Jetson" in r.err


def test_procfs_source_on_this_machine():
    src = ProcfsSource(100)
    time.sleep(0.2)
    rec = src.sample()
    src.close()
    assert len(rec.cpu) == os.cpu_count()
    assert all(c is not None and 0 <= c <= 100 for c in rec.cpu)
    import psutil

    assert abs(rec.ram_total_mb - psutil.virtual_memory().total // 2**20) <= 1


def test_procfs_source_on_a_board_tree(tmp_path):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    cpu = root / "sys/devices/system/cpu"
    for n in (0, 1):
        (cpu / f"cpu{n}/cpufreq").mkdir(parents=True)
        (cpu / f"cpu{n}/cpufreq/scaling_cur_freq").write_text("1479000\n")
    (cpu / "present").write_text("0-3\n")
    zone = root / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("GPU-therm\n")
    (zone / "temp").write_text("41500\n")
    gpu = root / "sys/devices/gpu.0"
    gpu.mkdir(parents=True)
    (gpu / "load").write_text("315\n")
    (root / "proc/meminfo").write_text(
        "MemTotal: 4057360 kB\nMemAvailable: 2028680 kB\n"
        "SwapTotal: 2028676 kB\nSwapFree: 2028676 kB\n"
    )
    stat = root / "proc/stat"
    stat.write_text("cpu  0 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0\ncpu1 0 0 0 1000 0 0 0\n")
    src = ProcfsSource(100, root=root, use_nvml=False)
    stat.write_text("cpu  0 0 0 0 0 0 0\ncpu0 190 0 100 810 0 0 0\ncpu1 50 0 0 1050 0 0 0\n")
    rec = src.sample()
    assert rec.cpu == [90.0, 50.0, None, None]  # cores 2-3 offline: not in /proc/stat
    assert rec.cpu_mhz == [1479, 1479, None, None]
    assert (rec.ram_total_mb, rec.ram_used_mb, rec.swap_used_mb) == (3962, 1981, 0)
    assert rec.temps == {"GPU-therm": 41.5} and rec.gr3d == 31.5


def test_jtop_mapping():
    cpu = {"cpu": [{"online": True, "idle": 20.0, "freq": {"cur": 1479000}}, {"online": False}]}
    memory = {
        "RAM": {"used": 2_000_000, "tot": 4_000_000},
        "SWAP": {"used": 0, "tot": 2_000_000},
        "EMC": {"val": 12, "cur": 1600000},
    }
    gpu = {"gpu": {"status": {"load": 45.0}, "freq": {"cur": 921600}}}
    temperature = {"gpu": {"temp": 40.5, "online": True}, "cv0": {"temp": -256, "online": False}}
    power = {"rail": {"VDD_IN": {"power": 5000}}, "tot": {"power": 5000}}
    rec = record_from_jtop(cpu, memory, gpu, temperature, power)
    assert rec.cpu == [80.0, None] and rec.cpu_mhz == [1479, None]
    assert (rec.ram_used_mb, rec.ram_total_mb, rec.emc, rec.emc_mhz) == (1953, 3906, 12.0, 1600)
    assert (rec.gr3d, rec.gr3d_mhz) == (45.0, 921) and rec.temps == {"gpu": 40.5}
    assert rec.power_total_mw == 5000


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ((10, 98.0, 40.0, 12.0), "cpu-bound"),
        ((10, 97.0, 97.0, None), "cpu-bound"),
        ((10, 40.0, 30.0, 95.0), "gpu-bound"),
        ((10, 91.0, 11.0, 58.0), "cpu-bound"),  # an H100 run: one Python core set the pace
        ((10, 90.0, 60.0, 90.0), "balanced"),
        ((10, 30.0, 20.0, 20.0), "balanced"),
        ((1, 99.0, 99.0, 0.0), "unknown"),
    ],
)
def test_verdict_rules(args, kind):
    v = judge(*args)
    assert v.kind == kind
    assert str(args[0]) in v.sentence()
    if kind == "cpu-bound" and args[3] is not None:
        assert ("one core" in v.sentence()) == (args[2] < 50)


def test_monitor_reads_tegrastats_and_writes_logs(fake_jetson, tmp_path):
    mon = LoadMonitor(HwConfig(monitor_interval_ms=50), tmp_path, step=lambda: 42)
    with mon:
        deadline = time.monotonic() + 10
        while mon.verdict().samples < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert mon.source_name == "tegrastats"
    assert fake_jetson.calls("tegrastats")[0] == ["--interval", "50"]
    lines = (tmp_path / "tegrastats.log").read_text().splitlines()
    assert len(lines) >= 4
    assert "GR3D_FREQ 62%@306" in lines[0] and lines[0][:2].isdigit()  # date added
    rows = list(csv.DictReader((tmp_path / "load.csv").open()))
    assert rows[0]["step"] == "42" and rows[0]["gr3d"] == "62.0" and rows[0]["power_mw"] == "4067"
    assert mon.verdict().gr3d is not None


def test_train_with_max_clocks_restores_them_after_ctrl_c(fake_jetson, tmp_path):
    run = tmp_path / "pong"
    args = [
        "train",
        *PONG_FAST,
        "--steps",
        "1000000",
        "--run-dir",
        str(run),
        "--set",
        "hw.max_clocks=true",
        "--set",
        f"hw.state_dir={tmp_path / 'state'}",
        "--set",
        "hw.monitor_interval_ms=200",
    ]
    proc = subprocess.Popen(
        edgerl_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (run / "load.csv").exists() and len((run / "load.csv").read_text().splitlines()) > 3:
            break
        time.sleep(0.2)
    assert (fake_jetson.state / "clocks.maxed").exists()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    jc = [c[0] if c else "max" for c in fake_jetson.calls("jetson_clocks")]
    assert jc == ["--store", "max", "--restore"]
    assert not (fake_jetson.state / "clocks.maxed").exists()
    assert "what limited training:" in err and "GR3D" in err
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert "gr3d" in rows[0] and rows[-1]["gr3d"] != ""


def test_hw_parse_end_to_end(tmp_path, cli):
    mixed = tmp_path / "mixed.log"
    lines = []
    for p in sorted((FIXTURES / "tegrastats").glob("*.txt")):
        lines += p.read_text().splitlines()
    lines.insert(3, "tegrastats: some warning")
    lines.insert(7, "")
    mixed.write_text("\n".join(lines) + "\n")
    r = cli("hw", "parse", mixed)
    assert r.code == 0
    rows = list(csv.DictReader(r.out.splitlines()))
    assert len(rows) == len([ln for ln in lines if ln.strip()]) - 1
    assert json.loads(rows[0]["cpu"])
    assert "mixed.log:4: skipped, not a tegrastats line: tegrastats: some warning" in r.err
    r = cli("hw", "parse", mixed, "--format", "json")
    records = json.loads(r.out)
    assert len(records) == len(rows)
    assert records[0]["ram_total_mb"] == 30697  # agx_orin_jp6.txt comes first
    assert records[0]["cpu"][5] == 100.0


def test_hw_parse_errors(tmp_path, cli):
    assert "does not exist" in cli("hw", "parse", tmp_path / "nope.log").err
    (tmp_path / "empty.log").write_text("nothing here\n")
    r = cli("hw", "parse", tmp_path / "empty.log")
    assert r.code == 2 and "has no tegrastats lines" in r.err


def test_standins_are_executable():
    for tool in ("jetson_clocks", "tegrastats", "nvpmodel"):
        assert shutil.which(tool, path=str(FIXTURES.parent / "standins"))
