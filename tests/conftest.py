"""Shared fixtures: an isolated environment, helpers to run the real CLI, a live Pong trainer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# One torch thread in tests and in the processes they start (which inherit the environment). CI
# shares its cores: a parallel region waits for its slowest thread, and on a loaded machine that
# thread is often preempted (one 800-step Pong test took 217 s with two threads and 34 s with one,
# side by side on the same loaded 2-core machine). Results do not depend on the thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

from edgerl.cli import main

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No system config, no real Jetson files, no user cache, cwd in a temporary directory."""
    monkeypatch.setenv("EDGERL_SYSTEM_CONFIG", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CACHE_DIRECTORY", raising=False)
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")
    monkeypatch.chdir(tmp_path)
    yield


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """Run ``edgerl ARGS`` in-process; returns exit code, stdout and stderr."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run


def edgerl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgerl.cli", *[str(a) for a in args]]


def run_edgerl(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``edgerl ARGS`` as a real process (for signals, exit codes, separate state)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        edgerl_cmd(*args), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )


# Small Pong settings: learning starts early, replay tiny, rows and checkpoints often.
PONG_FAST = [
    "--env",
    "ALE/Pong-v5",
    "--set",
    "env.num_envs=2",
    "--set",
    "agent.learning_starts=100",
    "--set",
    "agent.batch_size=8",
    "--set",
    "agent.train_freq=16",
    "--set",
    "replay.capacity=2000",
    "--set",
    "train.log_every_s=0.2",
    "--set",
    "perf.compile=off",  # long runs would first try torch.compile (20-50 s)
]


def start_trainer(run: Path, steps: int = 10_000_000, every: int = 1) -> subprocess.Popen:
    args = [
        "train",
        *PONG_FAST,
        "--steps",
        str(steps),
        "--run-dir",
        str(run),
        "--set",
        f"display.every={every}",
        "--quiet",
    ]
    return subprocess.Popen(
        edgerl_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM, as systemd stops the service; its stderr once it has exited. A loaded machine
    can take a minute or more to write the last checkpoint and tear down the threads."""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    return err


@pytest.fixture
def live_trainer(tmp_path):
    run = tmp_path / "pong"
    proc = start_trainer(run)
    deadline = time.monotonic() + 300  # a loaded machine takes minutes to start a trainer
    while not (run / "display.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()  # before reading its stderr: that read waits for the process to end
            pytest.fail(f"the trainer did not start its display: {proc.communicate()[1]}")
        time.sleep(0.1)
    yield run, proc
    if proc.poll() is None:
        stop(proc)


FIXTURES = Path(__file__).parent / "fixtures"
STANDINS = Path(__file__).parent / "standins"


@dataclass
class FakeJetson:
    """A board below EDGERL_HW_ROOT plus jetson_clocks/tegrastats/nvpmodel stand-ins on PATH."""

    root: Path
    state: Path  # the stand-ins' own state and calls.jsonl
    env: dict[str, str]

    def calls(self, tool: str | None = None) -> list[list[str]]:
        import json

        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [
            ([r["tool"]] if tool is None else []) + r["argv"]
            for r in rows
            if tool is None or r["tool"] == tool
        ]


@pytest.fixture
def fake_jetson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJetson:
    """A Jetson Nano (L4T 32.7.1) with tools that replay captured output."""
    import shutil

    root = tmp_path / "hwroot"
    shutil.copytree(FIXTURES / "boards" / "nano_jp4", root)
    state = tmp_path / "standin-state"
    state.mkdir()
    env = {
        "EDGERL_HW_ROOT": str(root),
        "EDGERL_STANDIN_DIR": str(state),
        "EDGERL_STANDIN_FIXTURES": str(FIXTURES),
        "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return FakeJetson(root, state, env)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``EDGERL_FAILURE_LOG=FILE``, append each failure's traceback to FILE as it happens.

    pytest prints tracebacks only at the end of the session; on a machine lent for minutes a run
    cut off by its time limit would lose them (scripts/gpu_check.sh sets this).
    """
    path = os.environ.get("EDGERL_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
