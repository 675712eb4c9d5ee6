"""``edgerl serve`` reads a run the way its trainer writes it, against the real server process
over a real CartPole run and hostile copies of it: a file that is a link to another account's
private run, a run directory that is a link, one that every account may write in, and (as root)
another account's run holding a hard link to root's file. What a link or a planted file leads
to never reaches the page or /metrics; another account's own run is shown as it is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import edgerl_cmd
from .test_serve import SLOW, child_env, request, start_server, stop_server, wait_for

pytest.importorskip("aiohttp", reason="the web extra is not installed")

SECRET_GAME = "SecretGame-v9"  # what only the other account's private run says
SECRET_RETURN = "98765.5"
SECRET_CHECKPOINT = "ckpt-987654-step4242.ckpt"
LINKED = ("status.json", "config.toml", "eval.csv", "metrics.csv", "episodes.csv", "load.csv")
OTHER_UID = 65534


@dataclass
class Runs:
    root: Path  # what the server serves
    url: str
    token: str
    log: Path

    def get(self, path: str) -> tuple[int, bytes]:
        return request(self.url, path, token=self.token)

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)


def secret_run(cartpole: Path, into: Path) -> None:
    """Another account's private run (0700): a copy of the CartPole run whose every file says
    what no one else may read."""
    shutil.copytree(cartpole, into, ignore=shutil.ignore_patterns("checkpoints", "replay"))
    for name in ("status.json", "config.toml"):
        path = into / name
        path.write_text(path.read_text().replace("CartPole-v1", SECRET_GAME))
    header = (into / "eval.csv").read_text().splitlines()[0].split(",")
    row = ["1"] * len(header)
    row[header.index("step")], row[header.index("return_mean")] = "1100", SECRET_RETURN
    with (into / "eval.csv").open("a") as f:
        f.write(",".join(row) + "\n")
    (into / "checkpoints").mkdir()
    (into / "checkpoints" / SECRET_CHECKPOINT).write_bytes(b"")
    into.chmod(0o700)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    top = tmp_path_factory.mktemp("hostile")
    root = top / "runs"
    root.mkdir()
    cartpole = root / "CartPole-v1"
    args = ["--env", "CartPole-v1", "--steps", "1200", "--run-dir", cartpole, "--quiet"]
    args += ["--set", "agent.learning_starts=200", "--set", "eval.every_steps=300"]
    done = subprocess.run(
        edgerl_cmd("train", *args, "--set", "eval.episodes=1"),
        capture_output=True, text=True, env=child_env(top), cwd=top, timeout=10 * SLOW,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    secret = top / "private" / "secret"
    secret.parent.mkdir(mode=0o700)
    secret_run(cartpole, secret)
    # A run whose files are links to the secret run's, its checkpoints folder too.
    linked = root / "linked"
    shutil.copytree(cartpole, linked, ignore=shutil.ignore_patterns("checkpoints", "replay"))
    for name in (*LINKED, "checkpoints"):
        if (linked / name).exists():
            (linked / name).unlink()
        (linked / name).symlink_to(secret / name)
    (root / "alias").symlink_to(secret)  # a run directory that is itself a link
    shared = root / "shared"  # a run every account may write in: anyone's links could be there
    shutil.copytree(secret, shared)
    shared.chmod(0o777)
    if os.geteuid() == 0:
        # Another account's run holding hard links to root's private files (where the system
        # lets one be made: fs.protected_hardlinks=0), and another account's own run.
        planted = root / "planted"
        shutil.copytree(cartpole, planted, ignore=shutil.ignore_patterns("checkpoints", "replay"))
        for name in ("status.json", "config.toml", "eval.csv"):
            (planted / name).unlink()
            os.link(secret / name, planted / name)
        theirs = root / "theirs"
        shutil.copytree(cartpole, theirs, ignore=shutil.ignore_patterns("checkpoints", "replay"))
        for folder in (planted, theirs):
            os.chown(folder, OTHER_UID, OTHER_UID)
            for path in folder.iterdir():
                if path.stat().st_uid != 0 or path.stat().st_nlink == 1:
                    os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    logs = set(root.glob("serve-*.log"))
    proc, url, token = start_server(root)
    try:
        assert token is not None
        (log,) = set(root.glob("serve-*.log")) - logs
        yield Runs(root, url, token, log)
    finally:
        assert stop_server(proc) == 0


def shows_secret(text: str | bytes) -> bool:
    text = text.decode() if isinstance(text, bytes) else text
    return SECRET_GAME in text or SECRET_RETURN in text or "987654" in text


def test_a_run_directory_that_is_a_link_or_others_may_write_in_is_left_out(runs):
    """A link in a run directory's place can lead anywhere (another account's private run);
    a directory every account may write in may hold anyone's links. Neither is shown: the
    trainer would train in neither. The server's log says why, once."""
    listed = {r["id"] for r in runs.json("/api/runs")["runs"]}
    assert "CartPole-v1" in listed and "linked" in listed
    assert not listed & {"alias", "shared"}, listed
    for run in ("alias", "shared"):
        assert runs.get(f"/api/runs/{run}/summary")[0] == 404
        assert runs.get(f"/api/runs/{run}/curves")[0] == 404
    status, body = runs.get("/metrics")
    assert status == 200 and b'run="alias"' not in body and b'run="shared"' not in body
    assert not shows_secret(body), body.decode()[-2000:]
    log = runs.log.read_text()
    assert "leaving out the run in" in log and "symbolic link" in log
    assert "may write in it (mode 0777)" in log
    assert log.count(str(runs.root / "alias")) == 1  # once, however often it scans


def test_a_link_in_a_run_files_place_is_not_read(runs):
    """Each file of the run is a link to another account's private run: none is read, and the
    page says so instead of showing what they lead to."""
    summary = runs.json("/api/runs/linked/summary")
    assert summary["status"] is None and "symbolic link" in summary["problem"], summary
    assert summary["env"] is None and summary["learner"] is None
    assert summary["checkpoint"] is None and summary["best_eval"] is None
    assert not shows_secret(json.dumps(summary)), summary
    curves = runs.json("/api/runs/linked/curves")
    assert "symbolic link" in (curves["problem"] or ""), curves
    assert not shows_secret(json.dumps(curves))
    load = runs.json("/api/runs/linked/load")
    assert load["t"] == []
    status, body = runs.get("/metrics")
    assert status == 200 and not shows_secret(body), body.decode()[-2000:]
    assert b'edgerl_status_readable{run="linked"} 0.0' in body
    assert b'edgerl_eval_return_best{run="linked"}' not in body
    # the run beside it, whose files are its own, is shown as before
    real = runs.json("/api/runs/CartPole-v1/summary")
    assert real["env"] == "CartPole-v1" and real["checkpoint"] and real["best_eval"]


def test_another_accounts_file_in_a_run_is_not_read_but_its_own_run_is(runs):
    """As root, serve reads every account's runs (the service's user reads the edgerl user's;
    root watches its users'), each as its owner wrote it: a file in a run that is not the run
    owner's (here a hard link to root's private file) is not read, while the account's own
    run is shown."""
    if os.geteuid() != 0:
        pytest.skip("making files of other accounts needs root")
    listed = {r["id"] for r in runs.json("/api/runs")["runs"]}
    assert {"planted", "theirs"} <= listed, listed
    planted = runs.json("/api/runs/planted/summary")
    assert planted["status"] is None and "belongs to root" in planted["problem"], planted
    assert planted["env"] is None and planted["best_eval"] is None
    assert not shows_secret(json.dumps(planted))
    theirs = runs.json("/api/runs/theirs/summary")
    assert theirs["problem"] is None and theirs["env"] == "CartPole-v1", theirs
    assert theirs["status"]["step"] == 1200
    status, body = runs.get("/metrics")
    assert status == 200 and not shows_secret(body)
    assert b'edgerl_env_steps_total{run="theirs"} 1200.0' in body


def test_a_run_changed_into_a_link_under_the_server_is_not_followed(runs):
    """The run was listed and read; then its directory is swapped for a link to the private
    run. Reading it again (its files changed) reads nothing through the link."""
    moving = runs.root / "moving"
    shutil.copytree(runs.root / "CartPole-v1", moving, ignore=shutil.ignore_patterns("replay"))
    try:
        wait_for(lambda: runs.get("/api/runs/moving/summary")[0] == 200, "the run listed")
        assert runs.json("/api/runs/moving/summary")["env"] == "CartPole-v1"
        aside = runs.root.parent / "moving-aside"
        moving.rename(aside)
        moving.symlink_to(runs.root.parent / "private" / "secret")
        status, body = runs.get("/api/runs/moving/summary")
        assert not shows_secret(body), body
        if status == 200:  # still listed until the next scan: its files are not read
            assert "symbolic link" in json.loads(body)["problem"]
        curves = runs.get("/api/runs/moving/curves")[1]
        assert not shows_secret(curves)
    finally:
        if moving.is_symlink():
            moving.unlink()
