"""The service: sd_notify over a real socket, signals, resume, reload, status, install, unit."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgerl.files.checkpoint import list_checkpoints
from edgerl.service.notify import Notifier, watchdog_interval_s

from .conftest import REPO, edgerl_cmd


class NotifySocket:
    """The systemd side of sd_notify: a datagram socket read all the time, as systemd reads it
    (a socket nobody reads makes a blocking sender hang after 10 messages)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.messages: list[dict[str, str]] = []
        self._seen = 0  # messages already looked at by wait_for
        self._arrived = threading.Condition()
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096).decode()
            except (TimeoutError, OSError):
                continue
            msg = dict(line.split("=", 1) for line in data.splitlines())
            msg["_arrived"] = str(time.monotonic())
            with self._arrived:
                self.messages.append(msg)
                self._arrived.notify_all()

    def wait_for(
        self, key: str, value: str | None = None, timeout: float = 120, contains: str = ""
    ) -> dict[str, str]:
        """The next message with ``key`` (equal to ``value``, or containing ``contains``)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                while self._seen < len(self.messages):
                    msg = self.messages[self._seen]
                    self._seen += 1
                    if key in msg and contains in msg[key] and value in (None, msg[key]):
                        return msg
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {key}={value} within {timeout} s; got {self.messages[-5:]}"
                    )
                self._arrived.wait(left)

    def collect(self, seconds: float) -> list[dict[str, str]]:
        """The messages that arrive in the next ``seconds``."""
        with self._arrived:
            start = len(self.messages)
        time.sleep(seconds)
        with self._arrived:
            self._seen = len(self.messages)
            return self.messages[start:]

    def skip(self) -> None:
        """Let wait_for look only at messages that arrive from now on."""
        with self._arrived:
            self._seen = len(self.messages)

    def close(self) -> None:
        self._closed = True
        self._reader.join(timeout=5)
        self.sock.close()


@pytest.fixture
def notify(tmp_path):
    sock = NotifySocket(str(tmp_path / "notify.sock"))
    yield sock
    sock.close()


def service_config(tmp_path: Path, **extra: str) -> Path:
    cfg = tmp_path / "edgerl.toml"
    cfg.write_text(
        textwrap.dedent(f"""
        [env]
        id = "ALE/Pong-v5"
        num_envs = 2
        [agent]
        algo = "dqn"
        learning_starts = 100
        batch_size = 8
        train_freq = 16
        [replay]
        capacity = 2000
        [train]
        run_dir = "{tmp_path / "run"}"
        log_every_s = 0.5
        [hw]
        state_dir = "{tmp_path / "state"}"
        monitor_interval_ms = 200
        [display]
        every = {extra.get("every", 3)}
        [log]
        level = "{extra.get("level", "info")}"
        [perf]
        compile = "off"
    """)
    )
    return cfg


STARTED: list[subprocess.Popen] = []  # daemons of the running test, killed when it ends


@pytest.fixture(autouse=True)
def no_daemon_outlives_its_test() -> Iterator[None]:
    """A test that fails while its daemon runs (a timeout) must not leave it training."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_daemon(cfg: Path, notify: NotifySocket, *pre: str, **env: str) -> subprocess.Popen:
    full_env = {**os.environ, "NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "1000000", **env}
    cmd = (
        [*pre, "daemon", "--config", str(cfg)]
        if pre
        else edgerl_cmd("daemon", "--config", str(cfg))
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env
    )
    STARTED.append(proc)
    return proc


def status_json(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


def test_service_lifecycle(tmp_path, notify, fake_jetson, cli):
    cfg = service_config(tmp_path)
    run = tmp_path / "run"
    proc = start_daemon(cfg, notify)
    try:
        ready = notify.wait_for("READY", "1")
        # READY only once training really runs: first step taken, clocks maxed, monitor started
        first = status_json(run)
        assert first["state"] == "training" and first["step"] > 0
        assert (fake_jetson.state / "clocks.maxed").exists()
        deadline = time.monotonic() + 10  # the stand-in records itself once its Python is up
        while not fake_jetson.calls("tegrastats") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake_jetson.calls("tegrastats")
        assert "training ALE/Pong-v5" in ready.get("STATUS", "")

        # WATCHDOG=1 every 0.5 s (half of WATCHDOG_USEC) from the loop: four arrive, each at
        # least that far apart. A loaded machine may make them late, never early.
        pings = [float(notify.wait_for("WATCHDOG", "1", timeout=60)["_arrived"]) for _ in range(4)]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert min(gaps) >= 0.45, gaps
        # the load comes from the tegrastats stand-in (captured Xavier NX lines, GR3D 62% or 0%);
        # STATUS goes out every 5 s, the first one maybe before the monitor's first sample
        loaded = notify.wait_for("STATUS", contains="max-core | GR3D", timeout=30)
        assert "steps/s" in loaded["STATUS"]

        deadline = time.monotonic() + 20  # status.json is rewritten every 3 s
        while status_json(run)["load"] is None and time.monotonic() < deadline:
            time.sleep(0.2)
        r = cli("status", "--run-dir", run)
        assert r.code == 0 and "running (pid" in r.out and "max-core | GR3D" in r.out

        # SIGHUP: live keys change, others are reported as needing a restart
        service_config(tmp_path, every="1", level="debug")
        cfg.write_text(cfg.read_text().replace("learning_starts = 100", "learning_starts = 101"))
        proc.send_signal(signal.SIGHUP)
        notify.wait_for("RELOADING", "1", timeout=20)
        reloaded = notify.wait_for("READY", "1", timeout=20)
        assert "display.every 3 -> 1" in reloaded["STATUS"]
        assert "log.level info -> debug" in reloaded["STATUS"]

        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING", "1", timeout=20)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "changed but only applied after a restart: agent.learning_starts" in err
    (ck,) = list_checkpoints(run / "checkpoints")
    assert ck.step > 0
    jc = [c[0] if c else "max" for c in fake_jetson.calls("jetson_clocks")]
    assert jc == ["--store", "max", "--restore"]
    assert status_json(run)["state"] == "stopped"
    r = cli("status", "--run-dir", run)
    assert r.code == 3 and "stopped at" in r.out

    # a second start resumes past the first run's step
    notify.skip()
    proc = start_daemon(cfg, notify)
    try:
        notify.wait_for("READY", "1")
        assert status_json(run)["step"] > ck.step
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and f"resuming from step {ck.step:,}" in err


def test_invalid_config_exits_non_zero_with_the_sentence(tmp_path, notify):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[agent]\nlrr = 1\n")
    proc = start_daemon(cfg, notify)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 2
    assert "unknown config key 'agent.lrr' (did you mean 'agent.lr'?)" in err
    assert "Traceback" not in err
    msg = notify.wait_for("STATUS", timeout=5)
    assert msg["STATUS"].startswith("failed:") and "agent.lrr" in msg["STATUS"]


def test_a_daemon_started_by_hand_says_what_it_is_and_where_it_trains(tmp_path):
    """Without systemd's variables the daemon says it is the service's command, what it trains
    and where; under systemd (NOTIFY_SOCKET) it does not."""
    cfg = service_config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "INVOCATION_ID")}
    proc = subprocess.Popen(
        edgerl_cmd("daemon", "--config", str(cfg)),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    STARTED.append(proc)
    assert proc.stderr is not None
    said = ""
    for line in proc.stderr:
        said += line
        if "not started by systemd" in line or "Traceback" in line:
            break
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=240)
    assert "edgerl daemon is what `systemctl start edgerl` runs" in said, said
    assert f"trains ALE/Pong-v5 for 10,000,000 steps in {tmp_path / 'run'}" in said
    assert "edgerl train" in said


def test_commands_say_which_run_they_chose_and_why(cli, tmp_path, monkeypatch):
    """Two runs with checkpoints, the service's (older) and one under ./runs: play picks the
    newest and says so; status names the run it shows."""
    import time

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    service = tmp_path / "state" / "runs" / "Pong-v5" / "checkpoints"
    mine = tmp_path / "runs" / "Breakout-v5" / "checkpoints"
    for i, folder in enumerate((service, mine)):
        folder.mkdir(parents=True)
        (folder / "ckpt-000001-step0000001000.ckpt").write_bytes(b"not a real checkpoint")
        stamp = time.time() - 100 + 50 * i
        os.utime(folder / "ckpt-000001-step0000001000.ckpt", (stamp, stamp))
    r = cli("play", "--episodes", "1")  # cwd is tmp_path: ./runs
    places = f"{tmp_path / 'state' / 'runs'}, runs"
    assert f"run runs/Breakout-v5: the newest checkpoint in {places} (--run-dir" in r.err, r.err
    (tmp_path / "runs" / "Breakout-v5" / "status.json").write_text("{}")
    r = cli("status")
    assert "run runs/Breakout-v5: the most recently updated status.json in" in r.err, r.err


def _fault_runner(tmp_path: Path, patch: str) -> list[str]:
    """A python command that applies ``patch`` (a fault) and then runs the real CLI."""
    script = tmp_path / "fault.py"
    script.write_text(
        textwrap.dedent(patch)
        + textwrap.dedent("""
        import sys
        from edgerl.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    )
    return [sys.executable, str(script)]


def test_a_crash_in_the_loop_checkpoints_restores_clocks_and_fails(tmp_path, notify, fake_jetson):
    runner = _fault_runner(
        tmp_path,
        """
        import edgerl.learners.dqn
        original = edgerl.learners.dqn.DQN.learn
        def learn(self, replay, step, n=1):
            if self.updates >= 5:
                raise RuntimeError("simulated CUDA error")
            return original(self, replay, step, n)
        edgerl.learners.dqn.DQN.learn = learn
    """,
    )
    proc = start_daemon(service_config(tmp_path), notify, *runner)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "the training loop crashed" in err and "simulated CUDA error" in err
    (ck,) = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert ck.step > 0
    assert fake_jetson.calls("jetson_clocks")[-1][0] == "--restore"
    assert status_json(tmp_path / "run")["state"] == "failed"
    crashed = notify.wait_for("STATUS", contains="crashed", timeout=5)
    assert crashed["STATUS"] == "crashed: RuntimeError: simulated CUDA error"


def test_disk_full_while_checkpointing_keeps_training_and_retries(tmp_path, notify, fake_jetson):
    runner = _fault_runner(
        tmp_path,
        """
        import errno, edgerl.files.checkpoint, edgerl.run.train
        edgerl.run.train.CHECKPOINT_RETRY_S = 1.0
        original = edgerl.files.checkpoint.write_atomic
        failures = [2]
        def write_atomic(path, data):
            if path.suffix == ".ckpt" and failures[0] > 0:
                failures[0] -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return original(path, data)
        edgerl.files.checkpoint.write_atomic = write_atomic
    """,
    )
    cfg = service_config(tmp_path)
    cfg.write_text(
        cfg.read_text().replace("log_every_s = 0.5", "log_every_s = 0.5\ncheckpoint_every_s = 1.0")
    )
    proc = start_daemon(cfg, notify, *runner)
    try:
        notify.wait_for("READY", "1")
        msg = notify.wait_for("STATUS", contains="checkpoint failed", timeout=30)
        assert "No space left on device" in msg["STATUS"]
        deadline = time.monotonic() + 60
        while not list_checkpoints(tmp_path / "run" / "checkpoints"):
            assert time.monotonic() < deadline, "no checkpoint after the disk had room again"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "cannot write checkpoint" in err and "checkpoint written again" in err


def test_notifier_abstract_socket_and_watchdog_interval(monkeypatch):
    name = f"@edgerl-test-{os.getpid()}"
    sock = NotifySocket(name)
    try:
        n = Notifier(name)
        assert n.ready("hello") and n.watchdog()
        assert sock.wait_for("READY", "1", timeout=2)["STATUS"] == "hello"
        assert sock.wait_for("WATCHDOG", "1", timeout=2)
        n.close()
    finally:
        sock.close()
    assert not Notifier("").enabled and Notifier("").send(READY=1) is False
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert watchdog_interval_s() is None  # meant for another process


def test_notifier_survives_a_missing_listener(tmp_path, caplog):
    n = Notifier(str(tmp_path / "nobody.sock"))
    assert n.status("x") is False and n.status("y") is False
    assert caplog.text.count("cannot notify systemd") == 1


def test_a_value_with_line_breaks_adds_no_key(notify):
    """A reload's error names the config's key as written, and a quoted TOML key can hold
    ``\nWATCHDOG=1``: each value is one line, so the text never becomes a key of its own."""
    n = Notifier(notify.address)
    assert n.ready("reload failed: unknown config key 'env.id\nSTATUS=pwned\r\nWATCHDOG=1'")
    assert n.stopping("a\nMAINPID=1")
    msg = notify.wait_for("READY", "1")
    assert set(msg) == {"READY", "STATUS", "_arrived"}
    assert msg["STATUS"].endswith("env.id STATUS=pwned  WATCHDOG=1'")
    msg = notify.wait_for("STOPPING", "1")
    assert set(msg) == {"STOPPING", "STATUS", "_arrived"} and msg["STATUS"] == "a MAINPID=1"
    n.close()


def test_a_listener_that_stops_reading_never_blocks_the_service(tmp_path, caplog):
    """A Unix datagram send blocks once 10 messages wait unread: a blocking notifier hung the
    service's crash path (no checkpoint, no restart until the watchdog fired)."""
    path = tmp_path / "slow.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))  # bound, never read
    try:
        n = Notifier(str(path))
        sent = [n.watchdog() for _ in range(100)]  # a blocking socket would hang at the 11th
        assert sent[0] and not sent[-1]
        assert caplog.text.count("not reading its notification socket") == 1
        listener.recv(4096)  # systemd catches up: sending works again
        assert n.status("back")
        n.close()
    finally:
        listener.close()


def _status_doc(pid: int, age_s: float, state: str = "training") -> dict:
    now = time.time()
    return {
        "state": state,
        "env": "ALE/Pong-v5",
        "run_dir": "r",
        "pid": pid,
        "step": 5,
        "total_steps": 10,
        "sps": 1.0,
        "episodes": 0,
        "return_mean": None,
        "epsilon": 1.0,
        "updates": 0,
        "updated_unix": now - age_s,
        "updated_at": "then",
        "started_at": "x",
    }


def test_status_live_stale_and_dead(tmp_path, cli):
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "edgerl-test-sleeper"]
    )
    try:
        run = tmp_path / "r"
        run.mkdir()
        (run / "status.json").write_text(json.dumps(_status_doc(sleeper.pid, 1)))
        r = cli("status", "--run-dir", run)
        assert r.code == 0 and f"running (pid {sleeper.pid}" in r.out
        (run / "status.json").write_text(json.dumps(_status_doc(sleeper.pid, 300)))
        r = cli("status", "--run-dir", run, "--json")
        assert r.code == 3 and json.loads(r.out)["stale"] is True
        assert "may be hung" in json.loads(r.out)["liveness"]
    finally:
        sleeper.kill()
        sleeper.wait()
    (run / "status.json").write_text(json.dumps(_status_doc(sleeper.pid, 1)))
    r = cli("status", "--run-dir", run)
    assert r.code == 3 and f"not running: pid {sleeper.pid} is gone" in r.out


def test_status_without_a_run(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    r = cli("status")
    assert r.code == 2 and "no run with a status.json" in r.err
    assert "train one (edgerl train --quick" in r.err  # not only the service, not installed here
    r = cli("status", "--run-dir", tmp_path / "nothing")
    assert r.code == 2 and "does not exist" in r.err


INSTALL = REPO / "scripts" / "install.sh"


def install(*args: str, hw_root: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGERL_HW_ROOT": str(hw_root or "/nonexistent-board")}
    return subprocess.run(
        ["bash", str(INSTALL), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_install_dry_run_on_a_jetson(tmp_path):
    board = REPO / "tests" / "fixtures" / "boards" / "nano_jp4"
    r = install("--prefix", str(tmp_path), "--dry-run", hw_root=board)
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "opt" / "edgerl" / "venv"
    assert f"+ python3 -m venv --system-site-packages {venv}" in r.stdout
    assert f"jetpack_pip.py --quiet --constraints {tmp_path}/opt/edgerl/constraints.txt" in r.stdout
    assert f"write {tmp_path}/etc/systemd/system/edgerl.service" in r.stdout
    assert "dry run: nothing was installed" in r.stdout and "installed. First" not in r.stdout
    assert "R32 (release)" in r.stdout
    assert f"+ ln -sfn {venv}/bin/edgerl {tmp_path}/usr/local/bin/edgerl" in r.stdout
    assert "First check this machine: edgerl doctor --deep" in r.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run changes nothing


def test_install_dry_run_elsewhere_uses_a_plain_venv(tmp_path):
    r = install("--prefix", str(tmp_path), "--dry-run")
    assert r.returncode == 0
    assert f"+ python3 -m venv {tmp_path}/opt/edgerl/venv" in r.stdout
    assert "--system-site-packages" not in r.stdout


def test_a_prefix_the_unit_files_cannot_hold_as_it_is_is_refused(tmp_path):
    """ExecStart= is split at spaces and reads %, $ and quotes; the sed writing it reads # and
    &: such a --prefix wrote a broken or split ExecStart (issue 58). Refused, nothing written."""
    for odd in ("my board", "a#b", "a&b", "50%", "$HOME", "a'b"):
        r = install("--prefix", str(tmp_path / odd), "--no-venv")
        assert r.returncode == 2, (odd, r.stdout)
        assert r.stderr.startswith("edgerl-install: error: --prefix ") and r.stderr.count("\n") == 1
        assert "give a path of letters, digits and . _ + - / only" in r.stderr
    r = install("--prefix", "relative/dir", "--no-venv")
    assert r.returncode == 2 and "give an absolute path" in r.stderr
    r = install("--prefix", "", "--no-venv")
    assert r.returncode == 2 and r.stderr == "edgerl-install: error: --prefix needs a directory\n"
    assert list(tmp_path.iterdir()) == []


def test_install_is_idempotent_keeps_config_and_uninstalls(tmp_path):
    assert install("--prefix", str(tmp_path), "--no-venv").returncode == 0
    unit = tmp_path / "etc/systemd/system/edgerl.service"
    conf = tmp_path / "etc/edgerl/edgerl.toml"
    assert f"ExecStart={tmp_path}/opt/edgerl/venv/bin/edgerl daemon" in unit.read_text()
    assert (tmp_path / "var/lib/edgerl").is_dir()
    link = tmp_path / "usr/local/bin/edgerl"  # the command on PATH, pointing into the venv
    assert os.readlink(link) == f"{tmp_path}/opt/edgerl/venv/bin/edgerl"
    conf.write_text(conf.read_text() + "\n# mine\n")
    r = install("--prefix", str(tmp_path), "--no-venv")
    assert r.returncode == 0 and "keeping the existing" in r.stdout
    assert conf.read_text().endswith("# mine\n")
    (tmp_path / "var/lib/edgerl/runs").mkdir()
    r = install("--prefix", str(tmp_path), "--uninstall")
    assert r.returncode == 0
    assert not unit.exists() and conf.exists() and (tmp_path / "var/lib/edgerl/runs").exists()
    assert not link.is_symlink()


def test_install_leaves_an_edgerl_command_that_is_not_its_own(tmp_path):
    mine = tmp_path / "usr/local/bin/edgerl"
    mine.parent.mkdir(parents=True)
    mine.write_text("#!/bin/sh\necho mine\n")
    r = install("--prefix", str(tmp_path), "--no-venv")
    assert r.returncode == 0 and f"keeping {mine} (not ours)" in r.stdout
    assert mine.read_text() == "#!/bin/sh\necho mine\n"
    assert install("--prefix", str(tmp_path), "--uninstall").returncode == 0
    assert mine.exists()


def test_install_for_a_fleet_adds_ray_its_unit_a_token_and_the_learners_drop_in(tmp_path):
    r = install("--prefix", str(tmp_path), "--dry-run", "--fleet")
    assert r.returncode == 0 and f"/bin/pip install {REPO}[web,fleet]" in r.stdout
    assert list(tmp_path.iterdir()) == []
    r = install("--prefix", str(tmp_path), "--no-venv", "--fleet")
    assert r.returncode == 0, r.stderr
    etc = tmp_path / "etc"
    ray_unit = etc / "systemd/system/edgerl-ray.service"
    assert f"ExecStart={tmp_path}/opt/edgerl/venv/bin/ray start --block" in ray_unit.read_text()
    drop_in = etc / "systemd/system/edgerl.service.d/fleet.conf"
    assert "Requires=edgerl-ray.service" in drop_in.read_text()
    role = etc / "edgerl/ray.env"
    assert role.read_text() == (REPO / "systemd/ray.env.example").read_text()
    token = etc / "edgerl/ray-token"
    assert re.fullmatch(r"[0-9a-f]{64}", token.read_text())
    # Whoever has the token runs code on every board: not the edgerl group's, whose members watch.
    assert token.stat().st_mode & 0o777 == 0o600
    assert "give every board the same" in r.stdout and "enable --now edgerl-ray" in r.stdout
    assert "edgerl itself stays off there" in r.stdout  # a board of actors only
    # Again: what the user set is kept (one token for the whole fleet, its subnet, its role).
    token.write_text("the fleet's own token")
    role.write_text("RAY_START_ARGS=--address=192.168.1.10:6379\n")
    drop_in.write_text(drop_in.read_text().replace("192.168.1.0/24", "10.0.0.0/24"))
    r = install("--prefix", str(tmp_path), "--no-venv", "--fleet")
    assert r.returncode == 0 and f"keeping the existing {token}" in r.stdout
    assert token.read_text() == "the fleet's own token" and "--address" in role.read_text()
    assert "IPAddressAllow=10.0.0.0/24" in drop_in.read_text()
    assert install("--prefix", str(tmp_path), "--uninstall").returncode == 0
    assert not ray_unit.exists() and not drop_in.parent.exists()
    assert token.exists() and role.exists()
    # Without --fleet nothing of it is installed.
    other = tmp_path / "plain"
    assert install("--prefix", str(other), "--no-venv").returncode == 0
    assert not (other / "etc/systemd/system/edgerl-ray.service").exists()
    assert not (other / "etc/edgerl/ray-token").exists()


def test_install_refuses_unknown_options():
    r = install("--prefx", "/tmp")
    assert r.returncode == 2 and "unknown option --prefx" in r.stderr


def test_example_service_config_is_valid():
    from edgerl.config import build_layers, resolve

    cfg = resolve(build_layers(REPO / "systemd" / "edgerl.toml.example", use_system=False))
    assert cfg.hw.max_clocks is True and cfg.env.id == "ALE/Pong-v5"


NO_SYSTEMD_ANALYZE = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed (Debian: apt-get install systemd; .ci/run does)",
)


def installed_unit(tmp_path: Path) -> Path:
    assert install("--prefix", str(tmp_path), "--no-venv").returncode == 0
    edgerl = tmp_path / "opt/edgerl/venv/bin/edgerl"
    edgerl.parent.mkdir(parents=True)
    edgerl.symlink_to(Path(sys.executable).with_name("edgerl"))
    return tmp_path / "etc/systemd/system/edgerl.service"


@NO_SYSTEMD_ANALYZE
def test_unit_passes_systemd_analyze_verify(tmp_path):
    unit = installed_unit(tmp_path)
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


MOST_EXPOSED = 4.0  # systemd-analyze security: 6.8 MEDIUM while the service ran as root


@NO_SYSTEMD_ANALYZE
def test_the_unit_runs_with_the_least_privilege_it_needs(tmp_path):
    unit = installed_unit(tmp_path)
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = re.search(r"Overall exposure level for edgerl.service: (\d+\.\d+)", r.stdout)
    assert exposure, r.stdout + r.stderr
    assert float(exposure[1]) <= MOST_EXPOSED, r.stdout
    text = unit.read_text()
    assert "User=edgerl" in text and "CapabilityBoundingSet=\n" in text
    # Only the clock steps run as root ("+"); the trainer never does.
    privileged = [line for line in text.splitlines() if re.match(r"Exec\w+=[-@:]*\+", line)]
    assert [p.split("edgerl ", 1)[1] for p in privileged] == [
        "hw clocks max --service",
        "hw clocks restore",
    ]
    assert re.search(r"^ExecStart=/\S+/edgerl daemon$", text, re.MULTILINE)


MOST_EXPOSED_SERVE = 2.0  # 1.3 when written: it must listen, and read the edgerl group's runs


@NO_SYSTEMD_ANALYZE
def test_the_web_unit_reads_the_runs_and_nothing_more(tmp_path):
    installed_unit(tmp_path)
    unit = tmp_path / "etc/systemd/system/edgerl-serve.service"
    r = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    exposure = re.search(r"Overall exposure level for edgerl-serve.service: (\d+\.\d+)", r.stdout)
    assert exposure, r.stdout + r.stderr
    assert float(exposure[1]) <= MOST_EXPOSED_SERVE, r.stdout
    text = unit.read_text()
    # A user of its own at each start, in the group that may read the runs; nothing as root.
    assert "DynamicUser=yes" in text and "SupplementaryGroups=edgerl\n" in text
    assert not [line for line in text.splitlines() if re.match(r"Exec\w+=[-@:]*\+", line)]
    # It listens beyond the board, so with the token install.sh made; training stays offline.
    assert re.search(r"^ExecStart=/\S+/edgerl serve --host 0.0.0.0 .*--token-file ", text, re.M)
    assert (tmp_path / "etc/edgerl/serve-token").stat().st_mode & 0o777 == 0o600
    assert "PrivateNetwork=yes" in (tmp_path / "etc/systemd/system/edgerl.service").read_text()


def test_the_service_user_is_made_when_the_system_is_installed():
    if os.geteuid() != 0:
        pytest.skip("installing for the system (even as a dry run) needs root")
    r = install("--dry-run", "--no-venv")
    assert r.returncode == 0, r.stderr
    user = subprocess.run(["getent", "passwd", "edgerl"], capture_output=True).returncode == 0
    useradd = "+ useradd --system --gid edgerl --home-dir /var/lib/edgerl --no-create-home"
    assert (useradd in r.stdout) is not user, r.stdout
    jtop = subprocess.run(["getent", "group", "jtop"], capture_output=True).returncode == 0
    assert ("+ usermod -aG jtop edgerl" in r.stdout) is jtop
    # A fleet's new token is given to the user the Ray node and the learner run as.
    r = install("--dry-run", "--no-venv", "--fleet")
    assert r.returncode == 0, r.stderr
    new = not Path("/etc/edgerl/ray-token").exists()
    assert ("+ chown edgerl:edgerl /etc/edgerl/ray-token" in r.stdout) is new, r.stdout


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shell_scripts_pass_shellcheck():
    r = subprocess.run(
        ["shellcheck", str(INSTALL), str(REPO / ".ci" / "run")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout
