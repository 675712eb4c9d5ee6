"""Maximum clocks for the length of a run: ``jetson_clocks`` store -> max -> always restore.

Entering :class:`MaxClocks` runs ``jetson_clocks --store FILE`` (FILE under the state directory,
never jetson_clocks' default in $HOME), then optionally ``nvpmodel -m MODE``, then
``jetson_clocks``; leaving runs ``nvpmodel -m PREVIOUS`` and ``jetson_clocks --restore FILE``,
whatever happened in between. A marker file (``clocks.json``) records what to undo before anything
is changed, so ``edgerl hw clocks restore`` (the service's ``ExecStopPost=``) can restore clocks
even when the trainer was killed. Every call has a timeout. Not a Jetson, not root, or no
jetson_clocks: one line in the log and nothing changes; training goes on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from edgerl.atomic import write_atomic
from edgerl.config import HwConfig
from edgerl.errors import HardwareError
from edgerl.hw.platform import Platform, detect, hw_path

log = logging.getLogger(__name__)

TOOL_TIMEOUT_S = 30.0
MARKER = "clocks.json"
STORE_FILE = "jetson_clocks.store"

# "cpu0: Online=1 Governor=schedutil MinFreq=... MaxFreq=... CurrentFreq=..." (TX1: "Gonvernor=")
SHOW_CPU = re.compile(
    r"^cpu(?P<n>\d+):\s+(?:Online=(?P<online>\d)\s+)?Go?n?vernor=\S+\s+"
    r"MinFreq=(?P<min>\d+)\s+MaxFreq=(?P<max>\d+)\s+CurrentFreq=(?P<cur>\d+)"
)
SHOW_GPU = re.compile(r"^GPU MinFreq=(?P<min>\d+) MaxFreq=(?P<max>\d+) CurrentFreq=(?P<cur>\d+)")
POWER_MODE = re.compile(r"NV Power Mode:\s*(?P<name>\S+)")
# /etc/nvpmodel.conf: "< POWER_MODEL ID=0 NAME=MAXN >"
POWER_MODEL_DEFINITION = re.compile(
    r"^<\s*POWER_MODEL\s+ID=(?P<id>\d+)\s+NAME=(?P<name>\S+)\s*>", re.MULTILINE
)
POWER_MODE_ID = re.compile(r"^\s*(?P<id>\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class ClocksState:
    """What ``jetson_clocks --show`` says."""

    maxed: bool | None  # every online CPU and the GPU pinned at their maximum
    power_mode: str | None
    gpu_mhz: int | None

    def describe(self) -> str:
        state = {True: "maximum (pinned)", False: "dynamic", None: "unknown"}[self.maxed]
        return state + (f", power mode {self.power_mode}" if self.power_mode else "")


def parse_show(text: str) -> ClocksState:
    """Parse ``jetson_clocks --show`` output (any L4T) into a :class:`ClocksState`."""
    pinned: list[bool] = []
    gpu_mhz = None
    for line in text.splitlines():
        line = line.strip()
        if m := SHOW_CPU.match(line):
            if m["online"] != "0":
                pinned.append(m["min"] == m["max"])
        elif m := SHOW_GPU.match(line):
            pinned.append(m["min"] == m["max"])
            gpu_mhz = int(m["cur"]) // 1_000_000
    mode = POWER_MODE.search(text)
    return ClocksState(all(pinned) if pinned else None, mode["name"] if mode else None, gpu_mhz)


def parse_nvpmodel_query(text: str) -> tuple[str | None, int | None]:
    """``nvpmodel -q`` output -> (mode name, mode id), e.g. ("MAXN", 0)."""
    name = POWER_MODE.search(text)
    mode_id = POWER_MODE_ID.search(text)
    return (name["name"] if name else None, int(mode_id["id"]) if mode_id else None)


def power_modes(conf_text: str) -> dict[str, int]:
    """Mode name -> id from an ``/etc/nvpmodel.conf``."""
    return {m["name"]: int(m["id"]) for m in POWER_MODEL_DEFINITION.finditer(conf_text)}


def resolve_power_mode(value: str, root: Path | None = None) -> int:
    """``hw.nvpmodel`` (an id, or a name from /etc/nvpmodel.conf) -> id; raises HardwareError."""
    if value.strip().isdigit():
        return int(value)
    try:
        modes = power_modes(hw_path("/etc/nvpmodel.conf", root).read_text())
    except OSError:
        modes = {}
    if value in modes:
        return modes[value]
    known = ", ".join(f"{name} ({i})" for name, i in modes.items()) or "none found"
    raise HardwareError(f"hw.nvpmodel={value!r} is not a power mode of this board ({known})")


class ToolError(Exception):
    """A hardware tool failed or timed out; the message says which and how."""


def run_tool(argv: list[str], timeout: float = TOOL_TIMEOUT_S) -> str:
    """Run a tool, return its stdout; raise ToolError on failure, timeout or absence."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise ToolError(f"{argv[0]} was not found") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        reason = f": {detail[-1]}" if detail else ""
        raise ToolError(f"{' '.join(argv)} failed with exit code {done.returncode}{reason}")
    return done.stdout


def default_state_dir() -> Path:
    """``$STATE_DIRECTORY`` (systemd), /var/lib/edgerl as root, else ~/.local/state/edgerl."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/edgerl")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgerl"


def state_dir_for(hw: HwConfig) -> Path:
    return Path(hw.state_dir) if hw.state_dir else default_state_dir()


class MaxClocks:
    """Context manager: maximum clocks inside, the stored clocks (and power mode) after."""

    def __init__(
        self,
        hw: HwConfig,
        state_dir: Path | None = None,
        platform: Platform | None = None,
        is_root: Callable[[], bool] = lambda: os.geteuid() == 0,
        timeout: float = TOOL_TIMEOUT_S,
    ) -> None:
        self.hw = hw
        self.state_dir = state_dir or state_dir_for(hw)
        self.platform = platform
        self.is_root = is_root
        self.timeout = timeout
        self.active = False
        self.skipped: str | None = None  # why clocks were left alone, for `edgerl status`

    @property
    def marker(self) -> Path:
        return self.state_dir / MARKER

    def __enter__(self) -> MaxClocks:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()

    def _skip(self, why: str, level: int = logging.INFO) -> None:
        self.skipped = why
        log.log(level, "%s: leaving clocks alone", why)

    def start(self) -> None:
        """Store the clocks, set the power mode if asked, max the clocks. Never raises."""
        platform = self.platform or detect()
        if not platform.is_jetson:
            return self._skip("not a Jetson")
        if not self.is_root():
            return self._skip(
                "maximum clocks need root (the edgerl service runs as root)", logging.WARNING
            )
        tool = shutil.which(self.hw.jetson_clocks)
        if tool is None:
            return self._skip(
                f"{self.hw.jetson_clocks} was not found on PATH (hw.jetson_clocks)", logging.WARNING
            )
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if self.marker.exists():
                log.warning("a previous run left clocks changed; restoring them before storing")
                restore_from_marker(self.marker, self.timeout)
            store = self.state_dir / STORE_FILE
            previous_mode = self._current_mode() if self.hw.nvpmodel else None
            # The marker comes first: if we die after maxing, ExecStopPost knows what to undo.
            self._write_marker(tool, store, previous_mode)
            run_tool([tool, "--store", str(store)], self.timeout)
        except (ToolError, OSError) as e:
            self.marker.unlink(missing_ok=True)
            return self._skip(f"could not store the current clocks ({e})", logging.ERROR)
        self.active = True
        try:
            if self.hw.nvpmodel:
                mode = resolve_power_mode(self.hw.nvpmodel)
                run_tool([self._nvpmodel(), "-m", str(mode)], self.timeout)
                log.info("power mode set to %s (was %s)", self.hw.nvpmodel, previous_mode)
            run_tool([tool], self.timeout)
            log.info("clocks at maximum (stored in %s; restored when training ends)", store)
        except (ToolError, HardwareError) as e:
            log.error("could not max the clocks: %s; training goes on", e)

    def _nvpmodel(self) -> str:
        return shutil.which(self.hw.nvpmodel_cmd) or self.hw.nvpmodel_cmd

    def _current_mode(self) -> int | None:
        try:
            _, mode = parse_nvpmodel_query(run_tool([self._nvpmodel(), "-q"], self.timeout))
            return mode
        except ToolError as e:
            log.warning("could not read the power mode (%s); it will not be restored", e)
            return None

    def _write_marker(self, tool: str, store: Path, previous_mode: int | None) -> None:
        marker: dict[str, Any] = {
            "jetson_clocks": tool,
            "store": str(store),
            "nvpmodel": self._nvpmodel() if previous_mode is not None else None,
            "previous_mode": previous_mode,
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_atomic(self.marker, json.dumps(marker, indent=2).encode())

    def restore(self) -> None:
        """Restore what :meth:`start` changed (no-op if it changed nothing). Never raises."""
        if not self.active:
            return
        self.active = False
        restore_from_marker(self.marker, self.timeout)


def restore_from_marker(marker: Path, timeout: float = TOOL_TIMEOUT_S) -> bool:
    """Undo what a marker records: power mode, then stored clocks; remove the marker.

    Returns True if the clocks were restored. The marker stays if restoring failed, so a later
    ``edgerl hw clocks restore`` can try again. Never raises.
    """
    try:
        info = json.loads(marker.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as e:
        log.error("cannot read %s (%s); restore clocks with: jetson_clocks --restore", marker, e)
        return False
    ok = True
    if info.get("previous_mode") is not None and info.get("nvpmodel"):
        try:
            run_tool([info["nvpmodel"], "-m", str(info["previous_mode"])], timeout)
        except ToolError as e:
            log.error("could not restore the power mode: %s", e)
            ok = False
    try:
        run_tool([info["jetson_clocks"], "--restore", info["store"]], timeout)
        log.info("clocks restored from %s", info["store"])
    except ToolError as e:
        log.error("could not restore the clocks: %s", e)
        return False
    if ok:
        marker.unlink(missing_ok=True)
    return ok


def clocks_state(hw: HwConfig, timeout: float = TOOL_TIMEOUT_S) -> ClocksState | None:
    """``jetson_clocks --show`` parsed, or None where it cannot run (not a Jetson, not root)."""
    tool = shutil.which(hw.jetson_clocks)
    if tool is None:
        return None
    try:
        return parse_show(run_tool([tool, "--show"], timeout))
    except ToolError as e:
        log.debug("jetson_clocks --show: %s", e)
        return None
