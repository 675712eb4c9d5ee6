"""The first run (quick.py): ``edgerl train --quick`` (what ``make run`` runs) picks a game the
machine learns in minutes, and a long Atari run on a CPU is said to be hopeless at its start."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from edgerl.config.parse import tomllib
from edgerl.report import quick


def resolved(cli, *args: str) -> dict:
    r = cli("config", *args)
    assert r.code == 0, r.err
    return tomllib.loads(r.out)


def test_quick_is_cartpole_on_a_cpu_and_pong_on_a_gpu(cli, monkeypatch):
    monkeypatch.setattr(quick, "uses_cuda", lambda device: False)
    cfg = resolved(cli, "--quick")
    assert cfg["env"]["id"] == "CartPole-v1" and cfg["train"]["steps"] == 60_000
    monkeypatch.setattr(quick, "uses_cuda", lambda device: device != "cpu")
    cfg = resolved(cli, "--quick")
    assert cfg["env"]["id"] == "ALE/Pong-v5" and cfg["train"]["steps"] == 500_000
    assert cfg["agent"]["train_freq"] == 1 and cfg["env"]["repeat_action_probability"] == 0.0
    cfg = resolved(cli, "--quick", "--set", "perf.device=cpu")  # a GPU the user does not want
    assert cfg["env"]["id"] == "CartPole-v1"


def test_quick_keeps_what_the_command_line_says(cli, monkeypatch):
    monkeypatch.setattr(quick, "uses_cuda", lambda device: False)
    cfg = resolved(cli, "--quick", "--env", "ALE/Breakout-v5")  # its game, Atari's quick values
    assert cfg["env"]["id"] == "ALE/Breakout-v5" and cfg["train"]["steps"] == 500_000
    cfg = resolved(cli, "--quick", "--steps", "20k", "--set", "agent.lr=0.001")
    assert cfg["train"]["steps"] == 20_000 and cfg["agent"]["lr"] == 0.001


def test_a_quick_run_ends_by_saying_what_to_look_at_next(cli, monkeypatch, tmp_path):
    monkeypatch.setattr(quick, "uses_cuda", lambda device: False)
    run = tmp_path / "first"
    r = cli("train", "--quick", "--steps", "300", "--run-dir", run, "--quiet")
    assert r.code == 0, r.err
    assert f"next: edgerl plot --terminal --run-dir {run}" in r.err
    assert f"next: edgerl play --run-dir {run} --episodes 3" in r.err
    assert "not installed here" not in r.err  # the test extras hold every command's


def test_a_quick_run_names_the_commands_whose_extras_are_missing(cli, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    gone = {"onnx", "aiohttp"}
    monkeypatch.setattr(quick, "uses_cuda", lambda device: False)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in gone else real(name, *a)
    )
    r = cli("train", "--quick", "--steps", "300", "--run-dir", tmp_path / "run", "--quiet")
    assert r.code == 0, r.err
    said = next(x for x in r.err.splitlines() if x.startswith("not installed here"))
    assert "edgerl export (the export extra)" in said and "edgerl serve (the web extra)" in said
    assert "edgerl view" not in said and "make run EXTRAS=commands" in said


def test_the_hints_name_edgerl_as_the_shell_can_run_it(tmp_path):
    """Not a bare `edgerl` that the shell cannot find (`make run` starts .venv/bin/edgerl)."""
    from edgerl.cli.app import command_name

    on_path = tmp_path / "bin"
    on_path.mkdir()
    script = on_path / "edgerl"
    script.write_text("")
    script.chmod(0o755)
    assert command_name([str(script)], [], path=str(on_path)) == "edgerl"  # an activated venv
    assert command_name([".venv/bin/edgerl"], [], path=str(tmp_path)) == ".venv/bin/edgerl"
    assert command_name([str(script)], [], path="/nowhere") == str(script)
    orig = ["python3", "-m", "edgerl.cli", "train"]
    assert command_name(["/x/edgerl/cli/__main__.py"], orig) == "python3 -m edgerl.cli"
    assert command_name(["/x/pytest"], ["python3", "-m", "pytest"]) == "edgerl"


def test_the_next_commands_a_quick_run_prints_run_when_pasted(tmp_path):
    """As `make run` starts it: by the path of a venv's edgerl script, not on PATH."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "edgerl"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom edgerl.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no edgerl on it
    assert shutil.which("edgerl", path=env["PATH"]) is None
    run = tmp_path / "first run"  # a space: the hint quotes it
    cmd = ["venv/bin/edgerl", "train", "--quick", "--steps", "300", "--run-dir", run, "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    # One command a line, its comment after a shell's #: the whole line pastes.
    hints = [x.removeprefix("next: ") for x in r.stderr.splitlines() if x.startswith("next: ")]
    assert len(hints) == 2 and "plot --terminal" in hints[0] and "play" in hints[1], hints
    assert all(h.startswith("venv/bin/edgerl ") and "   # " in h for h in hints), hints
    for hint in hints:
        pasted = subprocess.run(
            ["bash", "-c", hint], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
        )
        assert pasted.returncode == 0, (hint, pasted.stderr)
