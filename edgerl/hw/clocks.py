"""Maximum clocks for the length of a run: ``jetson_clocks`` store -> max -> always restore.

Entering :class:`MaxClocks` runs ``jetson_clocks --store FILE`` (FILE under the state directory,
never jetson_clocks' default in $HOME), then optionally ``nvpmodel -m MODE``, then
``jetson_clocks``; leaving runs ``nvpmodel -m PREVIOUS`` and ``jetson_clocks --restore FILE``,
whatever happened in between. A marker file (``clocks.json``) records what to undo before anything
is changed, so ``edgerl hw clocks restore`` (the service's ``ExecStopPost=``) can restore clocks
even when the trainer was killed. Every call has a timeout. Not a Jetson, not root, or no
jetson_clocks: one line in the log and nothing changes; training goes on.

Restoring needs only the marker, never the config: the service's privileged ExecStopPost must
work whatever ``/etc/edgerl/edgerl.toml`` holds. Root keeps the marker and the stored clocks in
``/run/edgerl-clocks`` (a directory only root can write: the trainer runs as another user, and
root runs the commands the marker names; clocks do not survive a reboot, neither does ``/run``),
and runs nothing from a marker that others could have written. A damaged marker still ends safe:
the clocks stored beside it are restored, or a sentence says what to run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from edgerl.config import HwConfig
from edgerl.errors import HardwareError
from edgerl.files.atomic import write_atomic
from edgerl.files.regular import read_regular
from edgerl.hw.platform import Platform, detect, hw_path

log = logging.getLogger(__name__)

TOOL_TIMEOUT_S = 30.0
MARKER = "clocks.json"
STORE_FILE = "jetson_clocks.store"
# Root's clock state (below EDGERL_HW_ROOT, as every hardware path): see the module docstring.
ROOT_STATE_DIR = Path("/run/edgerl-clocks")
MAX_POWER_MODE = 1000
MAX_MARKER_BYTES = 64 * 1024  # a marker is a few hundred bytes

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
    except OSError as e:  # a directory, a file that is not executable
        raise ToolError(f"{argv[0]} cannot be run ({e.strerror or e})") from None
    except ValueError as e:  # a NUL byte or a lone surrogate in an argument
        raise ToolError(f"{argv[0]!r} cannot be run ({e})") from None
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(argv)} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        reason = f": {detail[-1]}" if detail else ""
        raise ToolError(f"{' '.join(argv)} failed with exit code {done.returncode}{reason}")
    return done.stdout


def default_state_dir() -> Path:
    """Where the clock state is kept: /run/edgerl-clocks as root, else ~/.local/state/edgerl
    (there it is only read: clocks need root)."""
    if os.geteuid() == 0:
        return hw_path(str(ROOT_STATE_DIR))
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
            set_by = Path(self.hw.state_dir) if self.hw.state_dir else hw_path(str(ROOT_STATE_DIR))
            if (set_by / MARKER).is_file():  # the service's privileged ExecStartPre did it
                return self._skip(f"maximum, set by edgerl hw clocks max ({set_by / MARKER})")
            return self._skip(
                "maximum clocks need root (the service sets them in its privileged "
                "ExecStartPre: edgerl hw clocks max --service)",
                logging.WARNING,
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
                if not restore_from_marker(self.marker, self.timeout):
                    # Storing now would keep maximum clocks as the ones to go back to.
                    return self._skip(
                        f"the clocks a previous run changed could not be restored ({self.marker} "
                        "stays: see the log)",
                        logging.ERROR,
                    )
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


@dataclass(frozen=True)
class Marker:
    """What a marker file says to undo."""

    jetson_clocks: str
    store: str
    nvpmodel: str | None
    previous_mode: int | None


class MarkerError(ValueError):
    """A marker file is damaged; ``str()`` says how."""


def parse_marker(data: bytes) -> Marker:
    """The marker in ``data``; raises MarkerError when it is not one (wrong JSON types too)."""
    try:
        info = json.loads(data)
    except (ValueError, RecursionError):
        raise MarkerError("it is not JSON") from None
    if not isinstance(info, dict):
        raise MarkerError(f"it holds {type(info).__name__ if info is not None else 'null'}")
    for key in ("jetson_clocks", "store"):
        if not _is_absolute_path(info.get(key)):
            raise MarkerError(f"{key} is {_shown(info.get(key))}, not an absolute path")
    nvpmodel, mode = info.get("nvpmodel"), info.get("previous_mode")
    if nvpmodel is not None and not _is_absolute_path(nvpmodel):
        raise MarkerError(f"nvpmodel is {_shown(nvpmodel)}, not an absolute path")
    if mode is not None and (
        isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= MAX_POWER_MODE
    ):
        raise MarkerError(f"previous_mode is {_shown(mode)}, not a power mode id")
    return Marker(info["jetson_clocks"], info["store"], nvpmodel, mode)


def _is_absolute_path(value: Any) -> bool:
    """Whether ``value`` is a string a program can be given as an absolute path."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        return False
    try:
        os.fsencode(value)  # a lone surrogate (JSON allows "\\ud800") names no file
    except UnicodeEncodeError:
        return False
    return True


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def untrusted(path: Path) -> str | None:
    """Why root must not run what ``path`` names (someone other than root may have written it
    or its directory), or None."""
    for p in (path, path.parent):
        try:
            st = p.lstat()
        except OSError as e:
            return f"{p} cannot be checked ({e.strerror or e})"
        if st.st_uid != 0 or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
            return f"{p} could have been written by another user than root"
    return None


UNDO = (
    "restore the clocks with: sudo jetson_clocks --restore FILE (a file you stored them in), or "
    "reboot (a Jetson boots with its default clocks)"
)


def restore_from_marker(marker: Path, timeout: float = TOOL_TIMEOUT_S) -> bool:
    """Undo what a marker records: power mode, then stored clocks; remove the marker.

    Returns True if the clocks were restored. The marker stays if restoring failed, so a later
    ``edgerl hw clocks restore`` can try again. A damaged marker: the clocks stored beside it
    are restored if they can be (the power mode it may have set is named as unknown), else a
    sentence says what to run. As root, nothing is run from a marker another user could have
    written. Never raises.
    """
    try:
        data = read_regular(marker, MAX_MARKER_BYTES)
    except FileNotFoundError:
        return False
    except PermissionError as e:
        log.error("cannot read %s (%s); %s", marker, e.strerror or e, UNDO)
        return False
    except OSError as e:  # a FIFO, a device or megabytes in its place: damaged
        return _restore_beside(marker, e.strerror or str(e), timeout)
    if os.geteuid() == 0 and (why := untrusted(marker)) is not None:
        log.error("%s is not used: %s; %s", marker, why, UNDO)
        return False
    try:
        info = parse_marker(data)
    except MarkerError as e:
        return _restore_beside(marker, str(e), timeout)
    ok = True
    if info.previous_mode is not None and info.nvpmodel:
        try:
            run_tool([info.nvpmodel, "-m", str(info.previous_mode)], timeout)
        except ToolError as e:
            log.error("could not restore the power mode: %s", e)
            ok = False
    try:
        run_tool([info.jetson_clocks, "--restore", info.store], timeout)
        log.info("clocks restored from %s", info.store)
    except ToolError as e:
        log.error("could not restore the clocks: %s", e)
        return False
    if ok:
        marker.unlink(missing_ok=True)
    return ok


def _restore_beside(marker: Path, why: str, timeout: float) -> bool:
    """A damaged marker: restore the clocks stored beside it with jetson_clocks from PATH."""
    store = marker.parent / STORE_FILE
    tool = shutil.which("jetson_clocks")
    if tool is None or not store.is_file() or (os.geteuid() == 0 and untrusted(store)):
        log.error("%s is damaged (%s) and no stored clocks are beside it; %s", marker, why, UNDO)
        return False
    try:
        run_tool([tool, "--restore", str(store)], timeout)
    except ToolError as e:
        log.error("%s is damaged (%s) and %s; %s", marker, why, e, UNDO)
        return False
    log.warning(
        "%s was damaged (%s): restored the clocks stored in %s; a power mode it set is not "
        "known (nvpmodel -q shows it, sudo nvpmodel -m ID sets it)",
        marker,
        why,
        store,
    )
    try:
        marker.unlink(missing_ok=True)
    except OSError as e:  # a directory in its place: the clocks are restored all the same
        log.error("%s cannot be removed (%s); remove it with: sudo rm -r %s", marker, e, marker)
    return True


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
