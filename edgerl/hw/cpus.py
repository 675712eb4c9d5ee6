"""How busy this machine's CPUs are with other work: what PyTorch's thread count is judged by.

The 1-minute load average lags: it still says "busy" for a minute after another job ended (a
previous training run, a benchmark, another test), and a run that starts then would take one
thread where it could have two (Pong on 2 cores: 82 steps/s with one thread, 120 with two). So the
command line marks the CPU time at its start (:func:`mark`, before torch is imported; the
calibration's measuring process, and its starting one after it, mark again:
:func:`mark_and_look`), and :func:`cpu_load` measures how many CPUs *other* programs kept busy
since then: the machine's busy CPU time less this process's own, over the wall time between.
Without a mark, or over less than half a second, it falls back to the load average. No torch
here: the mark is taken before PyTorch's import.

Work of a lower priority than this process's (``nice``: the kernel's "nice" CPU time, spent by
processes of a niceness above 0) is not counted as taking CPUs from it when it runs at niceness 0
or below (``edgerl train``, or the service at -5): the scheduler gives such work only what the
trainer leaves (a niceness 19 task weighs 15 against a niceness 0 task's 1,024), so dropping a
thread for it would hand it a core. Measured: a ``nice -n 19`` test run beside an Atari run on two
cores had the trainer drop from two threads to one (0.6 of 2 CPUs busy with other work, counted
before this rule). Niceness weighs only among processes that share a CPU cgroup: a niced job in
another cgroup with the CPU controller (the service's own, under systemd) gets its cgroup's
share whatever its niceness, and is undercounted here.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import psutil

MIN_WINDOW_S = 0.5  # a shorter window says too little: the load average is used instead


@dataclass(frozen=True)
class CpuSample:
    """The CPU time spent at one moment: the machine's busy seconds (all CPUs) and this
    process's own (all its threads)."""

    wall: float  # time.monotonic()
    busy: float
    own: float

    @classmethod
    def now(cls) -> CpuSample:
        """Busy time over the CPUs this process may run on (all of them unless ``taskset``, a
        cpuset or ``CPUAffinity=`` holds it to some): other programs on CPUs it cannot use take
        nothing from it."""
        per_cpu = psutil.cpu_times(percpu=True)
        try:
            allowed = os.sched_getaffinity(0)
        except (AttributeError, OSError):
            allowed = set()
        yields = lower_priority_yields()
        if allowed and len(allowed) < len(per_cpu) and max(allowed) < len(per_cpu):
            busy = sum(_busy(per_cpu[i], yields) for i in allowed)
        else:
            busy = _busy(psutil.cpu_times(), yields)
        me = psutil.Process()
        mine = me.cpu_times()
        own = mine.user + mine.system - (_niced_threads_time(me) if yields else 0.0)
        return cls(time.monotonic(), busy, own)


def _niced_threads_time(me: psutil.Process) -> float:
    """CPU seconds of this process's live threads that run niced (the replay save's, at
    niceness 10): the kernel counts them in the "nice" time left out of the machine's busy time,
    so they leave this process's own too. A niced thread that ended within a window takes its
    seconds out of this sum, making other programs look less busy for that window, never more.
    Linux only (elsewhere a thread's id is no process id getpriority takes)."""
    if not sys.platform.startswith("linux"):
        return 0.0
    total = 0.0
    try:
        threads = me.threads()
    except (OSError, psutil.Error):
        return 0.0
    for thread in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, thread.id) > 0:
                total += thread.user_time + thread.system_time
        except OSError:  # it ended meanwhile
            continue
    return total


def lower_priority_yields() -> bool:
    """Whether niced work (niceness above 0) yields to this process: it runs at niceness 0 or
    below. A process that is niced itself counts all other work, as its own time is among the
    niced time."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) <= 0
    except (AttributeError, OSError):
        return False


def _busy(times: Any, without_niced: bool = False) -> float:
    """The busy seconds in one of psutil's cpu_times records; ``without_niced`` leaves out the
    time of processes of a niceness above 0."""
    total = sum(times)
    # Linux counts guest time inside user time too (psutil's cpu_percent does the same).
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    if without_niced:  # niced guests' time is inside "nice": it goes with it
        total -= getattr(times, "nice", 0.0)
    return float(total - times.idle - getattr(times, "iowait", 0.0))


def others_busy(start: CpuSample, end: CpuSample) -> float | None:
    """CPUs other programs kept busy between two samples, or None for a window under
    ``MIN_WINDOW_S``."""
    wall = end.wall - start.wall
    if wall < MIN_WINDOW_S:
        return None
    return max(0.0, (end.busy - start.busy) - (end.own - start.own)) / wall


_mark: CpuSample | None = None


def mark() -> None:
    """Start the window :func:`cpu_load` measures other programs' work over (the CLI's start)."""
    global _mark
    try:
        _mark = CpuSample.now()
    except (OSError, psutil.Error):  # no /proc: the load average then
        _mark = None


def mark_and_look(seconds: float = 2 * MIN_WINDOW_S) -> None:
    """:func:`mark`, then wait ``seconds`` so that the next :func:`cpu_load` measures the CPUs
    over that second instead of falling back to the load average. For a process the command
    line did not start (the calibration's measuring one has no mark of its own), and for one
    whose window counted a child's CPU time as other programs' work (after the calibration's
    measuring process ends)."""
    mark()
    time.sleep(seconds)


@dataclass(frozen=True)
class CpuLoad:
    """This machine's CPUs and how busy other work keeps them."""

    cpus: int  # CPUs this process may run on (its affinity)
    load: float  # CPUs kept busy by other work (or the 1-minute load average: runnable tasks)
    measured_s: float = 0.0  # the window ``load`` was measured over; 0: it is the load average

    @property
    def free(self) -> int:
        """CPUs the load leaves free, rounded (0 when it takes them all)."""
        return max(0, round(self.cpus - self.load))

    def describe(self) -> str:
        if self.measured_s > 0:
            return f"{self.cpus} CPUs, {self.load:.1f} busy with other work"
        return f"{self.cpus} CPUs, load average {self.load:.1f}"


def usable_cpus() -> int:
    """The CPUs this process may run on: fewer than the machine has under ``taskset``, a
    container's cpuset or systemd's ``CPUAffinity=``."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_load() -> CpuLoad:
    """The CPUs this process may use and how busy other work keeps them now: measured since
    :func:`mark` where it was called at least ``MIN_WINDOW_S`` ago, else the load average (0
    where the OS has none)."""
    cpus = usable_cpus()
    if _mark is not None:
        try:
            end = CpuSample.now()
        except (OSError, psutil.Error):
            end = None
        busy = others_busy(_mark, end) if end is not None else None
        if busy is not None and end is not None:
            return CpuLoad(cpus, busy, end.wall - _mark.wall)
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return CpuLoad(cpus, load)
