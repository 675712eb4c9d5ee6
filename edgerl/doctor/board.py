"""The board: which Jetson and L4T release (and so which row of the Supported platforms table in
docs/install.md), ``jetson_clocks``, ``tegrastats`` and ``nvpmodel`` and whether this user may
run them, and the jtop service. Files are read below ``EDGERL_HW_ROOT`` and tools found on PATH, as
everywhere in :mod:`edgerl.hw`, so stand-ins can play a board in tests."""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass

from edgerl.doctor.core import Check, Context
from edgerl.hw.clocks import (
    ToolError,
    parse_nvpmodel_query,
    parse_show,
    resolve_power_mode,
    run_tool,
)
from edgerl.hw.platform import detect

SUPPORTED = "see Supported platforms in docs/install.md"
TOOL_TIMEOUT_S = 10.0
NOT_JETSON = "not a Jetson"


JETPACK5_WAY = (
    "an Orin moves to JetPack 6 (a reflash); a Xavier plays a policy exported elsewhere: edgerl "
    "export --onnx on a supported machine, then trtexec --onnx=policy.onnx on the board"
)
JETPACK4_WAY = (
    "train elsewhere (JetPack 4's TensorRT 8.2 does not read edgerl's opset-17 ONNX either); "
    "edgerl hw parse reads this board's tegrastats logs anywhere"
)


@dataclass(frozen=True)
class Release:
    """Where an L4T release stands: its JetPack, whether edgerl supports it, and if not why
    and what to do instead (the Supported platforms table of docs/install.md)."""

    jetpack: str
    supported: bool | None  # None: a release this edgerl does not know
    why: str = ""
    way_forward: str = ""


def jetpack(l4t: str) -> Release:
    """The :class:`Release` of an L4T release string such as ``36.4.4``."""
    parts = [int(p) for p in l4t.split(".") if p.isdigit()]
    major, minor = [*parts, 0, 0][:2]
    if major == 32:
        why = "its Python 3.6 and PyTorch 1.x are older than edgerl supports"
        return Release("JetPack 4", False, why, JETPACK4_WAY)
    if major in (34, 35):
        why = "its Python 3.8 is older than ale-py's vector env and edgerl support"
        return Release("JetPack 5", False, why, JETPACK5_WAY)
    if major == 36 and minor in (2, 3):
        return Release("JetPack 6.0", True)
    if major == 36 and minor >= 4:
        return Release("JetPack 6.1/6.2", True)
    if major >= 38:
        return Release("JetPack 7", True)
    return Release(f"L4T {major}.{minor}", None, "a release this edgerl does not know")


def check_board(ctx: Context) -> Check:
    """The board and its L4T release, judged against the supported platforms."""
    p = detect()
    ctx.platform = p
    if not p.is_jetson:
        return Check("board", "skip", f"{p.describe()}: no L4T release to check", data=p.to_dict())
    board = p.model or "a Jetson"
    if p.l4t is None:
        return Check(
            "board",
            "warn",
            f"{board}, L4T release unknown (no readable /etc/nv_tegra_release)",
            f"edgerl needs JetPack 6 or 7; {SUPPORTED}",
            p.to_dict(),
        )
    release = jetpack(p.l4t)
    found = f"{board}, L4T {p.l4t} ({release.jetpack})"
    data = {**p.to_dict(), "jetpack": release.jetpack, "supported": release.supported}
    if release.supported:
        return Check("board", "pass", found, data=data)
    if release.supported is None:
        return Check(
            "board",
            "warn",
            f"{found}: {release.why}",
            f"edgerl is made for JetPack 6 and 7; {SUPPORTED}",
            data,
        )
    return Check(
        "board",
        "fail",
        f"{found} is not supported: {release.why}",
        f"{release.way_forward}; {SUPPORTED}",
        data,
    )


def _jetson(ctx: Context) -> bool:
    return ctx.platform is not None and ctx.platform.is_jetson


def check_jetson_clocks(ctx: Context) -> Check:
    """jetson_clocks is there and answers ``--show`` (which, like maxing, needs root)."""
    name = ctx.cfg.hw.jetson_clocks
    if not _jetson(ctx):
        return Check("jetson_clocks", "skip", f"{NOT_JETSON}: edgerl leaves clocks alone")
    tool = shutil.which(name)
    if tool is None:
        return Check(
            "jetson_clocks",
            "fail",
            f"{name} was not found on PATH: training cannot max the clocks",
            "it comes with L4T in /usr/bin; set hw.jetson_clocks to its path",
        )
    if not ctx.is_root:
        return Check(
            "jetson_clocks",
            "warn",
            f"{tool} is there, but only root may run it (the edgerl service runs as root)",
            "sudo edgerl doctor checks that it works; sudo edgerl hw clocks max maxes by hand",
            {"path": tool},
        )
    try:
        state = parse_show(run_tool([tool, "--show"], TOOL_TIMEOUT_S))
    except ToolError as e:
        return Check(
            "jetson_clocks",
            "fail",
            str(e),
            "check the L4T install (sudo jetson_clocks --show must work)",
            {"path": tool},
        )
    return Check(
        "jetson_clocks",
        "pass",
        f"{tool} --show works: clocks {state.describe()}",
        data={"path": tool, "maxed": state.maxed, "power_mode": state.power_mode},
    )


def check_tegrastats(ctx: Context) -> Check:
    """tegrastats prints a line edgerl's parser reads (the load monitor's first choice)."""
    from edgerl.hw.load_sources import TegrastatsSource

    name = ctx.cfg.hw.tegrastats
    if not _jetson(ctx):
        return Check("tegrastats", "skip", f"{NOT_JETSON}: load comes from procfs and NVML")
    tool = shutil.which(name)
    if tool is None:
        return Check(
            "tegrastats",
            "warn",
            f"{name} was not found on PATH: the load monitor falls back to jtop or procfs",
            "it comes with L4T in /usr/bin; set hw.tegrastats to its path",
        )
    source = TegrastatsSource(tool, 200)
    got = []
    reader = threading.Thread(target=lambda: got.append(source.read()), daemon=True)
    reader.start()
    reader.join(TOOL_TIMEOUT_S)
    source.close()  # ends a tool that printed nothing, so the reader returns
    reader.join(2)
    rec = got[0] if got else None
    if rec is None:
        return Check(
            "tegrastats",
            "fail",
            f"{tool} printed no tegrastats line within {TOOL_TIMEOUT_S:.0f} s",
            f"run {tool} by hand to see why; the load monitor falls back to procfs",
            {"path": tool},
        )
    parts = [f"{sum(c is not None for c in rec.cpu)} CPUs online"]
    if rec.ram_used_mb is not None and rec.ram_total_mb is not None:
        parts.insert(0, f"RAM {rec.ram_used_mb}/{rec.ram_total_mb} MB")
    parts.append(f"GR3D {rec.gr3d:.0f}%" if rec.gr3d is not None else "no GR3D figure")
    return Check(
        "tegrastats",
        "pass",
        f"{tool} reports load: {', '.join(parts)}",
        data={"path": tool, "record": rec.to_dict()},
    )


def check_nvpmodel(ctx: Context) -> Check:
    """nvpmodel answers ``-q``, and ``hw.nvpmodel`` (if set) names one of the board's modes."""
    hw = ctx.cfg.hw
    if not _jetson(ctx):
        return Check("nvpmodel", "skip", f"{NOT_JETSON}: no power modes")
    tool = shutil.which(hw.nvpmodel_cmd)
    wanted = f" and hw.nvpmodel={hw.nvpmodel!r} cannot be set" if hw.nvpmodel else ""
    if tool is None:
        return Check(
            "nvpmodel",
            "fail" if hw.nvpmodel else "warn",
            f"{hw.nvpmodel_cmd} was not found on PATH: the power mode cannot be read{wanted}",
            "it comes with L4T in /usr/sbin; set hw.nvpmodel_cmd to its path",
        )
    try:
        name, mode = parse_nvpmodel_query(run_tool([tool, "-q"], TOOL_TIMEOUT_S))
    except ToolError as e:
        return Check(
            "nvpmodel",
            "fail",
            str(e),
            "check the L4T install (nvpmodel -q must work)",
            {"path": tool},
        )
    if hw.nvpmodel:
        resolve_power_mode(hw.nvpmodel)  # HardwareError (a fail line) names the board's modes
    who = "" if ctx.is_root else "; changing it needs root (the service runs as root)"
    return Check(
        "nvpmodel",
        "pass",
        f"{tool}: power mode {name or '?'} ({mode if mode is not None else '?'}){who}",
        data={"path": tool, "mode": name, "id": mode},
    )


def check_jtop(ctx: Context) -> Check:
    """jetson-stats' jtop service (optional: the monitor reads it when tegrastats is missing)."""
    if not _jetson(ctx):
        return Check("jtop", "skip", f"{NOT_JETSON}: jetson-stats is for Jetsons")
    try:
        import jtop  # noqa: F401  jetson-stats, an optional extra

        from edgerl.hw.load_sources import JtopSource
    except ImportError:
        return Check(
            "jtop",
            "skip",
            "jetson-stats is not installed (optional: tegrastats comes first)",
            "pip install 'edgerl[jetson]' and sudo systemctl enable --now jtop, to use it",
        )
    try:
        source = JtopSource(1000)
    except Exception as e:  # jtop raises JtopException when its service does not answer
        return Check(
            "jtop",
            "warn",
            f"jetson-stats is installed but the jtop service does not answer ({e})",
            "sudo systemctl restart jtop (and add yourself to the jtop group)",
        )
    source.close()
    return Check("jtop", "pass", "the jtop service answers")


def effective_root() -> bool:
    """Whether this process may do what only root may (run jetson_clocks, set power modes)."""
    return os.geteuid() == 0
