"""`edgerl status` of a real trainer: replay filling, the run's newest checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from .conftest import PONG_FAST, edgerl_cmd


def test_status_says_the_replay_fills_and_shows_the_runs_checkpoint(cli, tmp_path):
    run = tmp_path / "cp"
    first = ["train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run, "--quiet"]
    assert cli(*first).code == 0
    older = sorted((run / "checkpoints").glob("*.ckpt"))[-1]
    second = edgerl_cmd(
        *["train", "--env", "CartPole-v1", "--steps", "10M", "--run-dir", run, "--quiet"],
        *["--set", "agent.learning_starts=50000000", "--set", "replay.capacity=100000000"],
        *["--set", "train.checkpoint_every_s=100000"],
    )
    log = (tmp_path / "second.log").open("w")  # not a pipe: reading one waits for its end
    proc = subprocess.Popen(second, stdout=log, stderr=log, text=True)
    try:
        deadline = time.monotonic() + 600  # a loaded machine takes minutes to start a trainer
        while True:  # until this session has reported steps of its own
            alive = proc.poll() is None
            assert alive and time.monotonic() < deadline, (tmp_path / "second.log").read_text()
            doc = json.loads((run / "status.json").read_text())
            if doc.get("step", 0) > 300 and doc.get("learning_starts"):  # a progress write
                break
            time.sleep(0.2)
        r = cli("status", "--run-dir", run)
        assert r.code == 0, r.err
        assert "filling replay " in r.out
        assert "/50,000,000: learning starts at step 50,000,300" in r.out
        assert f"checkpoint: {older}" in r.out  # written by the earlier session
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


def test_a_run_whose_games_have_not_ended_says_why_it_shows_no_episode(cli, tmp_path):
    """Pong after a few short sessions showed "0 episodes" and "mean return n/a" and nothing
    else: it looked broken. It says why (games played to the end, started over by a resume)."""
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run, "--quiet").code == 0
    r = cli("status", "--run-dir", run)
    assert r.code == 0 and "0 episodes" in r.out, r.out
    assert "no episode has ended yet" in r.out and "every resume starts the games" in r.out
    cartpole = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", cartpole).code == 0
    assert "no episode has ended yet" not in cli("status", "--run-dir", cartpole).out


@pytest.mark.parametrize(
    ("algo", "game"), [("sac", "Pendulum-v1"), ("ppo", "CartPole-v1"), ("dqn", "CartPole-v1")]
)
def test_status_shows_epsilon_only_for_a_learner_that_explores_by_it(cli, tmp_path, algo, game):
    """SAC explores by its policy's noise once learning starts and PPO by sampling its actions:
    "epsilon 0.0" in their status (a 0 in status.json, so on the web page and in /metrics) said
    nothing true. Their status.json holds null there and `edgerl status` no epsilon; DQN's
    epsilon-greedy exploration is shown."""
    run = tmp_path / "run"
    sets = ["--set", f"agent.algo={algo}", "--set", "agent.learning_starts=200"]
    sets += ["--set", "agent.batch_size=32", "--set", "agent.hidden=[32, 32]"]
    r = cli("train", "--env", game, *sets, "--steps", "400", "--run-dir", run, "--quiet")
    assert r.code == 0, r.err[-2000:]
    doc = json.loads((run / "status.json").read_text())
    assert (doc["epsilon"] is None) == (algo != "dqn"), doc["epsilon"]
    r = cli("status", "--run-dir", run)
    assert r.code == 0 and (", epsilon " in r.out) == (algo == "dqn"), r.out


def test_a_status_whose_fleet_nests_without_end_is_damaged_in_one_sentence(tmp_path):
    """A fleet 600 levels deep (a hostile or broken status.json) is named as damaged by the
    reader that the web page and `edgerl status` share, before anything walks it."""
    import json

    from edgerl.errors import RunDirError
    from edgerl.report.status import read_status

    deep: dict = {}
    node = deep
    for _ in range(600):
        node["a"] = {}
        node = node["a"]
    doc = {"state": "training", "pid": 1, "updated_unix": 1.0, "fleet": deep}
    (tmp_path / "status.json").write_text(json.dumps(doc))
    with pytest.raises(RunDirError, match="fleet nests deeper than 6 levels"):
        read_status(tmp_path)


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"figures": {"elite_score": 10**400}}, "figures is not a few named numbers"),
        ({"figures": {"elite_score": "high"}}, "figures is not a few named numbers"),
        ({"figures": {f"f{i}": 1.0 for i in range(17)}}, "figures is not a few named numbers"),
        ({"figures": [1, 2]}, "figures is"),
        ({"step": 10**400}, "step is"),
    ],
)
def test_a_learners_figures_and_counts_out_of_range_are_damage_never_a_crash(tmp_path, extra, why):
    """Integers of any size are compared, never passed to math.isfinite (which overflows)."""
    import json

    from edgerl.errors import RunDirError
    from edgerl.report.status import read_status

    doc = {"state": "training", "pid": 1, "updated_unix": 1.0, **extra}
    (tmp_path / "status.json").write_text(json.dumps(doc))
    with pytest.raises(RunDirError, match=why):
        read_status(tmp_path)
    ok = {"state": "training", "pid": 1, "updated_unix": 1.0, "figures": {"generation": 3}}
    (tmp_path / "status.json").write_text(json.dumps({**ok}))
    assert read_status(tmp_path)["figures"] == {"generation": 3}
