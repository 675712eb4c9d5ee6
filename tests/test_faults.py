"""Faults a service on a board meets, injected for real: kill -9 mid-write, full disks, files in
the way, file-size limits, too many environments, signals during start-up, other users."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgerl.envs import probe
from edgerl.errors import EnvMemoryError
from edgerl.files.atomic import TEMP_NAME
from edgerl.files.checkpoint import list_checkpoints, load
from edgerl.memories.budget import ATARI_ENV_BYTES, VECTOR_ENV_BYTES, plan_env_memory

from .conftest import PONG_FAST, REPO, edgerl_cmd
from .test_daemon import notify, service_config, start_daemon  # noqa: F401 - notify: a fixture

WAIT_S = 180  # generous: the machine running the tests may be busy


def wait_for(what: str, check: Callable[[], object], proc: subprocess.Popen | None = None) -> None:
    """Poll ``check`` until it is true; fail (saying ``what``) after WAIT_S or if ``proc`` ends."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the trainer ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {WAIT_S} s")
        time.sleep(0.2)


class Trainer:
    """``edgerl train`` as a real process, its stderr in a file read while it runs."""

    def __init__(self, tmp_path: Path, *args: str, preexec: Callable[[], None] | None = None):
        self.log_path = tmp_path / f"train-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            edgerl_cmd("train", *args),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            text=True,
            env=env,
            preexec_fn=preexec,
        )

    @property
    def err(self) -> str:
        return self.log_path.read_text()

    def wait_log(self, text: str) -> None:
        wait_for(f"log line {text!r}", lambda: text in self.err, self.proc)

    def finish(self, sig: int | None = None) -> tuple[int, str]:
        if sig is not None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=WAIT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        return rc, self.err


def metrics_rows(run: Path) -> list[dict[str, str]]:
    try:
        with (run / "metrics.csv").open() as f:
            return list(csv.DictReader(f))
    except (FileNotFoundError, IsADirectoryError):
        return []


def status_doc(run: Path) -> dict:
    try:
        return json.loads((run / "status.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def logged_row_steps(err: str) -> list[int]:
    """The steps of the progress lines logged at each metrics row (no progress bar off a tty)."""
    return [int(m.replace(",", "")) for m in re.findall(r"INFO step ([\d,]+)/", err)]


def temp_files(run: Path) -> list[Path]:
    return [p for d in (run, run / "checkpoints") for p in d.iterdir() if TEMP_NAME.match(p.name)]


# ------------------------------------------------------------------ 1. temp files after kill -9


def start_writer(target: Path, ready: Path) -> subprocess.Popen:
    """A real process writing ``target`` with write_atomic, stopped after its data is in the
    temporary file (before fsync and rename): the moment a kill -9 leaves a partial file."""
    script = textwrap.dedent("""
        import os, sys, time
        from pathlib import Path
        from edgerl.files import atomic
        def hold(fd):
            Path(sys.argv[3]).write_text("writing")
            time.sleep(3600)
        atomic.os.fsync = hold
        atomic.write_atomic(Path(sys.argv[2]), os.urandom(3_000_000))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # "edgerl-writer" in its command line: pid_alive() takes it for an edgerl process
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "edgerl-writer", str(target), str(ready)], env=env
    )
    wait_for(f"writer of {target.name} under way", ready.exists, proc)
    return proc


def test_partial_writes_of_killed_writers_are_removed_at_start_and_live_ones_kept(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    (good,) = list_checkpoints(run / "checkpoints")
    killed = start_writer(run / "checkpoints" / "ckpt-000002-step0000000300.ckpt", tmp_path / "a")
    live = start_writer(run / "status.json", tmp_path / "b")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=WAIT_S)
        partial = run / "checkpoints" / f".ckpt-000002-step0000000300.ckpt.tmp-{killed.pid}"
        live_partial = run / f".status.json.tmp-{live.pid}"
        assert partial.stat().st_size == 3_000_000 and live_partial.exists()

        r = cli("train", *PONG_FAST, "--steps", "400", "--run-dir", run)
        assert r.code == 0, r.err
        assert f"removed {partial} (3,000,000 bytes): a partial write by pid {killed.pid}" in r.err
        assert not partial.exists()
        assert live_partial.exists()  # its writer still runs: never touched
        assert good.path.exists() and load(good.path).step == 200
        assert [c.step for c in list_checkpoints(run / "checkpoints")] == [200, 400]
    finally:
        live.kill()
        live.wait(timeout=WAIT_S)


def test_a_leftover_of_a_dead_pid_is_removed_and_one_of_a_live_process_is_not(tmp_path):
    from edgerl.files.atomic import remove_stale_temps

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=WAIT_S)
    stale = tmp_path / f".ckpt-000001-step0000000001.ckpt.tmp-{dead.pid}"
    stale.write_bytes(b"\0" * 1000)
    mine = tmp_path / f".status.json.tmp-{os.getpid()}"  # the pid of the process holding the dir
    mine.write_bytes(b"{")
    valid = tmp_path / "ckpt-000001-step0000000001.ckpt"
    valid.write_bytes(b"x")
    other = tmp_path / ".notes.tmp-x"
    other.write_bytes(b"x")
    removed = remove_stale_temps(tmp_path, alive=lambda pid: pid == os.getpid())
    assert sorted(removed) == sorted([stale, mine])
    assert valid.exists() and other.exists()


def test_a_link_planted_at_the_temporary_name_is_replaced_never_written_through(tmp_path):
    """Where the user names the file (``export -o /tmp/x``, ``plot -o``, ``play --record``) the
    directory can be shared: a link another program put at the temporary name must not carry
    the write to its target, for the atomic writes and for the libraries that write by name."""
    from edgerl.display.plot import save_figure
    from edgerl.files.atomic import temp_path, write_atomic

    victim = tmp_path / "victim"
    victim.write_bytes(b"kept")
    out = tmp_path / "status.json"
    temp_path(out).symlink_to(victim)
    write_atomic(out, b"{}")
    assert victim.read_bytes() == b"kept"
    assert out.read_bytes() == b"{}" and not out.is_symlink()

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = tmp_path / "curve.svg"
    temp_path(figure).symlink_to(victim)
    save_figure(Figure(), figure)
    assert victim.read_bytes() == b"kept"
    assert figure.read_bytes().startswith(b"<?xml") and not figure.is_symlink()
    assert not list(tmp_path.glob(".*.tmp-*"))


# ------------------------------------------------------------------ 2. side files


def test_an_unwritable_metrics_csv_does_not_stop_training_and_catches_up(tmp_path, cli):
    run = tmp_path / "pong"
    run.mkdir()
    (run / "metrics.csv").mkdir()  # a directory in the way: every write fails (EISDIR)
    t = Trainer(tmp_path, *PONG_FAST, "--steps", "100000000", "--run-dir", str(run))
    try:
        t.wait_log("cannot write metrics.csv")
        wait_for(
            "the problem in status.json",
            lambda: status_doc(run).get("write_problems") and status_doc(run)["step"] > 0,
            t.proc,
        )
        r = cli("status", "--run-dir", run)
        assert r.code == 0, r.out
        assert "cannot write metrics.csv (Is a directory): training goes on" in r.out
        before = status_doc(run)["step"]
        wait_for("training to go on", lambda: status_doc(run)["step"] > before, t.proc)

        (run / "metrics.csv").rmdir()
        t.wait_log("metrics.csv is written again")
        wait_for("rows after the catch-up", lambda: len(metrics_rows(run)) > 3, t.proc)
        wait_for("status.json without the problem", lambda: not status_doc(run)["write_problems"])
    finally:
        rc, err = t.finish(signal.SIGTERM)
    assert rc == 143, err
    assert err.count("cannot write metrics.csv") == 1 and "Traceback" not in err
    steps = [int(row["step"]) for row in metrics_rows(run)]
    assert steps == logged_row_steps(err)  # every row, those from before the fix included
    waited = logged_row_steps(err.split("metrics.csv is written again")[0])
    assert waited and steps[: len(waited)] == waited


@contextlib.contextmanager
def tiny_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (needs root: mount)."""
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], timeout=60, check=False)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the file system is full (a real ENOSPC)."""
    block = b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(block)
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_a_full_disk_keeps_training_says_so_and_every_file_catches_up(tmp_path, cli):
    with tiny_filesystem(tmp_path / "disk", "160m") as disk:
        run = disk / "pong"
        t = Trainer(
            tmp_path,
            *PONG_FAST,
            "--steps",
            "100000000",
            "--run-dir",
            str(run),
            "--set",
            "train.checkpoint_every_s=1",
            "--set",
            "hw.monitor_interval_ms=200",
        )
        try:
            wait_for("a first checkpoint", lambda: list_checkpoints(run / "checkpoints"), t.proc)
            wait_for("metrics rows", lambda: len(metrics_rows(run)) >= 2, t.proc)
            fill(disk / "filler")
            t.wait_log("cannot write metrics.csv (the disk is full)")
            t.wait_log("No space left on device")  # a checkpoint failed too
            r = cli("status", "--run-dir", run)  # status.json may be stale by now: exit 0 or 3
            assert f"the disk holding {run} is full: training goes on" in r.out, r.out
            full_at = status_doc(run)["step"]

            (disk / "filler").unlink()
            t.wait_log("metrics.csv is written again")
            t.wait_log("status.json is written again")
            wait_for("a new status", lambda: status_doc(run)["step"] > full_at, t.proc)
            wait_for(
                "a checkpoint after the disk had room",
                lambda: list_checkpoints(run / "checkpoints")[-1].step > full_at,
                t.proc,
            )
        finally:
            rc, err = t.finish(signal.SIGTERM)
        assert rc == 143, err
        assert "Traceback" not in err
        for name in ("metrics.csv", "status.json", "load.csv", "tegrastats.log"):
            assert err.count(f"cannot write {name}") <= 1  # said once, not once per write
        steps = [int(row["step"]) for row in metrics_rows(run)]
        assert steps == logged_row_steps(err)  # none lost, none torn, none doubled
        full = err.split("cannot write metrics.csv")[1].split("metrics.csv is written again")[0]
        while_full = logged_row_steps(full)  # rows made while the disk was full: all in the file
        assert while_full and set(while_full) <= set(steps)
        with (run / "load.csv").open() as f:
            widths = {len(row) for row in csv.reader(f)}
        assert widths == {10}
        newest = list_checkpoints(run / "checkpoints")[-1]
        assert load(newest.path).step == status_doc(run)["step"] and not temp_files(run)


# ------------------------------------------------------------------ 3. the last checkpoint


def file_size_limit(limit: int) -> Callable[[], None]:
    """A real limit: writes past ``limit`` bytes fail with EFBIG, like a full disk. The hard
    limit stays, so the test can lift the soft one while the process runs."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return apply


def test_a_last_checkpoint_that_cannot_be_written_exits_non_zero_saying_what_was_lost(
    cli, tmp_path
):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    t = Trainer(
        tmp_path,
        *PONG_FAST,
        "--steps",
        "600",
        "--run-dir",
        str(run),
        "--set",
        "train.final_checkpoint_retry_s=1",
        preexec=file_size_limit(1 << 20),  # a checkpoint is 27 MB
    )
    rc, err = t.finish()
    assert rc == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("edgerl: error: the last checkpoint could not be written within 1 s")
    assert "steps 200 to 600 are lost and the next run resumes from step 200" in last
    assert "Traceback" not in err
    assert [c.step for c in list_checkpoints(run / "checkpoints")] == [200]
    assert not temp_files(run)
    assert status_doc(run)["state"] == "failed"


def test_the_last_checkpoint_is_retried_until_the_disk_has_room(tmp_path):
    run = tmp_path / "pong"
    t = Trainer(
        tmp_path,
        *PONG_FAST,
        "--steps",
        "300",
        "--run-dir",
        str(run),
        "--set",
        "train.final_checkpoint_retry_s=600",
        preexec=file_size_limit(1 << 20),
    )
    try:
        t.wait_log("retrying the last checkpoint")
        room = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        resource.prlimit(t.proc.pid, resource.RLIMIT_FSIZE, room)  # the disk has room again
    finally:
        rc, err = t.finish()
    assert rc == 0, err
    (ck,) = list_checkpoints(run / "checkpoints")
    assert load(ck.path).step == 300


# ------------------------------------------------------------------ 4. many environments


def test_too_many_environments_are_refused_with_the_largest_number_that_fits(cli):
    r = cli(
        "train",
        "--env",
        "ALE/Pong-v5",
        "--steps",
        "10",
        "--set",
        "env.num_envs=100000",
        "--set",
        "replay.capacity=1600000",
    )
    assert r.code == 2, r.err
    assert r.err.strip().count("\n") == 0 and "Traceback" not in r.err
    m = re.search(r"env\.num_envs=100,000 needs .* set env\.num_envs to at most ([\d,]+)$", r.err)
    assert m, r.err
    assert 0 < int(m[1].replace(",", "")) < 100_000


def test_the_env_memory_plan_names_the_largest_number_that_fits():
    spec = probe("ALE/Pong-v5")
    plan = plan_env_memory(spec, 100_000, available_host_bytes=8 << 30, replay_host_bytes=1 << 30)
    assert not plan.fits
    assert plan_env_memory(spec, plan.max_num_envs, 8 << 30, 1 << 30).fits
    assert not plan_env_memory(spec, plan.max_num_envs + 1, 8 << 30, 1 << 30).fits
    none_left = plan_env_memory(spec, 1, 1 << 30, 1 << 30)
    with pytest.raises(EnvMemoryError, match=r"lower replay\.capacity first"):
        none_left.check()
    # PQN has a rollout, not a replay: the sentence names what it has (issue 59)
    rollout = plan_env_memory(spec, 1, 1 << 30, 1 << 30, ("the rollout", "pqn.rollout_steps"))
    with pytest.raises(EnvMemoryError, match=r"beside the rollout's .* pqn\.rollout_steps first"):
        rollout.check()


@pytest.mark.parametrize(
    ("env_id", "n", "per_env"),
    [("ALE/Pong-v5", 24, ATARI_ENV_BYTES), ("CartPole-v1", 3000, VECTOR_ENV_BYTES)],
)
def test_the_per_env_memory_constant_covers_what_environments_really_take(env_id, n, per_env):
    # Measured in a fresh interpreter: in this one, memory an earlier test left for the collector
    # can be given back while the environments are built, and the growth read came out negative.
    script = textwrap.dedent(
        f"""
        import gc, json
        import numpy as np, psutil
        from edgerl.config import EnvConfig
        from edgerl.envs import make_env, probe
        spec = probe({env_id!r})
        gc.collect()
        proc = psutil.Process()
        before = proc.memory_info().rss
        env = make_env(EnvConfig(id={env_id!r}, num_envs={n}, threads=2), spec)
        try:
            env.reset(seed=0)
            for _ in range(3):
                env.send(np.zeros({n}, dtype=np.int64))
                env.recv()
            print(json.dumps(proc.memory_info().rss - before))
        finally:
            env.close()
        """
    )
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", script],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr
    grown = json.loads(r.stdout.strip().splitlines()[-1])
    assert 0 < grown <= n * per_env, f"{grown / n:,.0f} bytes per env"


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]])
def test_a_stop_while_building_many_environments_ends_set_up_at_once(tmp_path, signals):
    run = tmp_path / "cartpole"
    t = Trainer(
        tmp_path,
        "--env",
        "CartPole-v1",
        "--steps",
        "100000000",
        "--run-dir",
        str(run),
        "--set",
        "env.num_envs=300000",
        "--set",
        "replay.capacity=4800000",
    )
    try:
        wait_for("set-up", lambda: "building 300,000" in t.err or t.proc.poll() is not None)
        if "set env.num_envs to at most" in t.err:
            pytest.skip("this machine has too little memory for the test")
        for sig in signals:
            t.proc.send_signal(sig)
    finally:
        rc, err = t.finish()
    assert "Traceback" not in err and not list_checkpoints(run / "checkpoints")
    if signals == [signal.SIGTERM]:
        assert rc == 143, err
        assert "stopped by SIGTERM during start-up: no step was taken, nothing was lost" in err
    else:  # the first asks to stop, a second one (if it lands in time) aborts at once
        assert rc in (130, -signal.SIGINT), err
        assert "stopped by SIGINT during start-up" in err or "interrupted: stopped at once" in err


# ------------------------------------------------------------------ 6. permissions


def test_runs_are_private_to_the_owner_and_group(cli, tmp_path):
    run = tmp_path / "pong"
    run.mkdir(mode=0o755)
    (run / "metrics.csv").write_text("")
    os.chmod(run, 0o755)  # a run of an older edgerl: readable by every local user
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    assert stat.S_IMODE(run.stat().st_mode) == 0o750
    assert stat.S_IMODE((run / "checkpoints").stat().st_mode) == 0o750
    for name in ("config.toml", "status.json", "load.csv", "tegrastats.log", ".lock"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o640, name
    (ck,) = list_checkpoints(run / "checkpoints")
    assert stat.S_IMODE(ck.path.stat().st_mode) == 0o640


def run_as_nobody(fn: Callable[[], int]) -> tuple[int, str]:
    """Run ``fn`` in a forked child with the uid/gid of nobody; its exit code and stderr."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.dup2(write, 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            code = fn()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


@pytest.mark.skipif(os.geteuid() != 0, reason="a service run and another user need root")
def test_a_service_run_is_readable_by_its_group_only_and_others_are_told_why(cli):
    import grp

    import edgerl.display.viewer  # noqa: F401 - imported before the child drops root
    from edgerl.cli import main

    gid = grp.getgrnam("daemon").gr_gid  # a group every Debian/Ubuntu (L4T) system has
    base = Path(tempfile.mkdtemp(prefix="edgerl-perm-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)  # other users may reach it: the run's own modes decide
        run = base / "runs" / "pong"
        r = cli(
            "train", *PONG_FAST, "--steps", "200", "--run-dir", run, "--set", "display.group=daemon"
        )
        assert r.code == 0, r.err
        st = run.stat()
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o2750
        status = (run / "status.json").stat()
        assert status.st_gid == gid and stat.S_IMODE(status.st_mode) == 0o640

        code, err = run_as_nobody(lambda: main(["view", "--run-dir", str(run), "--console"]))
        assert code == 2, err
        assert f"permission denied reading {base / 'runs'}" in err
        assert "watched by the daemon group only; add yourself with: sudo usermod -aG daemon" in err
    finally:
        subprocess.run(["rm", "-rf", str(base)], timeout=60, check=False)


# ------------------------------------------------------------------ 8. the service's journal


def test_the_service_logs_progress_and_names_an_unwritable_file_in_its_status(
    tmp_path,
    notify,  # noqa: F811
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").mkdir()  # in the way of every row (EISDIR)
    proc = start_daemon(service_config(tmp_path), notify)
    try:
        notify.wait_for("READY", "1", timeout=WAIT_S)
        msg = notify.wait_for("STATUS", contains="cannot write metrics.csv", timeout=WAIT_S)
        assert msg["STATUS"].startswith("step ") and "(Is a directory)" in msg["STATUS"]
        notify.collect(3.0)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert len(logged_row_steps(err)) >= 2, err  # log_every_s = 0.5 in service_config
    assert err.count("cannot write metrics.csv") == 1


# ------------------------------------------------------------------ 10. smaller


def test_an_empty_onnx_file_with_its_sidecar_is_one_sentence(cli, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    model = tmp_path / "policy.onnx"
    model.write_bytes(b"")  # e.g. a copy cut short by a full disk
    (tmp_path / "policy.onnx.json").write_text("{}")
    r = cli("play", "--model", model, "--episodes", "1")
    assert r.code == 2, r.err
    assert f"{model} holds no ONNX graph (0 bytes): it is empty or damaged" in r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
