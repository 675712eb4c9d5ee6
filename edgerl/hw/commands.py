"""What `edgerl hw ...` does: status, clocks show/max/restore, tegrastats log parsing; and how
its results read on a terminal."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from edgerl.config import HwConfig
from edgerl.errors import HardwareError
from edgerl.hw.clocks import (
    MARKER,
    MaxClocks,
    ToolError,
    clocks_state,
    parse_nvpmodel_query,
    parse_show,
    restore_from_marker,
    run_tool,
    state_dir_for,
)
from edgerl.hw.load_sources import ProcfsSource, TegrastatsSource
from edgerl.hw.platform import detect
from edgerl.hw.tegrastats import CSV_FIELDS, LoadRecord, format_line, parse_line

log = logging.getLogger(__name__)


def sample_load(hw: HwConfig) -> tuple[str, LoadRecord | None]:
    """One load sample now: (source name, record); tegrastats if present, else procfs."""
    tool = shutil.which(hw.tegrastats)
    if tool is not None:
        source = TegrastatsSource(tool, 500)
        try:
            return "tegrastats", source.read()
        finally:
            source.close()
    source_p = ProcfsSource(500)
    try:
        return "procfs", source_p.read()
    finally:
        source_p.close()


def hardware_status(hw: HwConfig) -> dict[str, Any]:
    """Board, L4T, clocks, power mode and one load line, as plain values."""
    platform = detect()
    clocks = clocks_state(hw) if platform.is_jetson else None
    power_mode = clocks.power_mode if clocks else None
    nvpmodel = shutil.which(hw.nvpmodel_cmd)
    if platform.is_jetson and power_mode is None and nvpmodel:
        try:
            name, mode = parse_nvpmodel_query(run_tool([nvpmodel, "-q"]))
            power_mode = f"{name} ({mode})" if name else None
        except ToolError:
            pass
    marker = state_dir_for(hw) / MARKER
    if not platform.is_jetson:
        clocks_text = "not a Jetson"
    elif clocks is None:
        clocks_text = "unknown (jetson_clocks --show needs root)"
    else:
        clocks_text = clocks.describe()
    if marker.exists():
        clocks_text += f"; maxed by edgerl (undo: edgerl hw clocks restore; {marker})"
    source, rec = sample_load(hw)
    return {
        "board": platform.model or ("Jetson" if platform.is_jetson else "not a Jetson"),
        "is_jetson": platform.is_jetson,
        "l4t": platform.l4t,
        "cpus": platform.cpu_count,
        "gpu": platform.gpu,
        "clocks": clocks_text,
        "power_mode": power_mode,
        "load_source": source,
        "load": format_line(rec) if rec else None,
        "load_record": rec.to_dict() if rec else None,
    }


def _jetson_clocks_tool(hw: HwConfig) -> str:
    if not detect().is_jetson:
        raise HardwareError("this is not a Jetson: it has no jetson_clocks to use")
    tool = shutil.which(hw.jetson_clocks)
    if tool is None:
        raise HardwareError(
            f"{hw.jetson_clocks} was not found on PATH; set hw.jetson_clocks to its path"
        )
    return tool


def clocks_show(hw: HwConfig) -> str:
    """``jetson_clocks --show`` and a one-line summary; raises HardwareError if it cannot run."""
    tool = _jetson_clocks_tool(hw)
    try:
        out = run_tool([tool, "--show"])
    except ToolError as e:
        root = "" if os.geteuid() == 0 else " (it needs root: try sudo)"
        raise HardwareError(f"{e}{root}") from None
    return out.rstrip("\n") + f"\nedgerl: clocks are {parse_show(out).describe()}"


def clocks_max(hw: HwConfig, service: bool = False) -> str:
    """Store and max the clocks, leaving them maxed; raises HardwareError when it cannot.

    ``service``: as the service's privileged ExecStartPre, where clocks that cannot be maxed
    here (hw.max_clocks false, not a Jetson, no jetson_clocks) are said and are no error: the
    trainer starts all the same.
    """
    if service and not hw.max_clocks:
        return "hw.max_clocks is false: leaving clocks alone"
    if service and not detect().is_jetson:
        return "not a Jetson: leaving clocks alone"
    _jetson_clocks_tool(hw)
    if os.geteuid() != 0:
        raise HardwareError("maxing the clocks needs root: run it with sudo")
    clocks = MaxClocks(hw, state_dir_for(hw))
    clocks.start()
    if not clocks.active:
        raise HardwareError(f"clocks were not changed: {clocks.skipped}")
    return f"clocks at maximum; undo with: edgerl hw clocks restore ({clocks.marker})"


def clocks_restore(state_dirs: list[Path], config_unread: bool = False) -> str:
    """Restore what edgerl stored in any of ``state_dirs`` (only their marker files are read);
    a no-op when it changed nothing. Raises HardwareError when a marker is there and the clocks
    could not be restored (the log says why and what to run), and when there is none but
    ``config_unread`` (the config could not be read, so a ``hw.state_dir`` it sets is unknown)."""
    dirs = list(dict.fromkeys(state_dirs))
    markers = [d / MARKER for d in dirs if (d / MARKER).exists()]
    if not markers and config_unread:
        raise HardwareError(
            f"no stored clocks in {dirs[-1]}, and the config cannot be read, so a "
            "hw.state_dir it may set is unknown: if it sets one, run sudo edgerl hw clocks "
            "restore --state-dir DIR with that directory"
        )
    if not markers:
        return f"nothing to restore: edgerl has not changed the clocks (no {dirs[0] / MARKER})"
    failed = [m for m in markers if not restore_from_marker(m)]
    if failed:
        raise HardwareError(
            f"the clocks were not restored (the lines above say why and what to run); "
            f"{failed[0]} stays, so edgerl hw clocks restore can try again"
        )
    return "clocks restored"


def parse_log(path: Path) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(records, skipped (line number, text)) of a tegrastats log; raises HardwareError."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise HardwareError(f"{path} does not exist") from None
    except OSError as e:
        raise HardwareError(f"cannot read {path}: {e.strerror}") from None
    records, skipped = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        rec = parse_line(line)
        if rec is None:
            skipped.append((lineno, line.strip()))
        else:
            records.append(rec.to_dict())
    if not records:
        raise HardwareError(f"{path} has no tegrastats lines")
    return records, skipped


def render_status(status: dict[str, Any]) -> str:
    """``edgerl hw status`` as aligned lines."""
    keys = ("board", "l4t", "cpus", "gpu", "clocks", "power_mode", "load_source", "load")
    return "\n".join(
        f"{key.replace('_', ' '):12s} {status[key] if status[key] is not None else '-'}"
        for key in keys
    )


def render_records(records: list[dict[str, Any]], fmt: str) -> str:
    """Records as a JSON list or CSV (lists and maps as JSON in their cells)."""
    if fmt == "json":
        return json.dumps(records, indent=1) + "\n"
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS)
    for rec in records:
        writer.writerow(
            [
                json.dumps(rec[k])
                if isinstance(rec[k], (list, dict))
                else ("" if rec[k] is None else rec[k])
                for k in CSV_FIELDS
            ]
        )
    return buf.getvalue()


def printable(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, with control and other unprintable characters shown
    as escapes (a binary file's bytes must not reach the terminal raw)."""
    cut = text[:limit]
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
