"""A learner added as docs/development.md says (one module, one registry entry) works with every
command: it trains, keeps its best policy, resumes, plays and exports, and nothing outside the
registry names it."""

from __future__ import annotations

import pytest

from edgerl.config.learners import LEARNERS, LearnerInfo

TOY = ["--env", "CartPole-v1", "--set", "agent.algo=toy", "--set", "env.num_envs=4"]
SMALL = ["--set", "pqn.rollout_steps=16", "--set", "eval.every_steps=1000"]


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(
        LEARNERS, "toy", LearnerInfo("tests.toy_learner", memory="rollout", beside_actor="")
    )


def test_a_learner_registered_in_one_line_trains_resumes_plays_and_exports(
    toy_registered, cli, tmp_path
):
    run = tmp_path / "toy"
    r = cli("train", *TOY, *SMALL, "--run-dir", run, "--steps", "2000", "--quiet")
    assert r.code == 0, r.err[-3000:]
    assert "one-step Q" in r.err  # the factory built it: the log says how it learns
    assert (run / "checkpoints" / "best.ckpt").is_file()  # evaluated, its best kept
    r = cli("train", *TOY, *SMALL, "--run-dir", run, "--steps", "3000", "--quiet")
    assert r.code == 0 and "step 3,000/3,000" in r.err, r.err[-3000:]
    r = cli("play", "--run-dir", run, "--episodes", "1", "--json")
    assert r.code == 0 and '"episodes"' in r.out, r.err
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    r = cli("export", "--run-dir", run, "--onnx")
    assert r.code == 0 and ".onnx" in r.out, r.err[-3000:]


def test_an_unregistered_learner_is_refused_with_the_ones_there_are(cli, tmp_path):
    r = cli("train", *TOY, "--run-dir", tmp_path / "x", "--steps", "100")
    assert r.code == 2 and "agent.algo" in r.err and "dqn, pqn" in r.err, r.err
