"""Device choices (device.py): mixed precision and CUDA graphs per GPU generation, their errors,
the grad scaler on old torch, and PyTorch's CPU threads against the machine's load."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from edgerl.config import PerfConfig
from edgerl.errors import ConfigError
from edgerl.hw.cpus import CpuSample, cpu_load, others_busy
from edgerl.hw.device import (
    CpuLoad,
    configure_backends,
    describe_threads,
    make_grad_scaler,
    oversubscription,
    resolve_amp,
    resolve_cuda_graphs,
    resolve_threads,
)

from .helpers import CPU, GPU


@pytest.mark.parametrize(
    ("setting", "capability", "integrated", "expected"),
    [
        ("auto", (8, 7), True, torch.bfloat16),  # Orin
        ("auto", (7, 2), True, torch.float16),  # Xavier
        ("auto", (5, 3), True, torch.float16),  # Nano
        ("auto", (6, 1), False, None),  # consumer Pascal: slow fp16
        ("auto", (9, 0), False, None),  # H100/H200: bf16 measured slower at these sizes
        ("auto", (8, 6), False, None),  # a desktop Ampere
        ("bf16", (9, 0), False, torch.bfloat16),  # asked for: given
        ("off", (8, 7), True, None),
        ("fp16", (8, 7), True, torch.float16),
    ],
)
def test_mixed_precision_choice(setting, capability, integrated, expected):
    assert resolve_amp(setting, GPU, capability, integrated=integrated) is expected


def test_mixed_precision_errors():
    assert resolve_amp("auto", CPU) is None
    with pytest.raises(ConfigError, match=r"perf\.amp=fp16 needs a CUDA GPU"):
        resolve_amp("fp16", CPU)
    with pytest.raises(ConfigError, match=r"compute capability 8\.0 or newer"):
        resolve_amp("bf16", GPU, (7, 2))


def test_cuda_graph_choice():
    assert resolve_cuda_graphs("auto", GPU, torch.bfloat16)
    assert not resolve_cuda_graphs("auto", GPU, torch.float16)  # the grad scaler syncs
    assert not resolve_cuda_graphs("auto", CPU, None)
    with pytest.raises(ConfigError, match="cannot capture the fp16 grad scaler"):
        resolve_cuda_graphs("on", GPU, torch.float16)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        resolve_cuda_graphs("on", CPU, None)


def test_auto_precision_leaves_a_small_mlp_in_fp32():
    """Vector observations lose precision in bf16 before the first layer (0.5% on CartPole-like
    inputs here), and a small MLP's update gains nothing from it."""
    from edgerl.hw.device import resolve_amp

    perf = PerfConfig(amp="auto", cuda_graphs="off", compile="off")
    orin = {"capability": (8, 7), "integrated": True}
    assert resolve_amp(perf.amp, torch.device("cuda"), frames=False, **orin) is None
    assert resolve_amp(perf.amp, torch.device("cuda"), frames=True, **orin) is torch.bfloat16
    assert resolve_amp("bf16", torch.device("cuda"), (8, 7), frames=False) is torch.bfloat16


def test_grad_scaler_falls_back_to_the_cuda_amp_name(monkeypatch):
    """NVIDIA's torch 2.3 pre-releases for JetPack 6.0 predate torch.amp.GradScaler."""
    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    with pytest.warns((UserWarning, FutureWarning)):  # no CUDA here / the old name's notice
        scaler = make_grad_scaler()
    assert isinstance(scaler, torch.cuda.amp.GradScaler)


def test_auto_threads_are_the_cpus_the_load_leaves_free(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # what PyTorch would take by itself
    assert resolve_threads(0, CpuLoad(8, 0.2)) == 8
    assert resolve_threads(0, CpuLoad(8, 3.4)) == 5
    assert resolve_threads(0, CpuLoad(2, 3.0)) == 1  # a 2-core CI machine beside other jobs
    assert resolve_threads(0, CpuLoad(16, 0.0)) == 8  # never more than PyTorch's own choice
    assert resolve_threads(3, CpuLoad(2, 3.0)) == 3  # a number is what the user asked for
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert 1 <= resolve_threads(0, CpuLoad(64, 0.0)) <= 64  # the physical cores


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_a_process_held_to_one_cpu_counts_one_for_threads_and_emulators():
    """Under taskset (or a container's cpuset) the machine's CPU count is not this process's:
    PyTorch's threads, the emulator's threads and the load's CPUs follow the affinity."""
    code = (
        "from edgerl.config import EnvConfig\n"
        "from edgerl.envs.ale import AleVecEnv\n"
        "from edgerl.hw.cpus import cpu_load, usable_cpus\n"
        "from edgerl.hw.device import torch_default_threads\n"
        "import os\n"
        "os.environ.pop('OMP_NUM_THREADS', None)\n"
        "env = AleVecEnv(EnvConfig(id='ALE/Pong-v5', num_envs=4), 'pong')\n"
        "print(usable_cpus(), torch_default_threads(), cpu_load().cpus, env.threads)\n"
        "env.close()\n"
    )
    one = sorted(os.sched_getaffinity(0))[:1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, one),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1", "1", "1"]


def test_other_programs_on_cpus_this_process_may_not_use_take_nothing_from_it(monkeypatch):
    """Under taskset the busy time edgerl counts is its own CPUs': a program busy on another
    CPU is not load for it. (The arithmetic over psutil's per-CPU records: on a shared machine
    which CPU another job lands on cannot be arranged.)"""
    from collections import namedtuple

    from edgerl.hw import cpus

    Times = namedtuple("Times", "user system idle iowait guest guest_nice")
    per_cpu = [Times(10.0, 0.0, 90.0, 0.0, 0.0, 0.0), Times(80.0, 10.0, 10.0, 0.0, 0.0, 0.0)]

    def cpu_times(percpu: bool = False):  # type: ignore[no-untyped-def]
        if percpu:
            return per_cpu
        return Times(*(sum(t[i] for t in per_cpu) for i in range(6)))

    monkeypatch.setattr(cpus.psutil, "cpu_times", cpu_times)
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0})
    assert cpus.CpuSample.now().busy == 10.0  # CPU 0 alone
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1})
    assert cpus.CpuSample.now().busy == 100.0  # every CPU


def test_niced_work_does_not_count_as_taking_cpus_from_a_trainer_that_is_not_niced(monkeypatch):
    """A ``nice -n 19`` job beside an Atari run made the trainer drop a thread: the scheduler gives
    such a job only what the trainer leaves, so its time (the kernel's "nice" column) is not
    counted against a trainer at niceness 0 or below; a niced trainer counts it (its own time is
    in that column). Guest time, inside user and nice, is counted once."""
    from collections import namedtuple

    from edgerl.hw import cpus

    Times = namedtuple("Times", "user nice system idle iowait guest guest_nice")
    record = Times(
        user=30.0, nice=50.0, system=10.0, idle=10.0, iowait=0.0, guest=4.0, guest_nice=2.0
    )
    monkeypatch.setattr(
        cpus.psutil, "cpu_times", lambda percpu=False: [record] if percpu else record
    )
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(cpus, "lower_priority_yields", lambda: True)
    assert cpus.CpuSample.now().busy == 40.0  # user (its guest time in it) and system
    monkeypatch.setattr(cpus, "lower_priority_yields", lambda: False)
    assert cpus.CpuSample.now().busy == 90.0  # and nice (its guest time in it)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")
def test_this_processs_own_niced_threads_leave_its_own_time_as_they_leave_the_machines():
    """The replay save's thread runs at niceness 10: its time is in the kernel's nice column, which
    the machine's busy time leaves out for a trainer that is not niced, so it leaves this
    process's own time too (else it would hide as much of other programs' work)."""
    import threading

    from edgerl.hw import cpus

    if not cpus.lower_priority_yields():
        pytest.skip("the suite runs niced: its own time counts whole")
    spun: list[float] = []

    def niced_spin() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        start = time.thread_time()
        while time.thread_time() - start < 0.5:  # CPU time, however loaded the machine
            pass
        spun.append(time.thread_time() - start)
        done.wait(timeout=600)  # alive while sampled: an ended thread leaves the sum

    done = threading.Event()
    me = psutil.Process()
    before, total_before = cpus.CpuSample.now(), sum(me.cpu_times()[:2])
    thread = threading.Thread(target=niced_spin, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 600
        while not spun and time.monotonic() < deadline:
            time.sleep(0.05)
        after, total_after = cpus.CpuSample.now(), sum(me.cpu_times()[:2])
    finally:
        done.set()
        thread.join(timeout=60)
    assert spun, "the niced thread did not spin within 600 s"
    # this process spent the thread's 0.5 s and more; its own, as counted, left at least 0.5 out
    assert (total_after - total_before) - (after.own - before.own) >= 0.45


def test_whether_niced_work_yields_follows_this_processs_own_niceness():
    """Read from the kernel: a process at niceness 0 (or below) is yielded to, a niced one is not.
    (The child starts at this test's niceness, which a ``nice`` run of the suite raises.)"""
    code = (
        "import os, sys\n"
        "os.nice(int(sys.argv[1]))\n"
        "from edgerl.hw.cpus import lower_priority_yields\n"
        "print(lower_priority_yields())\n"
    )
    said = [
        subprocess.run([sys.executable, "-c", code, n], capture_output=True, text=True, timeout=300)
        for n in ("0", "5")
    ]
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert [s.stdout.strip() for s in said] == [str(own <= 0), "False"], [s.stderr for s in said]


def test_other_programs_cpu_use_is_the_machines_less_this_process_over_the_window():
    """Over 2 s the machine was busy 3.5 CPU-seconds, 1.5 of them this process's own."""
    start, end = CpuSample(10.0, 100.0, 5.0), CpuSample(12.0, 103.5, 6.5)
    assert others_busy(start, end) == pytest.approx(1.0)
    assert others_busy(start, CpuSample(10.2, 100.1, 5.0)) is None  # too short to say
    assert others_busy(start, CpuSample(12.0, 101.0, 6.5)) == 0.0  # never below zero


def test_a_busy_program_is_seen_at_once_not_a_minute_later(monkeypatch):
    """The load average lags a minute behind; the window from the mark sees a busy loop that
    started after it, and this process's own work is not counted."""
    import edgerl.hw.cpus as cpus

    monkeypatch.setattr(cpus, "_mark", None)
    assert cpu_load().measured_s == 0.0  # no mark: the load average
    cpus.mark()
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        time.sleep(2.0)
        load = cpu_load()
    finally:
        busy.kill()
        busy.wait(timeout=60)
    assert load.measured_s >= 2.0
    assert load.load >= 0.5, load  # the loop's CPU, and whatever else runs on this machine
    assert "busy with other work" in load.describe()


def test_oversubscription_is_named_with_the_fix():
    sentence = oversubscription(2, CpuLoad(2, 3.0))
    assert sentence is not None
    assert "PyTorch runs 2 threads but 2 CPUs, load average 3.0 leaves 0 free" in sentence
    assert "perf.threads=0 (auto: 1 now)" in sentence
    assert oversubscription(1, CpuLoad(2, 5.0)) is None  # one thread waits for nobody
    assert oversubscription(4, CpuLoad(8, 1.0)) is None
    assert oversubscription(16, CpuLoad(8, 0.0)) is not None  # more threads than CPUs


def test_training_set_up_applies_and_logs_the_thread_choice(caplog):
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.DEBUG, logger="edgerl"):
            count = configure_backends(CPU, 0)
        assert count == torch.get_num_threads() >= 1
        assert f"torch threads: {count} (perf.threads=0: auto, " in caplog.text
        noun = "thread" if count == 1 else "threads"
        assert describe_threads(0).startswith(f"{count} torch {noun} (auto; ")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="edgerl"):
            configure_backends(CPU, 64)
        assert torch.get_num_threads() == 64
        assert "PyTorch runs 64 threads" in caplog.text  # named at start, as a warning
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("capture", "flags"),
    [("xeon-amx.txt", ("amx_bf16", "avx512_bf16")), ("orin_a78ae.txt", ())],
)
def test_bf16_on_a_cpu_only_where_it_is_in_hardware(tmp_path, monkeypatch, capture, flags):
    """perf.amp=bf16 on a CPU: given where /proc/cpuinfo names bf16 arithmetic (an AMX Xeon),
    refused in one sentence where it does not (an Orin's Cortex-A78AE); auto stays fp32."""
    from pathlib import Path

    from edgerl.hw.platform import cpu_bf16_flags

    (tmp_path / "proc").mkdir()
    source = Path(__file__).parent / "fixtures" / "cpuinfo" / capture
    (tmp_path / "proc" / "cpuinfo").write_bytes(source.read_bytes())
    monkeypatch.setenv("EDGERL_HW_ROOT", str(tmp_path))
    assert cpu_bf16_flags() == flags
    assert resolve_amp("auto", CPU) is None
    if flags:
        assert resolve_amp("bf16", CPU) is torch.bfloat16
    else:
        with pytest.raises(ConfigError, match=r"needs bf16 arithmetic in hardware"):
            resolve_amp("bf16", CPU)
