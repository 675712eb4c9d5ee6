"""The board's first start (service/daemon.py, run/calibrate.py, cli/training.py): signal handlers
first, a word at once, the clocks maxed before the machine is measured, STATUS= naming the
measurement, a stop while measuring that stops within seconds and says so; a game the runs on
record do not cover is never measured as Pong."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from .conftest import FIXTURES, edgerl_cmd
from .test_daemon import STARTED, NotifySocket, no_daemon_outlives_its_test, notify  # noqa: F401

PROMPT_S = 60  # a stop while measuring must end the process within this (10 s on an idle board)


class Said:
    """A process's stderr read line by line as it comes (a reader thread), to wait for a line
    without blocking on a process that hangs."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.text = ""
        self._arrived = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._arrived:
                self.text += line
                self._arrived.notify_all()

    def wait_for(self, text: str, timeout: float = 300) -> str:
        """Everything said up to the first line holding ``text``; a hang fails the test with
        the process's threads dumped (faulthandler, on SIGABRT)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while text not in self.text:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                self._arrived.wait(min(left, 0.5))
            if text in self.text:
                return self.text[: self.text.index(text) + len(text)]
        self.fail(f"no {text!r} within {timeout} s")
        raise AssertionError  # not reached

    def ended(self, timeout: float = PROMPT_S) -> str:
        """All it said, once it has ended within ``timeout`` (else dumped and failed)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"still running {timeout} s later")
        self._reader.join(timeout=30)
        return self.text

    def fail(self, why: str) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._reader.join(timeout=30)
        pytest.fail(f"{why}; it said:\n{self.text}")


@pytest.fixture
def orin(fake_jetson):
    """The emulated Jetson AGX Orin (JetPack 6) with the jetson_clocks stand-in on PATH."""
    shutil.rmtree(fake_jetson.root)
    shutil.copytree(FIXTURES / "boards" / "agx_orin_jp6", fake_jetson.root)
    return fake_jetson


def recipe_config(tmp_path: Path, game: str = "", steps: int = 0) -> Path:
    """A service config that chooses no learner: the service trains this machine's recipe
    (for ``game``, where given, for ``steps``)."""
    cfg = tmp_path / "edgerl.toml"
    env = f'[env]\nid = "{game}"\n' if game else ""
    cfg.write_text(
        env
        + f'[train]\nrun_dir = "{tmp_path / "run"}"\n'
        + (f"steps = {steps}\n" if steps else "")
        + f'[hw]\nstate_dir = "{tmp_path / "state"}"\nmonitor_interval_ms = 200\n'
    )
    return cfg


def start(args: list[str], **env: str) -> Said:
    full = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "INVOCATION_ID")}
    proc = subprocess.Popen(
        edgerl_cmd(*args),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**full, "PYTHONFAULTHANDLER": "1", **env},
    )
    STARTED.append(proc)
    return Said(proc)


def test_by_hand_it_speaks_first_maxes_the_clocks_then_measures_and_a_sigterm_stops_it(
    tmp_path, orin
):
    daemon = start(["daemon", "--config", str(recipe_config(tmp_path))])
    first = daemon.wait_for("not started by systemd")
    assert "calibration" not in first and "clocks" not in first, first  # the first words
    assert "with this machine's recipe (measured at its first start" in daemon.wait_for(
        f"in {tmp_path / 'run'}"
    )
    before = daemon.wait_for("calibration: measuring pong-cpu (1 of")
    assert (orin.state / "clocks.maxed").exists()  # measured at the clocks it trains at
    assert "clocks at maximum" in before, before
    daemon.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    said = daemon.ended()
    assert time.monotonic() - stopped < PROMPT_S
    assert daemon.proc.returncode == 0, said
    assert "calibration: stopped by SIGTERM while measuring pong-cpu (1 of" in said, said
    assert "stopped by SIGTERM during start-up: no step was taken, nothing was lost" in said
    assert "Traceback" not in said
    jc = [c[0] if c else "max" for c in orin.calls("jetson_clocks")]
    assert jc == ["--store", "max", "--restore"]  # restored on the way out
    assert not list((tmp_path / "cache").rglob("calibration.json"))  # nothing half-measured


def test_under_systemd_status_names_the_measurement_before_ready(tmp_path, orin, notify):  # noqa: F811
    daemon = start(
        ["daemon", "--config", str(recipe_config(tmp_path))], NOTIFY_SOCKET=notify.address
    )
    starting = notify.wait_for("STATUS", contains="starting: trains ALE/Pong-v5", timeout=300)
    measuring = notify.wait_for("STATUS", contains="measuring pong-cpu (1 of", timeout=300)
    assert float(starting["_arrived"]) <= float(measuring["_arrived"])
    assert int(measuring["EXTEND_TIMEOUT_USEC"]) >= 60_000_000  # may outlast TimeoutStartSec=
    assert not any("READY" in m for m in notify.messages)
    daemon.proc.send_signal(signal.SIGTERM)
    notify.wait_for("STOPPING", "1", timeout=PROMPT_S)
    said = daemon.ended()
    assert daemon.proc.returncode == 0, said
    assert "stopped by SIGTERM while measuring" in said, said
    assert not any("READY" in m for m in notify.messages)


def test_ctrl_c_while_preset_board_measures_stops_at_once_with_one_sentence(tmp_path):
    train = start(["train", "--preset", "board", "--run-dir", str(tmp_path / "run")])
    train.wait_for("calibration: measuring pong-cpu (1 of")
    train.proc.send_signal(signal.SIGINT)
    said = train.ended()
    assert train.proc.returncode == 130, said
    assert "calibration: stopped by SIGINT while measuring pong-cpu (1 of" in said, said
    last = said.strip().splitlines()[-1]
    assert last == "stopped by SIGINT during start-up: no step was taken, nothing was lost", said
    assert "Traceback" not in said


def test_a_vector_game_with_no_learner_is_not_measured_as_pong(tmp_path, caplog):
    """CartPole-v1 in a config that names no learner: the defaults for its family, said
    plainly, nothing measured; a 30,000-step run is evaluated 10 times (it had none)."""
    import logging

    from edgerl.service.daemon import daemon_config

    caplog.set_level(logging.INFO)
    cfg = daemon_config(recipe_config(tmp_path, "CartPole-v1", 30_000))
    assert cfg.env.id == "CartPole-v1"
    assert "defaults for games of vector observations, not measured" in cfg.train.recipe
    assert "pong" not in cfg.train.recipe.lower().split("(the runs on record")[0]
    assert "calibration: measuring" not in caplog.text
    assert not list((tmp_path / "cache").rglob("calibration.json"))
    assert cfg.eval.every_steps == 3_000


def test_another_atari_game_trains_the_class_recipe_as_it_is_unmeasured(tmp_path, caplog):
    import logging

    from edgerl.service.daemon import daemon_config

    caplog.set_level(logging.INFO)
    cfg = daemon_config(recipe_config(tmp_path, "ALE/Breakout-v5"))
    assert cfg.env.id == "ALE/Breakout-v5" and cfg.agent.algo == "pqn"
    assert "not measured: no run of ALE/Breakout-v5 on record" in cfg.train.recipe
    assert "calibration: measuring" not in caplog.text
    assert not list((tmp_path / "cache").rglob("calibration.json"))
    assert cfg.eval.every_steps == 100_000  # the recipe's own fits its 2,000,000 steps


def test_pong_says_what_it_builds_and_a_ctrl_c_meanwhile_stops_with_one_sentence(tmp_path):
    """128 Pong environments (PQN's, as its recipes build them): it says it is building them
    and that ALE does it in one call, which hears no stop until it returns (a minute and more
    on a loaded 2-core machine: the deadline is that of the build, not of the stop); a Ctrl-C
    meanwhile is said at once, while ALE still builds (a helper reads Python's wakeup pipe), and
    ends the start-up with one sentence as the call returns (issue 73, item 4)."""
    pong = ["--env", "ALE/Pong-v5", "--set", "env.num_envs=128", "--set", "agent.algo=pqn"]
    train = start(["train", *pong, "--steps", "1000", "--run-dir", str(tmp_path / "run")])
    train.wait_for("building 128 environments of ALE/Pong-v5 (ALE builds them in one call")
    time.sleep(1)  # most likely inside ALE's call by now; before it is checked below too
    train.proc.send_signal(signal.SIGINT)
    heard = "INFO SIGINT heard while ALE builds 128 environments of ALE/Pong-v5 in one call: "
    said = train.ended(timeout=600)
    built = "128 environments built in"
    if heard in said:  # inside the call: said at once, before the call returned
        assert "that call holds Python, so edgerl stops as soon as it returns" in said, said
        assert built not in said or said.index(heard) < said.index(built), said
    else:  # before it: Python's handler said it, and nothing was built
        assert "SIGINT: stopping the start-up where it can" in said and built not in said, said
    assert train.proc.returncode == 130, said
    assert "SIGINT: stopping the start-up where it can" in said, said
    last = said.strip().splitlines()[-1]
    assert last == "stopped by SIGINT during start-up: no step was taken, nothing was lost", said
    assert "Traceback" not in said
