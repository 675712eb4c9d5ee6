"""How long PyTorch's idle CPU threads spin before they sleep: set short, before torch loads.

PyTorch's CPU builds run an operation's threads with OpenMP: GNU's libgomp in PyPI's wheels for
Linux (a build with another OpenMP ignores this setting). When a parallel region ends, its worker
threads wait for the next one by spinning, ``GOMP_SPINCOUNT`` pause instructions (300,000 unless
the environment says otherwise), and only then sleep. Between the operations of an update the next
region comes within microseconds, and the spin saves the wake-up. After the actor's forward pass
the next region is a whole emulator step away: on two cores ALE's two threads emulate the step
(128 Pong games, about 25 ms) while the worker spins beside them, on one of their cores. 300,000
pauses took 7.5 ms on a 2-core AMD EPYC (Zen 4; one run, quiet), that much of the emulator's CPU
time gone every step.

:func:`short_spin` sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` for this process and those it
starts: a spin of about 0.25 ms there, still longer than the gaps between an update's operations.
libgomp reads its environment once, when it is loaded with torch, so edgerl's package calls it on
import, before anything of edgerl imports torch; a program that imports torch first keeps
libgomp's default (:func:`short_spin` then returns None). Where the user sets
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``, theirs stands. docs/performance.md, "Idle OpenMP
threads", has the figures.
"""

from __future__ import annotations

import os
import sys

SPIN_COUNT = "10000"  # pause instructions; libgomp's default is 300,000

_USERS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def short_spin() -> str | None:
    """Set ``GOMP_SPINCOUNT`` (see the module docstring) unless the environment sets the wait
    already or torch, and with it libgomp, is loaded; returns the value set, else None."""
    if any(name in os.environ for name in _USERS) or "torch" in sys.modules:
        return None
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return SPIN_COUNT
