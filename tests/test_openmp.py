"""PyTorch's idle OpenMP threads spin briefly once edgerl is imported (edgerl/hw/openmp.py):
measured by the CPU time a fresh process spends while its main thread sleeps between parallel
regions, with edgerl imported before torch and after it."""

from __future__ import annotations

import ast
import os

import pytest

from edgerl.hw.cpus import usable_cpus
from edgerl.hw.openmp import SPIN_COUNT

from .helpers import fresh_python_lines

# Twenty parallel regions (an in-place add over 4M floats, two threads), each followed by 50 ms
# of sleep: the CPU time of the sleeps is what the idle worker spent spinning. CPU time, not wall
# time: a worker preempted by other load spins as many pauses, later.
PROBE = """
import os, sys, time
first = sys.argv[1]
if first == "edgerl":
    import edgerl
import torch
if first == "torch":
    import edgerl
torch.set_num_threads(2)
x = torch.zeros(1 << 22)
x.add_(1.0)  # the threads start
idle = 0.0
for _ in range(20):
    x.add_(1.0)
    started = time.process_time()
    time.sleep(0.05)
    idle += time.process_time() - started
with open("/proc/self/maps") as maps:
    gomp = "libgomp" in maps.read()
print(repr((os.environ.get("GOMP_SPINCOUNT"), gomp, idle)))
"""


def probe(first: str, **env: str) -> tuple[str | None, bool, float]:
    """(GOMP_SPINCOUNT as the process ends, whether libgomp is loaded, CPU seconds spent
    while sleeping) of a fresh process importing ``first`` before the other."""
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    return ast.literal_eval(fresh_python_lines(PROBE, first, env={**clean, **env})[-1])


def test_importing_edgerl_first_makes_the_idle_threads_spin_briefly() -> None:
    if usable_cpus() < 2:
        pytest.skip("two CPUs are needed for a worker thread to spin beside the sleeping one")
    short, gomp, short_idle = probe("edgerl")
    late, _, default_idle = probe("torch")
    if not gomp:
        pytest.skip("this torch does not run its threads with GNU OpenMP")
    assert short == SPIN_COUNT
    assert late is None  # torch, and libgomp with it, came first: nothing set
    # libgomp's default, 300,000 pauses, spins 30 times as long as 10,000: 7.5 ms against
    # 0.25 after each region on a 2-core AMD EPYC
    assert short_idle * 5 < default_idle, (short_idle, default_idle)


def test_the_users_setting_stands() -> None:
    assert probe("edgerl", GOMP_SPINCOUNT="1000")[0] == "1000"
    assert probe("edgerl", OMP_WAIT_POLICY="ACTIVE")[0] is None
