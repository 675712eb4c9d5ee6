"""A run directory nobody else can steer: edgerl trains only in a folder that is its user's alone,
follows no link planted in it, and keeps what export and plot write there as private as the run.

Each case is one a second local account could set up (reproduced here as root, who follows
links as readily as anyone): a link where the lock, a CSV, checkpoints/ or export/ goes, a run
folder another account owns or may write in, a folder above it that others can change.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from edgerl.files.sidefiles import AppendFile, SideFiles

CARTPOLE = ["--env", "CartPole-v1", "--set", "agent.hidden=[16,16]", "--quiet"]
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="another account's folder needs root")
NOBODY = 65534


def victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    """A file of someone's, 32 bytes, that nothing may change."""
    f = tmp_path / name
    f.write_bytes(b"0123456789abcdef0123456789abcdef")
    return f


def snapshot(path: Path) -> tuple[int, int, int, float, tuple[str, ...]]:
    """What a folder or file is now: mode, owner, size, time, names in it."""
    st = path.stat()
    names = tuple(sorted(p.name for p in path.iterdir())) if path.is_dir() else ()
    return st.st_mode, st.st_uid, st.st_size, st.st_mtime, names


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A small CartPole run with its checkpoints, copied by each test that changes it."""
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("trust") / "cp"
    assert main(["train", *CARTPOLE, "--steps", "300", "--run-dir", str(run)]) == 0
    return run


def copy_run(trained: Path, tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    return run


@pytest.mark.parametrize(
    "name", [".lock", "episodes.csv", "metrics.csv", "config.toml", ".write-test-4242"]
)
def test_a_link_in_a_runs_place_for_a_file_is_refused_and_its_target_untouched(
    cli, tmp_path, trained, name
):
    run = copy_run(trained, tmp_path)
    target = victim(tmp_path)
    (run / name).unlink(missing_ok=True)
    (run / name).symlink_to(target)
    before = snapshot(target)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2 and "Traceback" not in r.err, r.err
    assert f"holds 1 symbolic link ({name})" in r.err and "remove" in r.err, r.err
    errors = [line for line in r.err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("edgerl: error: "), r.err
    assert snapshot(target) == before and target.read_bytes().startswith(b"0123")


def test_a_fresh_lock_link_alone_does_not_make_a_folder_a_run(cli, tmp_path):
    """A `.lock` link is all it took for an empty folder to "hold a run"."""
    run = tmp_path / "new"
    run.mkdir(mode=0o700)
    target = victim(tmp_path)
    (run / ".lock").symlink_to(target)
    r = cli("train", *CARTPOLE, "--steps", "200", "--run-dir", run)
    assert r.code == 2 and "symbolic link" in r.err and ".lock" in r.err, r.err
    assert target.stat().st_size == 32


def test_checkpoints_as_a_link_to_a_shared_folder_is_refused_and_the_folder_left_alone(
    cli, tmp_path, trained
):
    run = copy_run(trained, tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    stale = shared / ".db.tmp-999999"  # named like a killed writer's temporary file
    stale.write_text("someone's database")
    import shutil

    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(shared)
    before = snapshot(shared)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2 and "symbolic link" in r.err and "checkpoints" in r.err, r.err
    assert snapshot(shared) == before and stale.exists()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.parametrize("folder", ["export", "replay", "recordings", "tensorboard"])
def test_a_runs_folder_as_a_link_is_refused(cli, tmp_path, trained, folder):
    run = copy_run(trained, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if (run / folder).exists():
        import shutil

        shutil.rmtree(run / folder)
    (run / folder).symlink_to(elsewhere)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2 and f"({folder})" in r.err, r.err
    assert not list(elsewhere.iterdir())


def test_export_into_a_runs_export_link_is_refused(cli, tmp_path, trained):
    pytest.importorskip("onnxruntime")
    run = copy_run(trained, tmp_path)
    elsewhere = tmp_path / "private"
    elsewhere.mkdir(mode=0o700)
    (run / "export").symlink_to(elsewhere)
    r = cli("export", "--onnx", "--run-dir", run)
    assert r.code == 2 and "symbolic link" in r.err and "-o" in r.err, r.err
    assert "Traceback" not in r.err and not list(elsewhere.iterdir())


def test_a_run_folder_others_may_write_in_is_refused_empty_or_not(cli, tmp_path, trained):
    run = copy_run(trained, tmp_path)
    run.chmod(0o777)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2 and "every account can write in it (mode 0777)" in r.err, r.err
    assert "chmod go-w" in r.err and stat.S_IMODE(run.stat().st_mode) == 0o777
    empty = tmp_path / "empty"
    empty.mkdir()
    empty.chmod(0o1777)  # sticky or not: others could have put names in it first
    r = cli("train", *CARTPOLE, "--steps", "200", "--run-dir", empty)
    assert r.code == 2 and "every account can write in it (mode 1777)" in r.err, r.err
    assert not list(empty.iterdir())


def test_a_folder_above_the_run_that_others_can_change_is_refused(cli, tmp_path):
    above = tmp_path / "open"
    above.mkdir()
    above.chmod(0o777)  # not sticky: anyone could rename the run and put a link in its place
    r = cli("train", *CARTPOLE, "--steps", "200", "--run-dir", above / "deeper" / "run")
    assert r.code == 2 and f"it lies in {above}, which every account can change" in r.err, r.err
    assert not list(above.iterdir())
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: the run in it stays the trainer's own
    assert cli("train", *CARTPOLE, "--steps", "200", "--run-dir", sticky / "run").code == 0


def test_a_run_folder_that_is_a_link_is_refused(cli, tmp_path, trained):
    run = copy_run(trained, tmp_path)
    link = tmp_path / "same-work"
    link.symlink_to(run)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", link)
    assert r.code == 2 and "is a symbolic link" in r.err and str(run) in r.err, r.err


@ROOT_ONLY
def test_another_accounts_run_folder_is_refused(cli, tmp_path, trained):
    """`/tmp/same-work` made by someone else: never trained in, its mode and files as they were,
    and --fresh does not move it aside."""
    run = copy_run(trained, tmp_path)
    for p in [run, *run.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)
    before = snapshot(run)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2 and "it belongs to nobody, not to root" in r.err, r.err
    assert snapshot(run) == before
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run, "--fresh")
    assert r.code == 2 and "belongs to nobody" in r.err and run.is_dir(), r.err
    above = tmp_path / "theirs"
    above.mkdir(mode=0o755)
    os.chown(above, NOBODY, NOBODY)
    r = cli("train", *CARTPOLE, "--steps", "200", "--run-dir", above / "run")
    assert r.code == 2 and f"it lies in {above}, which belongs to nobody" in r.err, r.err


def test_a_side_file_never_writes_through_a_link(tmp_path):
    target = victim(tmp_path)
    link = tmp_path / "episodes.csv"
    link.symlink_to(target)
    side = SideFiles()
    rows = AppendFile(link, side, header="a,b\n")
    assert rows.append("1,2\n") is False
    rows.close()
    assert target.stat().st_size == 32
    assert side.problems() == [
        "cannot write episodes.csv (a symbolic link is in its place, which edgerl does not follow)"
    ]


def test_export_and_plot_keep_the_runs_modes_whatever_the_umask(cli, tmp_path, trained):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("matplotlib")
    run = copy_run(trained, tmp_path)
    old = os.umask(0)
    try:
        assert cli("export", "--onnx", "--run-dir", run).code == 0
        assert cli("plot", "--run-dir", run).code == 0
    finally:
        os.umask(old)
    made = [run / "export", *(run / "export").iterdir(), run / "curve.png"]
    assert len(made) >= 3
    for p in made:
        assert stat.S_IMODE(p.stat().st_mode) & 0o007 == 0, (p, oct(p.stat().st_mode))


def test_dot_as_the_run_dir_trains_in_the_working_folder(cli, tmp_path, monkeypatch):
    run = tmp_path / "here"
    run.mkdir(mode=0o700)
    monkeypatch.chdir(run)
    assert cli("train", *CARTPOLE, "--steps", "200", "--run-dir", ".").code == 0
    assert (run / "config.toml").is_file() and list((run / "checkpoints").iterdir())


def test_fresh_moves_aside_a_run_whose_lock_is_a_link(cli, tmp_path, trained):
    run = copy_run(trained, tmp_path)
    target = victim(tmp_path)
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(target)
    r = cli("train", *CARTPOLE, "--steps", "200", "--run-dir", run, "--fresh")
    assert r.code == 0, r.err
    (aside,) = tmp_path.glob("run.old-*")
    assert (aside / ".lock").is_symlink() and target.stat().st_size == 32


def test_the_trainer_writes_by_the_real_path_not_a_link_on_the_way(tmp_path):
    """A link among the folders above the run, changed once the run is open, redirects
    nothing: every writer names the real path that was checked."""
    from edgerl.report.rundir import RunDir

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    link = tmp_path / "via"
    link.symlink_to(real)
    rundir = RunDir(link / "run")
    rundir.open()
    try:
        link.unlink()
        link.symlink_to(other)  # what another account could do to a link it owns
        assert rundir.path == real / "run" and rundir.checkpoints == real / "run" / "checkpoints"
    finally:
        rundir.close()
    assert not list(other.iterdir())


@ROOT_ONLY
def test_a_runs_folder_of_another_account_is_named_with_the_fix(cli, tmp_path, trained):
    run = copy_run(trained, tmp_path)
    os.chown(run / "checkpoints", NOBODY, NOBODY)
    r = cli("train", *CARTPOLE, "--steps", "600", "--run-dir", run)
    assert r.code == 2, r.err
    assert f"folder {run / 'checkpoints'} of run directory {run} cannot be used" in r.err, r.err
    assert "it belongs to nobody" in r.err and "chmod" not in r.err, r.err
