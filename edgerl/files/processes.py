"""Is a process still there? (for status files and frame streams that name their writer)."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists and looks like edgerl (guards against pid reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    # An empty cmdline (a process mid-exec, or one whose memory is being torn down) proves nothing.
    return not cmdline or b"edgerl" in cmdline
