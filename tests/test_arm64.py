"""edgerl on a Jetson's CPU architecture: scripts/arm64_check.sh in a Debian arm64 userland under
qemu-user-static, with an AGX Orin's captured files as the board.

Every instruction is emulated, so it takes about 20 minutes on two cores: outside
`make test`. Run it as root with EDGERL_ARM64=1 (and optionally EDGERL_ARM64_ROOT, the arm64 root
to keep between runs, and EDGERL_ARM64_JETPACK, 6.0 or 6.1); docs/install.md says what it
showed.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "arm64_check.sh"
QEMU = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")  # qemu-user-static's
LABELS = {"6.0": "2.3.0a0+40ec155e58.nv24.03", "6.1": "2.5.0a0+872d972e41.nv24.08"}
STEPS = ["install", "onnx-extra", "doctor", "cartpole", "pong", "export", "play", "play-pong"]


def test_the_help_says_what_it_needs_and_a_wrong_option_is_one_sentence():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    assert "qemu-user-static" in r.stdout and "JetPack" in r.stdout and "set -e" not in r.stdout
    r = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == (
        "arm64_check: error: unknown option --bogus (see --help)"
    )
    r = subprocess.run(["bash", str(SCRIPT), "--jetpack", "5.1"], capture_output=True, text=True)
    assert r.returncode == 2 and "--jetpack 5.1: give 6.0 or 6.1" in r.stderr


def check(*args: str) -> subprocess.CompletedProcess:
    """The script with ``args`` and a board that does not exist: it stops at its checks."""
    return subprocess.run(
        ["bash", str(SCRIPT), "--board", "no_such_board", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "SUDO_UID"},
    )


def test_a_board_name_is_a_folder_of_the_fixtures_not_a_path():
    for board in ("../..", "a/b", ".hidden"):
        r = subprocess.run(
            ["bash", str(SCRIPT), "--board", board], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 2, (board, r.stderr)
        assert "give the name of a folder in tests/fixtures/boards" in r.stderr
    r = subprocess.run(["bash", str(SCRIPT), "--board", ""], capture_output=True, text=True)
    assert (
        r.returncode == 2 and r.stderr == "arm64_check: error: --board needs a value (see --help)\n"
    )


def test_a_root_or_log_folder_given_as_a_link_is_refused_not_followed(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    r = check("--root", str(tmp_path / "link"))
    assert r.returncode == 2 and "the arm64 root" in r.stderr and "is a symbolic link" in r.stderr
    r = check("--root", str(tmp_path / "fine"), "--out", str(tmp_path / "link"))
    assert r.returncode == 2 and "(--out)" in r.stderr and "is a symbolic link" in r.stderr
    assert list(target.iterdir()) == []  # nothing written through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="the owner checks are root's: run as root")
def test_an_arm64_root_another_user_could_have_planted_or_can_change_is_refused(tmp_path):
    """As root: a root in a folder others write (not sticky), one owned by another user, one
    others may write, are refused before anything runs in or is copied to them."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    r = check("--root", str(open_dir / "root"))
    assert r.returncode == 2 and "which other users can write" in r.stderr, r.stderr
    planted = tmp_path / "planted"
    (planted / "etc").mkdir(parents=True)
    (planted / "etc" / "debian_version").write_text("12.0\n")
    os.chown(planted, 65534, 65534)  # nobody's
    r = check("--root", str(planted))
    assert r.returncode == 2 and "is not owned by root" in r.stderr, r.stderr
    os.chown(planted, 0, 0)
    planted.chmod(0o777)
    r = check("--root", str(planted))
    assert r.returncode == 2 and "can be written by other users" in r.stderr, r.stderr
    # A tidy one passes these checks: the run stops at the next (the missing board, or a
    # missing tool), with nothing made.
    planted.chmod(0o755)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: allowed above a folder root made
    r = check("--root", str(planted), "--out", str(sticky / "out"))
    assert r.returncode == 1 and "other users" not in r.stderr and "root's" not in r.stderr
    assert not (sticky / "out").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("EDGERL_ARM64") != "1", reason="emulated arm64 run: set EDGERL_ARM64=1"
)
def test_install_doctor_train_export_and_play_on_emulated_arm64(tmp_path):
    if os.geteuid() != 0 or not shutil.which("debootstrap") or not QEMU.exists():
        pytest.skip("needs root, debootstrap and qemu-user-static")
    jetpack = os.environ.get("EDGERL_ARM64_JETPACK", "6.1")
    # the script's own default root (kept between runs), not a temporary folder of pytest's
    root = os.environ.get("EDGERL_ARM64_ROOT", f"/var/lib/edgerl-arm64/jp{jetpack}")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--jetpack", jetpack, "--root", root, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so that a timeout ends the emulated edgerl too, not only bash
    )
    try:
        _, err = proc.communicate(timeout=4 * 3600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    with (out / "steps.tsv").open() as f:
        done = {row["step"]: int(row["status"]) for row in csv.DictReader(f, delimiter="\t")}
    assert all(done.get(step) == 0 for step in STEPS), done
    assert (out / "platform.txt").read_text().startswith("aarch64 ")
    doctor = (out / "doctor.log").read_text()
    assert "AGX Orin" in doctor and LABELS[jetpack] in doctor
    assert f"(JetPack {jetpack}" in doctor  # the L4T release of that JetPack
    assert "Jetson (" in (out / "install.log").read_text()  # the Jetson path: JetPack's torch kept
    assert played(out / "play.log")["episodes"] == 3
    assert played(out / "play-pong.log")["env"] == "ALE/Pong-v5"


def played(log: Path) -> dict:
    """The JSON document ``play --json`` printed: its own line among the log's others."""
    (line,) = [ln for ln in log.read_text().splitlines() if ln.startswith("{")]
    return json.loads(line)
