"""`edgerl play` with the torch backend: JSON summary, determinism, errors."""

from __future__ import annotations

import json

import pytest

from .conftest import PONG_FAST


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    from edgerl.cli import main

    run = tmp_path_factory.mktemp("play") / "cartpole"
    assert (
        main(["train", "--env", "CartPole-v1", "--steps", "3000", "--run-dir", str(run), "--quiet"])
        == 0
    )
    return run


def test_json_summary(cli, cartpole_run):
    r = cli("play", "--run-dir", cartpole_run, "--episodes", "3", "--json", "--seed", "5")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["backend"] == "torch" and summary["env"] == "CartPole-v1"
    assert len(summary["returns"]) == 3 and summary["episodes"] == 3
    assert summary["return_mean"] == pytest.approx(sum(summary["returns"]) / 3)
    lat = summary["latency_us"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    assert summary["steps"] == sum(summary["returns"])  # CartPole: +1 per step


def test_same_seed_same_returns(cli, cartpole_run):
    runs = [
        json.loads(
            cli("play", "--run-dir", cartpole_run, "--episodes", "4", "--json", "--seed", "9").out
        )["returns"]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_a_checkpoint_file_and_epsilon(cli, cartpole_run):
    ckpt = sorted((cartpole_run / "checkpoints").iterdir())[-1]
    r = cli("play", "--checkpoint", ckpt, "--episodes", "2", "--epsilon", "1", "--json")
    assert r.code == 0
    assert max(json.loads(r.out)["returns"]) < 200  # random play does not balance long


def test_pong_play_reports_game_points(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "300", "--run-dir", run).code == 0
    r = cli("play", "--run-dir", run, "--episodes", "1", "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert -21 <= summary["returns"][0] <= 21 and summary["env"] == "ALE/Pong-v5"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-dir", "nowhere"], "run directory nowhere does not exist"),
        (["--model", "missing.ckpt"], "checkpoint missing.ckpt does not exist"),
        ([], "no run with checkpoints in"),
    ],
)
def test_errors(cli, args, message):
    r = cli("play", *args)
    assert r.code == 2 and message in r.err and "Traceback" not in r.err


def test_model_and_run_dir_together_is_a_usage_error(cli, tmp_path):
    r = cli("play", "--model", "a.ckpt", "--run-dir", "b")
    assert r.code == 2 and "not both" in r.err


def test_empty_run_dir(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    r = cli("play", "--run-dir", "empty")
    assert r.code == 2 and "has no checkpoint yet" in r.err


def test_env_mismatch(cli, cartpole_run):
    r = cli("play", "--run-dir", cartpole_run, "--env", "Acrobot-v1")
    assert r.code == 2 and "does not match" in r.err


def test_console_rendering(cli, cartpole_run):
    r = cli(
        "play",
        "--run-dir",
        cartpole_run,
        "--episodes",
        "1",
        "--epsilon",
        "1",
        "--render",
        "console",
        "--seed",
        "3",
    )
    assert r.code == 0, r.err
    screens = [s for s in r.out.split("\x1b[H\x1b[2J") if s.strip()]
    assert len(screens) >= 8
    for n, screen in enumerate(screens, start=1):  # CartPole has no frames: its numbers
        assert screen.startswith("obs [") and f"| step {n} | score +{n} | action " in screen


def test_screen_rendering_with_the_dummy_driver(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    r = cli(
        "play",
        "--run-dir",
        run,
        "--episodes",
        "1",
        "--render",
        "screen",
        "--fps",
        "100000",
        "--json",
    )
    assert r.code == 0, r.err
    assert json.loads(r.out.splitlines()[-1])["episodes"] == 1


def test_play_finds_the_newest_run_under_runs(cli, cartpole_run, tmp_path, monkeypatch):
    import os
    import shutil
    import time

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))  # no service run here
    (tmp_path / "runs" / "Old-v0" / "checkpoints").mkdir(parents=True)
    old = tmp_path / "runs" / "Old-v0" / "checkpoints" / "step-1.ckpt"
    old.write_bytes(b"not a checkpoint")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))  # an older run: not the one to play
    shutil.copytree(cartpole_run, tmp_path / "runs" / "CartPole-v1")  # cwd is tmp_path
    r = cli("play", "--episodes", "1", "--json")
    assert r.code == 0, r.err
    assert "playing the newest checkpoint of runs/CartPole-v1" in r.err
    assert json.loads(r.out.splitlines()[-1])["env"] == "CartPole-v1"
