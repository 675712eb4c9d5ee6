"""What a run can expect (estimate.py): the record said at its start for its game and class of
machine, and the time its steps take at the pace measured here, said once."""

from __future__ import annotations

import logging

import pytest

from edgerl.config import build_layers, resolve
from edgerl.config.learners import LEARNERS
from edgerl.report import estimate
from edgerl.report.estimate import (
    PaceEstimate,
    expectation,
    pace_sentence,
    record_for,
    records,
)
from edgerl.run.train import Trainer


def test_a_run_expects_what_its_game_made_on_its_class_of_machine():
    cpu = expectation("ALE/Pong-v5", "pqn", gpu=False)
    assert (
        cpu is not None and "on record for ALE/Pong-v5 on a CPU, PQN reached a greedy 19.9" in cpu
    )
    assert "40 min 35 s into training, on a 2-core Intel Xeon" in cpu
    assert "(1.15 human-normalised)" in cpu and "runs/pong-cpu-2core" in cpu
    assert "follows the pace measured here" in cpu
    gpu = expectation("ALE/Pong-v5", "dqn", gpu=True)
    assert gpu is not None and "DQN reached a greedy 19.5" in gpu and "H100" in gpu
    # a game with nothing on record: Pong's record for the class, saying so
    other = expectation("ALE/Zaxxon-v5", "dqn", gpu=False)
    assert other is not None and "ALE/Zaxxon-v5 on a CPU: nothing on record; for Pong" in other
    assert "DQN reached" in other  # the same learner's record first


def test_every_record_is_a_game_edgerl_trains_and_a_run_on_disk():
    from pathlib import Path

    runs = Path(__file__).resolve().parents[1] / "docs" / "runs"
    for r in records():
        assert r.machine in ("cpu", "gpu") and r.algo in LEARNERS
        assert (runs / r.run / "eval.csv").is_file(), r.run


@pytest.mark.parametrize(
    ("pace", "left", "says"),
    [
        (500.0, 1_000_000, "the 1,000,000 steps left take about 33 min 20 s"),
        (200.0, 10_000_000, "the 10,000,000 steps left take about 14 hours"),
        (0.0, 1_000, "measured here: 0 env steps/s over the first 60 s of learning (x)"),
    ],
)
def test_the_pace_sentence_says_where_it_was_measured_and_what_is_left(pace, left, says):
    said = pace_sentence(pace, left, 60.0, "x")
    assert said.startswith(f"measured here: {pace:,.0f} env steps/s over the first 60 s")
    assert says in said


def test_an_atari_run_on_a_cpu_says_its_measured_pace_once_and_that_it_is_long(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(estimate, "MEASURE_S", 1.0)
    cfg = resolve(
        build_layers(
            None,
            [
                "agent.algo=pqn",
                "env.num_envs=4",
                "pqn.rollout_steps=8",
                "pqn.minibatches=2",
                "hw.monitor=false",
                "display.enabled=false",
                "eval.every_steps=0",
            ],
            {"env.id": "ALE/Pong-v5", "train.steps": 10**9, "train.run_dir": str(tmp_path)},
            use_system=False,
        )
    )
    hook = PaceEstimate(frames=True, gpu=False)

    class StopOnceSaid(PaceEstimate):
        def on_tick(self, run, stats):
            if hook.said is not None:
                run.request_stop("test")  # type: ignore[attr-defined]

    hooks = [hook, StopOnceSaid(True, False)]
    with (
        caplog.at_level(logging.INFO, logger="edgerl.report.estimate"),
        Trainer(cfg, quiet=True, hooks=hooks) as trainer,
    ):
        trainer.run()
    said = [r.getMessage() for r in caplog.records if "measured here" in r.getMessage()]
    assert len(said) == 1 and said[0] == hook.said
    assert "steps left take about" in said[0] and "days" in said[0]  # a billion steps
    assert "edgerl train --quick" in said[0]
    # the time to the target: when this run gets to the step Pong's PQN record reached 19.9 at
    assert (
        "the run on record reached a greedy 19.9 at step 1,500,032 (on a 2-core Intel Xeon): at "
        "this pace this run is at that step in about " in said[0]
    )
    # a second into learning no Pong game has ended: said, so that the run does not look dead
    assert "no episode has ended yet: each of the 4 environments plays its first game" in said[0]


def test_the_record_to_reach_is_the_same_game_learner_and_class_of_machine():
    pong_cpu = record_for("ALE/Pong-v5", "pqn", gpu=False)
    assert pong_cpu is not None and pong_cpu.run == "pong-cpu-2core"
    assert record_for("ALE/Pong-v5", "dqn", gpu=False).run == "pong-cpu-2core-dqn-epyc"
    assert record_for("ALE/Asterix-v5", "pqn", gpu=False) is None  # only the GA's is on record
    assert record_for("ALE/Asterix-v5", "ga", gpu=True) is None  # on a CPU, not a GPU
