"""Installing. On a desktop or laptop: the Makefile (`make -n`: what it would install). On a
Jetson: scripts/jetpack_pip.py (used by scripts/install.sh and
docker/Dockerfile.jetson) with pip's real resolver, against the torch, TensorRT and NumPy that
each JetPack ships, faked as installed distributions the way a --system-site-packages venv sees
them.

Offline: edgerl's own wheel is built from this checkout, and every other requirement is a
stand-in wheel carrying the real metadata (name, version, requirements, Python range) of the
distribution installed in the test environment; pip runs with --no-index and --find-links.
Python is this one (JetPack 6 has 3.10 and JetPack 7 3.12): the resolver's problem is the
version strings, not the interpreter.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "jetpack_pip.py"


@dataclass(frozen=True)
class JetPack:
    """What a JetPack release puts in the system's site-packages (None: not installed)."""

    torch: str
    tensorrt: str
    numpy: str | None


# Version strings as NVIDIA and Ubuntu ship them:
# - torch: NVIDIA's "PyTorch for Jetson Platform" release notes and wheel index
#   (developer.download.nvidia.com/compute/redist/jp/): JetPack 6.0 jp/v60/pytorch/
#   torch-2.3.0a0+40ec155e58.nv24.03-cp310-cp310-linux_aarch64.whl (jp/v60dp has the same build
#   as ...nv24.03.13384722); JetPack 6.1 and 6.2 jp/v61/pytorch/
#   torch-2.5.0a0+872d972e41.nv24.08.17622132-cp310-cp310-linux_aarch64.whl; JetPack 7 (Thor,
#   CUDA 13) NGC's PyTorch 25.08 container, 2.8.0a0+34c6371d24.nv25.08, or PyTorch's own CUDA 13
#   aarch64 wheels (download.pytorch.org/whl/cu130, Thor being an SBSA machine), e.g. 2.9.1+cu130.
# - tensorrt: the python3-libnvinfer package of each JetPack: 8.6.2 (JetPack 6.0, TensorRT
#   8.6.2.3), 10.3.0 (6.1/6.2: /usr/lib/python3.10/dist-packages/tensorrt-10.3.0.dist-info),
#   10.13.3 (7.0, JetPack 7.0 release notes).
# - numpy: Ubuntu 22.04's python3-numpy 1:1.21.5 (JetPack 6, pulled in by OpenCV's bindings);
#   NVIDIA's PyTorch-for-Jetson install guide runs pip install numpy=='1.26.1' before torch;
#   Ubuntu 24.04's python3-numpy 1:1.26.4 (JetPack 7, also NGC 25.08's).
JETPACKS = {
    "6.0-ubuntu-numpy": JetPack("2.3.0a0+40ec155e58.nv24.03", "8.6.2", "1.21.5"),
    "6.1-nvidia-guide-numpy": JetPack("2.5.0a0+872d972e41.nv24.08.17622132", "10.3.0", "1.26.1"),
    "7-ngc": JetPack("2.8.0a0+34c6371d24.nv25.08", "10.13.3", "1.26.4"),
    "7-pytorch-cu130-no-numpy": JetPack("2.9.1+cu130", "10.13.3", None),
}

# Stand-ins for distributions the test environment does not have: jetson-stats (the jetson
# extra; an sdist on PyPI) with its requirements as released (jetson_stats-7.2.2 PKG-INFO), and
# the NumPy releases PyPI offers beside the test environment's own.
EXTRA_STANDINS = [
    ("jetson-stats", "7.2.2", ["smbus2", "distro", "nvidia-ml-py>=13.595.45"], ">=3.7"),
    ("smbus2", "0.5.0", [], None),
    ("distro", "1.9.0", [], ">=3.6"),
    ("numpy", "1.26.4", [], ">=3.9"),
    ("numpy", "2.4.6", [], ">=3.11"),
]


def pip_env(wheelhouse: Path) -> dict[str, str]:
    """The environment for pip: no config files, no index, only ``wheelhouse``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheelhouse),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        PYTHONNOUSERSITE="1",
    )
    env.pop("PYTHONPATH", None)
    return env


def write_wheel(
    wheelhouse: Path, name: str, version: str, requires: list[str], python: str | None
) -> None:
    """A wheel with no code and the metadata pip resolves with."""
    dist = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Python: {python}"] if python else []
    meta += [f"Requires-Dist: {r}" for r in requires]
    wheel = (
        "Wheel-Version: 1.0\nGenerator: edgerl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    info = f"{dist}.dist-info"
    with zipfile.ZipFile(wheelhouse / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{info}/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{info}/WHEEL", wheel)
        z.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


def closure(requires: list[str], extras: set[str]) -> dict[str, md.Distribution]:
    """The distributions that ``requires`` (with ``extras``) need on this Python, as installed
    here, without torch and numpy (JetPack's, or stand-ins)."""
    found: dict[str, md.Distribution] = {}
    todo = [(r, extras) for r in requires]
    while todo:
        line, wanted = todo.pop()
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
            continue
        if name in found or name in ("torch", "numpy", "edgerl"):
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # a stand-in from EXTRA_STANDINS
        found[name] = dist
        todo += [(r, set(req.extras)) for r in dist.requires or []]
    return found


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """edgerl's wheel built from this checkout, and stand-ins for everything it needs."""
    base = tmp_path_factory.mktemp("install")
    house = base / "wheels"
    house.mkdir()
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "edgerl", src / "edgerl", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            house,
            src,
        ],
        capture_output=True,
        text=True,
        env=pip_env(house),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    wanted = (md.requires("edgerl") or []) + [r for s in EXTRA_STANDINS for r in s[2]]
    for dist in closure(wanted, {"jetson"}).values():
        meta = dist.metadata
        requires = [r for r in dist.requires or [] if "extra ==" not in r]
        write_wheel(house, meta["Name"], dist.version, requires, meta.get("Requires-Python"))
    for name, version, requires, python in EXTRA_STANDINS:
        write_wheel(house, name, version, requires, python)
    return house


@pytest.fixture(scope="module")
def template_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip and nothing else, copied by each case (making one takes seconds)."""
    venv = tmp_path_factory.mktemp("template") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return venv


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def fake_system_site(root: Path, jetpack: JetPack) -> Path:
    """JetPack's packages as installed distributions (metadata only: pip never imports them)."""
    site = root / "dist-packages"
    for name, version in (("torch", jetpack.torch), ("tensorrt", jetpack.tensorrt)) + (
        (("numpy", jetpack.numpy),) if jetpack.numpy else ()
    ):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("debian\n")
    return site


def jetson_venv(template: Path, root: Path, jetpack: JetPack) -> Path:
    """A venv that sees JetPack's packages after its own, as --system-site-packages does."""
    venv = root / "venv"
    shutil.copytree(template, venv, symlinks=True)
    system = fake_system_site(root, jetpack)
    (site_packages(venv) / "zz-jetpack-system-site.pth").write_text(f"{system}\n")
    return venv


def own(venv: Path) -> dict[str, str]:
    """Distributions installed in the venv itself (not the system's): name -> version."""
    out = {}
    for info in site_packages(venv).glob("*.dist-info"):
        name, version = info.name[: -len(".dist-info")].rsplit("-", 1)
        out[canonicalize_name(name)] = version
    return out


def version_seen(venv: Path, name: str) -> str:
    r = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({name!r}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip()


@pytest.mark.parametrize("jetpack", JETPACKS.values(), ids=JETPACKS.keys())
def test_jetpack_install_keeps_its_torch_tensorrt_and_numpy(
    jetpack: JetPack, wheelhouse: Path, template_venv: Path, tmp_path: Path
):
    venv = jetson_venv(template_venv, tmp_path, jetpack)
    wheel = next(wheelhouse.glob("edgerl-*.whl"))
    pins = tmp_path / "constraints.txt"
    r = subprocess.run(
        [str(venv / "bin" / "python"), str(SCRIPT), "--constraints", str(pins), str(wheel)],
        capture_output=True,
        text=True,
        env=pip_env(wheelhouse),
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"torch=={jetpack.torch}" in pins.read_text()
    assert f"tensorrt=={jetpack.tensorrt}" in pins.read_text()

    mine = own(venv)
    assert "torch" not in mine and "tensorrt" not in mine, mine  # JetPack's, untouched
    assert {"edgerl", "gymnasium", "ale-py", "click", "rich", "jetson-stats"} <= mine.keys()
    assert version_seen(venv, "torch") == jetpack.torch
    numpy = version_seen(venv, "numpy")
    if jetpack.numpy and Version(jetpack.numpy) >= Version("1.24"):  # new enough: JetPack's is used
        assert "numpy" not in mine and numpy == jetpack.numpy
    else:  # too old or missing: a NumPy 1.x of the venv's own, never 2.x
        assert mine.get("numpy") == numpy == "1.26.4", r.stdout
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check"],
        capture_output=True,
        text=True,
        env=pip_env(wheelhouse),
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_jetpack_install_refuses_a_torch_older_than_supported(
    wheelhouse: Path, template_venv: Path, tmp_path: Path
):
    # JetPack 6.0 Developer Preview's torch (NVIDIA's release notes: 2.2.0a0+81ea7a4, 24.01)
    venv = jetson_venv(template_venv, tmp_path, JetPack("2.2.0a0+81ea7a4.nv24.01", "8.6.2", None))
    wheel = next(wheelhouse.glob("edgerl-*.whl"))
    r = subprocess.run(
        [str(venv / "bin" / "python"), str(SCRIPT), str(wheel)],
        capture_output=True,
        text=True,
        env=pip_env(wheelhouse),
        timeout=600,
    )
    assert r.returncode != 0
    assert "edgerl needs PyTorch 2.3 or newer" in r.stderr and "2.2.0a0+81ea7a4" in r.stderr
    assert "Traceback" not in r.stderr
    assert "gymnasium" not in own(venv)  # stopped before the dependencies


def test_dockerfile_and_install_script_install_the_same_way(tmp_path: Path):
    """Both run scripts/jetpack_pip.py, the step the tests above exercise (there is no docker
    engine here to build the image)."""
    dockerfile = (REPO / "docker" / "Dockerfile.jetson").read_text()
    assert "COPY scripts/jetpack_pip.py ./scripts/" in dockerfile
    runs = [line for line in dockerfile.splitlines() if "pip" in line and line.startswith("RUN")]
    assert runs == [
        "RUN python3 scripts/jetpack_pip.py --constraints /opt/edgerl/constraints.txt"
        " --extras jetson,web . \\"
    ]
    # the rest of the image's pip use would bypass the pins
    assert "pip install" not in dockerfile

    board = REPO / "tests" / "fixtures" / "boards" / "nano_jp4"
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), "--prefix", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "EDGERL_HW_ROOT": str(board)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "opt" / "edgerl" / "venv"
    # and the web extra, for the unit of edgerl serve the script installs beside the trainer's
    assert (
        f"+ {venv}/bin/python {SCRIPT} --quiet --constraints {tmp_path}/opt/edgerl/constraints.txt"
        f" --extras jetson,web {REPO}" in r.stdout
    )
    assert "pip install" not in r.stdout  # nothing else installs with pip on a Jetson


def test_off_a_jetson_the_install_script_chooses_torchs_build_as_make_run_does(tmp_path: Path):
    """A PC's service venv gets PyTorch from scripts/install_torch.sh (the CPU build where no
    NVIDIA GPU is here), before edgerl, and pip shows its progress (it was PyPI's CUDA build,
    several GB, with --quiet)."""
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "install.sh"), "--prefix", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "EDGERL_HW_ROOT": str(tmp_path / "no-board")},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "opt" / "edgerl" / "venv"
    lines = r.stdout.splitlines()
    torch = f"+ bash {REPO}/scripts/install_torch.sh {venv}/bin torch auto"
    edgerl = f"+ {venv}/bin/pip install {REPO}[web]"
    assert torch in lines and edgerl in lines
    assert lines.index(torch) < lines.index(edgerl)
    assert not any("pip install --quiet" in line for line in lines)


# -- a desktop or laptop: the Makefile ---------------------------------------------------------

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def make_dry_run(*args: str) -> list[str]:
    """The commands ``make -n ARGS`` would run here (nothing is installed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Under `make test` the environment says this make is a sub-make, which then prints
    # "Entering/Leaving directory" lines: the commands are read as a top-level make prints them.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    r = subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return r.stdout.splitlines()


def pip_installs(lines: list[str]) -> list[str]:
    return [
        " ".join(x.split()) for x in lines if "/bin/pip install" in x and "upgrade pip" not in x
    ]


def test_make_run_installs_what_running_needs_and_shows_it(tmp_path):
    """Not the test extras (ONNX Runtime, pygame, ffmpeg: 0.36 GB), and no -q on the large
    installs: a first `make run` on a laptop shows what it fetches. PyTorch's build is chosen
    by scripts/install_torch.sh before it is downloaded (tested below)."""
    venv = tmp_path / "venv"
    lines = make_dry_run("run", f"VENV={venv}")
    assert f'bash scripts/install_torch.sh {venv}/bin "torch==2.13.0" "auto"' in lines
    assert pip_installs(lines) == [f'{venv}/bin/pip install -e ".[plot]"']
    assert lines[-1].rstrip() == f"{venv}/bin/edgerl train --quick"


def test_make_test_adds_the_test_extras_and_takes_torch_from_the_index_given(tmp_path):
    venv = tmp_path / "venv"
    lines = make_dry_run("test", f"VENV={venv}", f"TORCH_INDEX={CPU_INDEX}")
    assert f'bash scripts/install_torch.sh {venv}/bin "torch==2.13.0" "{CPU_INDEX}"' in lines
    assert pip_installs(lines) == [f'{venv}/bin/pip install -e ".[test,plot]"']
    assert f"{venv}/bin/pytest -q --durations=25" in [x.rstrip() for x in lines]
    # ARGS goes to pytest: one module while working (the README's test line says so)
    lines = make_dry_run("test", f"VENV={venv}", "ARGS=tests/test_seeds.py -x")
    assert f"{venv}/bin/pytest -q --durations=25 tests/test_seeds.py -x" in lines


def test_the_readme_says_how_large_make_run_is_and_how_to_get_the_cpu_build():
    readme = (REPO / "README.md").read_text()
    makefile = " ".join(line.lstrip("# ") for line in (REPO / "Makefile").read_text().splitlines())
    size = re.search(r"about (\d+ MB) to download, ([\d.]+ GB) in \.venv", makefile)
    assert size is not None
    assert all(figure in " ".join(readme.split()) for figure in size.groups())
    assert f"TORCH_INDEX={CPU_INDEX}" in readme


# -- which PyTorch build: scripts/install_torch.sh with a stand-in pip ---------------------------

FAKE_PIP = """#!/bin/sh
# pip as the install script calls it: each call logged; a dry run reports what it would install
echo "$*" >> "$PIP_LOG"
case "$*" in *--dry-run*) ;; *) exit 0 ;; esac
[ -n "$FAKE_RESOLVE_FAILS" ] && exit 1
report=$(echo "$*" | sed 's/.*--report \\([^ ]*\\).*/\\1/')
names='{"metadata": {"name": "torch"}}'
[ -n "$FAKE_CUDA" ] && names="$names"', {"metadata": {"name": "nvidia-cublas-cu12"}}'
echo "{\\"install\\": [$names]}" > "$report"
"""


def install_torch(tmp_path, *, cuda_build: bool, gpu: bool, index: str = "auto", fails=False):
    """scripts/install_torch.sh against a stand-in pip; returns (pip's calls, what it said)."""
    bin_dir = tmp_path / "venv-bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pip").write_text(FAKE_PIP)
    (bin_dir / "pip").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    board = tmp_path / "hw"
    if gpu:
        (board / "proc/driver/nvidia").mkdir(parents=True)
        (board / "proc/driver/nvidia/version").write_text("NVRM version: 580.65\n")
    log = tmp_path / "pip.log"
    env = {
        "PATH": "/usr/bin:/bin",  # no nvidia-smi
        "PIP_LOG": str(log),
        "EDGERL_HW_ROOT": str(board),
        **({"FAKE_CUDA": "1"} if cuda_build else {}),
        **({"FAKE_RESOLVE_FAILS": "1"} if fails else {}),
    }
    script = REPO / "scripts" / "install_torch.sh"
    r = subprocess.run(
        ["bash", str(script), str(bin_dir), "torch==2.13.0", index],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines(), r.stdout


def test_without_a_gpu_the_cuda_build_pip_would_fetch_is_swapped_for_the_cpu_build(tmp_path):
    """Plain `make run` on a laptop fetched PyPI's CUDA build (several GB) it cannot use; the
    choice is made before the download (issue 59): the resolution, then PyTorch's CPU index."""
    calls, said = install_torch(tmp_path, cuda_build=True, gpu=False)
    assert calls[0].startswith("install --dry-run --quiet --report ")
    assert calls[1:] == [f"install --index-url {CPU_INDEX} torch==2.13.0"]
    assert "no NVIDIA GPU here: PyTorch's CPU build" in said and "190 MB" in said


@pytest.mark.parametrize(
    ("cuda_build", "gpu", "says"),
    [
        (True, True, "the CUDA build, several GB, for this machine's NVIDIA GPU"),
        (False, False, "as pip finds it"),  # a CPU wheel pip is configured to find (CI)
    ],
)
def test_what_pip_resolves_is_installed_where_it_fits_the_machine(tmp_path, cuda_build, gpu, says):
    calls, said = install_torch(tmp_path, cuda_build=cuda_build, gpu=gpu)
    assert calls[1:] == ["install torch==2.13.0"] and says in said


def test_an_index_given_is_used_as_asked_and_a_failed_resolution_installs_as_pip_does(tmp_path):
    calls, said = install_torch(tmp_path / "a", cuda_build=True, gpu=False, index=CPU_INDEX)
    assert calls == [f"install --index-url {CPU_INDEX} torch==2.13.0"] and CPU_INDEX in said
    calls, _ = install_torch(tmp_path / "b", cuda_build=True, gpu=False, fails=True)
    assert calls[1:] == ["install torch==2.13.0"]  # pip's own error, as before
