#!/usr/bin/env python3
"""pip install edgerl into this Python without replacing the torch, TensorRT and NumPy it has.

On a Jetson those come from JetPack (NVIDIA's wheels and Ubuntu's packages) and are seen through
a venv made with --system-site-packages; in an L4T container they come from the base image.
scripts/install.sh and docker/Dockerfile.jetson both install edgerl with this script, and
tests/test_install.py runs it, with pip's real resolver, against the version strings each JetPack
ships. Run it with the Python that gets edgerl (the venv's):

    /opt/edgerl/venv/bin/python scripts/jetpack_pip.py --constraints /opt/edgerl/constraints.txt SRC

SRC is a checkout of edgerl (or its wheel). What it does, and why:

1. Pin what is there (torch, torchvision, every tensorrt* distribution, numpy) in a constraints
   file, so that no dependency can pull a replacement from PyPI (a CPU-only torch, say).
2. Install edgerl itself with --no-deps. NVIDIA's torch builds are pre-releases with a local tag
   (``2.3.0a0+40ec155e58.nv24.03``), and pip never lets an installed torch count for edgerl's
   torch requirement through a constraint: ``pip install -c pins "edgerl[jetson]"`` with that
   torch pinned ends in ResolutionImpossible. edgerl checks torch itself instead (step 3).
3. Refuse, in one sentence, a torch older than edgerl supports (edgerl.hw.versions reads NVIDIA's
   version strings by their release numbers).
4. Install edgerl's other requirements (and those of the extras asked for) with the pins.
   NumPy is pinned only if it is new enough for edgerl; an older one (Ubuntu 22.04's 1.21.5) is
   shadowed by a NumPy 1.x installed beside edgerl, as NVIDIA's own PyTorch-for-Jetson guide
   does (``pip install numpy==1.26.1``): NVIDIA's JetPack 6 torch is built against NumPy 1.x and
   fails to convert arrays under NumPy 2.

Exit status: 0 installed, 1 refused (the sentence says why) or pip failed (pip said why).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

PINNED = ("torch", "torchvision", "numpy")  # plus every distribution named tensorrt*
NOT_FROM_PIP = {"torch"}  # JetPack's: never installed by this script
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
FLOOR = re.compile(r">=\s*([0-9][0-9.]*)")


def say(text: str) -> None:
    print(f"edgerl-install: {text}", flush=True)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version: ``1.26.1`` -> (1, 26, 1); () if there are none."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in m[1].split(".")) if m else ()


def installed() -> dict[str, str]:
    """Normalized name -> version of every distribution this Python sees (its venv first, then
    the system's site-packages when the venv was made with --system-site-packages)."""
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist.version)  # sys.path order: the first wins
    return found


def requirements(extras: list[str]) -> list[str]:
    """edgerl's requirements (installed metadata) for its core and ``extras``, as requirement
    lines with markers, leaving out what JetPack provides; raises SystemExit if edgerl is not
    installed."""
    importlib.invalidate_caches()
    try:
        lines = md.requires("edgerl") or []
    except md.PackageNotFoundError:
        raise SystemExit("edgerl-install: error: edgerl was not installed") from None
    out = []
    for line in lines:
        spec, _, marker = line.partition(";")
        m = NAME.match(spec)
        if m is None or normalize(m[1]) in NOT_FROM_PIP:
            continue
        extra = EXTRA.search(marker)
        if extra is not None:
            if normalize(extra[1]) not in {normalize(e) for e in extras}:
                continue
            # the extra's own marker is satisfied by asking for it: keep the rest of the marker
            marker = re.sub(r"\s*(and\s*)?" + EXTRA.pattern + r"(\s*and)?", "", marker).strip()
        out.append(f"{spec.strip()}; {marker.strip()}" if marker.strip() else spec.strip())
    return out


def numpy_floor(reqs: list[str]) -> tuple[int, ...]:
    """The lowest NumPy edgerl's requirements accept (``numpy>=1.24`` -> (1, 24))."""
    for req in reqs:
        m = NAME.match(req)
        if m and normalize(m[1]) == "numpy":
            floor = FLOOR.search(req)
            return release(floor[1]) if floor else ()
    return ()


def pins(have: dict[str, str], floor: tuple[int, ...]) -> list[str]:
    """Constraint lines keeping what is installed; NumPy only if it is at least ``floor``."""
    lines = []
    for name in sorted(have):
        if name not in PINNED and not name.startswith("tensorrt"):
            continue
        version = have[name]
        if name == "numpy" and release(version) < floor:
            continue
        lines.append(f"{name}=={version}")
    if "numpy" not in [line.split("==")[0] for line in lines]:
        wanted = ".".join(map(str, floor))
        lines.append(f"numpy>={wanted},<2" if floor else "numpy<2")
    return lines


def pip(args: list[str], dry_run: bool) -> None:
    """Run ``python -m pip ARGS``; raises SystemExit with pip's status if it fails."""
    command = [sys.executable, "-m", "pip", *args]
    print("+ " + shlex.join(command), flush=True)
    if dry_run:
        return
    code = subprocess.run(command).returncode
    if code != 0:
        raise SystemExit(code)


def check_torch(version: str | None) -> None:
    """Refuse a missing or too old torch in one sentence (raises SystemExit)."""
    if version is None:
        raise SystemExit(
            "edgerl-install: error: no PyTorch here: install NVIDIA's PyTorch wheel for your "
            "JetPack first (see docs/install.md), then run this again"
        )
    importlib.invalidate_caches()  # edgerl was installed after this process started
    from edgerl.hw.versions import PlatformError
    from edgerl.hw.versions import check_torch as check

    try:
        check(version)
    except PlatformError as e:
        raise SystemExit(f"edgerl-install: error: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a checkout of edgerl, or its wheel")
    parser.add_argument("--extras", default="jetson", help="comma-separated (default: jetson)")
    parser.add_argument("--constraints", type=Path, help="where to keep the pins (kept after)")
    parser.add_argument("--quiet", action="store_true", help="pip --quiet")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = parser.parse_args(argv)
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    quiet = ["--quiet"] if args.quiet else []

    have = installed()
    pip(["install", *quiet, "--no-deps", args.source], args.dry_run)
    if args.dry_run:
        say(f"then edgerl's requirements ({', '.join(['core', *extras])}) with JetPack's pins")
        return 0
    check_torch(have.get("torch"))
    reqs = requirements(extras)
    pinned = pins(have, numpy_floor(reqs))
    kept = ", ".join(p for p in pinned if "==" in p)
    say(f"keeping {kept}")
    if "numpy" in have and not any(p.startswith("numpy==") for p in pinned):
        say(
            f"NumPy {have['numpy']} is older than edgerl needs: a NumPy 1.x is installed beside "
            "edgerl (NVIDIA's JetPack torch is built against NumPy 1.x)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        constraints = args.constraints or Path(tmp) / "constraints.txt"
        constraints.parent.mkdir(parents=True, exist_ok=True)
        constraints.write_text("\n".join(pinned) + "\n")
        wanted = Path(tmp) / "requirements.txt"
        wanted.write_text("\n".join(reqs) + "\n")
        pip(["install", *quiet, "-c", str(constraints), "-r", str(wanted)], dry_run=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
