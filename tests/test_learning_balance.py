"""The learning balance (edgerl.report.balance.LearningRatio): the learner's ratio (PQN's epochs)
moved one value at a time toward the least predicted time to target, only among the values at
which at least MIN_REACHING runs on record reached it in the run's pipeline and precision (the
calibration's rule); held still where it may not move; in a real run, logged, in
metrics.csv, kept by the checkpoint and a resume; and the calibration weighing the same values."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from edgerl.config import build_layers, resolve, with_values
from edgerl.config import targets as targets_module
from edgerl.config.targets import MIN_REACHING, SampleRun, ratio_points, settings_of
from edgerl.report import balance
from edgerl.report.balance import LearningRatio
from edgerl.run.train import Trainer

# Pong on two CPU cores as measured (the calibration's figures on the Intel Xeon): the actor
# alone 1,665 env steps/s, the learner alone 793 at 2 epochs.
ACTOR_S, LEARNER_S = 1 / 1665, 1 / 793


def ratio(samples: dict[int, int], value: int, mode: str = "sync") -> tuple[LearningRatio, list]:
    """A learning balance whose learner's time per env step is proportional to its epochs."""
    applied: list[int] = []
    r = LearningRatio("pqn.epochs", value, samples, mode, applied.append, cost=float)
    return r, applied


MINUTE = balance.RATIO_MEASURE_S  # a window long enough to decide on


def test_where_the_learner_is_the_limit_a_cheaper_value_wins_if_its_samples_allow():
    """Two cores, one loop: 1 epoch halves the learner's time (812 env steps/s against 537),
    so 1.6M env steps at 1 epoch beat 1.2M at 2; 2.4M would not."""
    r, applied = ratio({1: 1_600_000, 2: 1_200_000}, 2)
    move = r.window(10_000, MINUTE, 10_000 * ACTOR_S, 10_000 * LEARNER_S)
    assert move is not None and (move.old, move.new) == (2, 1) and applied == [1]
    assert "1,600,000 env steps to target on record at 1, 812 env steps/s" in move.reason
    assert "32 min 50 s of training to target against 37 min 14 s at 2 (537" in move.reason
    assert r.value == 1
    assert r.window(10_000, MINUTE, 10_000 * ACTOR_S, 10_000 * LEARNER_S / 2) is None  # stays

    r, applied = ratio({1: 2_400_000, 2: 1_200_000}, 2)
    assert r.window(10_000, MINUTE, 10_000 * ACTOR_S, 10_000 * LEARNER_S) is None
    assert applied == []


def test_where_the_learner_waits_the_value_that_learns_more_per_step_costs_nothing():
    """A GPU learner on its own thread, 5 times as fast as the emulator at 1 epoch: 2 epochs
    keep the loop at the emulator's speed and need fewer env steps."""
    r, applied = ratio({1: 1_600_000, 2: 1_200_000}, 1, mode="async")
    move = r.window(10_000, MINUTE, 10_000 / 8_000, 10_000 / 40_000)
    assert move is not None and (move.old, move.new) == (1, 2) and applied == [2]
    # the same figures in one loop: the learner's time adds to the actor's, and 2 still wins
    # (6,667 -> 5,714 env steps/s costs less than 1.6M -> 1.2M saves)
    r, _ = ratio({1: 1_600_000, 2: 1_200_000}, 1)
    assert r.window(10_000, MINUTE, 10_000 / 8_000, 10_000 / 40_000) is not None


def test_a_decision_waits_for_a_minute_of_windows_and_moves_one_value_at_a_time():
    r, applied = ratio({1: 1_000_000, 2: 1_200_000, 4: 1_300_000}, 4)
    third = MINUTE / 3
    assert r.window(3_000, third, 3_000 * ACTOR_S, 3_000 * LEARNER_S * 2) is None
    assert r.window(3_000, third, 3_000 * ACTOR_S, 3_000 * LEARNER_S * 2) is None
    assert r.window(3_000, third, 3_000 * ACTOR_S, 3_000 * LEARNER_S * 2).new == 2  # best is 1
    assert r.window(10_000, MINUTE, 10_000 * ACTOR_S, 10_000 * LEARNER_S).new == 1
    assert applied == [2, 1]
    # from 4, with 1 the best but 2 worse than staying: no move (a neighbour must gain itself)
    r, applied = ratio({1: 500_000, 2: 1_300_000, 4: 1_300_000}, 4, mode="async")
    assert r.window(10_000, MINUTE, 10_000 / 1_000, 10_000 / 2_000) is None and applied == []
    r, applied = ratio({1: 1_000_000, 2: 1_200_000}, 2)
    assert r.window(10_000, MINUTE, 10_000 * ACTOR_S, math.nan) is None  # a GPU in one loop
    assert r.window(0, MINUTE, 0.0, 0.0) is None
    assert applied == []
    with pytest.raises(ValueError, match="no run on record"):
        ratio({1: 1_000_000, 2: 1_200_000}, 3)


# -- a real run, with a stand-in record ---------------------------------------------------------


def cartpole(tmp_path, *sets: str, steps: int = 40_000):
    cfg = resolve(
        build_layers(
            None,
            [
                "agent.algo=pqn",
                "hw.monitor=false",
                "display.enabled=false",
                "train.log_every_s=0.2",
                "perf.balance_every_s=2",
                *sets,
            ],
            {"env.id": "CartPole-v1", "train.steps": steps, "train.run_dir": str(tmp_path)},
            use_system=False,
        )
    )
    from edgerl.config.presets import apply_presets

    return apply_presets(cfg, "vector")


def on_record(
    monkeypatch,  # type: ignore[no-untyped-def]
    cfg,
    reached: dict[int, int],
    runs: int = MIN_REACHING,
    pipeline: str = "sync",
    precision: str = "fp32",
) -> None:
    """Stand-in runs on record: ``runs`` runs of ``cfg`` at each epochs value, in ``pipeline``
    at ``precision``, each reaching the target at the step given (0: never)."""
    rows = tuple(
        SampleRun(
            cfg.env.id,
            "pqn",
            475.0,
            settings_of(with_values(cfg, {"pqn.epochs": epochs})),
            pipeline,
            precision,
            10_000,
            f"stand-in-{epochs}-{i}",
            step,
            max(step, 100_000),
        )
        for epochs, step in reached.items()
        for i in range(runs)
    )
    monkeypatch.setattr(targets_module, "sample_runs", lambda: rows)


def test_only_values_that_reached_the_target_on_record_are_offered(tmp_path, monkeypatch):
    cfg = cartpole(tmp_path)
    assert cfg.pqn.epochs == 4  # the vector preset's
    on_record(monkeypatch, cfg, {1: 50_000, 2: 0, 4: 40_000, 8: 30_000})
    points = ratio_points(cfg, "sync", "fp32")
    assert {v: p.steps for v, p in points.items()} == {1: 50_000, 4: 40_000, 8: 30_000}
    other = with_values(cfg, {"pqn.lam": 0.5})  # another setting: those runs say nothing
    assert ratio_points(other, "sync", "fp32") == {}
    assert ratio_points(with_values(cfg, {"agent.algo": "dqn"}), "sync", "fp32") == {}  # no key
    # another pipeline or precision: those runs say nothing either
    assert ratio_points(cfg, "async", "fp32") == {} and ratio_points(cfg, "sync", "bf16") == {}


def test_values_backed_by_fewer_than_three_runs_at_the_target_are_not_offered(
    tmp_path, monkeypatch
):
    """Two runs at the target give a median, not a value to move to: the calibration's rule."""
    cfg = cartpole(tmp_path)
    on_record(monkeypatch, cfg, {1: 50_000, 4: 40_000}, runs=MIN_REACHING - 1)
    assert ratio_points(cfg, "sync", "fp32") == {}


def epochs_column(run_dir) -> list[float]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [float(row["epochs"]) for row in csv.DictReader(f)]


def test_a_run_moves_its_epochs_says_so_and_a_resume_keeps_them(tmp_path, monkeypatch, caplog):
    """CartPole's PQN at 4 epochs, with runs on record at 1 and 4 that needed as many env
    steps: in one loop on the CPU, 1 epoch costs less for the same learning, and the run moves
    to it after a window; the move is logged and shown, every later metrics row says 1, the
    checkpoint keeps it and a resume learns at 1 epoch again."""
    cfg = cartpole(tmp_path)
    on_record(monkeypatch, cfg, {1: 40_000, 4: 40_000})
    # every metrics row a window and a decision, whatever the load and the machine's speed: the
    # test is of the run's plumbing; the decisions' timing is the unit tests' above
    made = balance.watch

    def every_row(*args, **kwargs):  # type: ignore[no-untyped-def]
        watch = made(*args, **kwargs)
        watch.every_s = 0.0
        return watch

    monkeypatch.setattr(balance, "watch", every_row)
    monkeypatch.setattr(balance, "RATIO_MEASURE_S", 0.0)
    monkeypatch.setattr(balance, "RATIO_QUIET", math.inf)
    caplog.set_level("INFO", logger="edgerl")
    with Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        assert trainer.learner.ratio == 1
        assert any(m.startswith("pqn.epochs 4 -> 1: ") for m in trainer.stats.balance_moves)
        held = with_values(cfg, {"perf.deterministic": True})
        assert balance.watch(held, trainer.learning, False, 0, precision="fp32").ratio is None
        updates, rollouts = trainer.learner.updates, trainer.learner.rollouts
    assert "may move among 1 (40,000 env steps to target), 4 (40,000" in caplog.text
    epochs = epochs_column(tmp_path)
    assert epochs[0] == 4.0 and epochs[-1] == 1.0
    assert epochs == sorted(epochs, reverse=True)  # one move, down, never back
    # fewer minibatches than 4 epochs of 4 would have made: the learner learned at 1
    assert updates < 4 * 4 * rollouts

    more = with_values(cfg, {"train.steps": 45_000, "perf.balance": "off"})
    with Trainer(more, quiet=True) as trainer:
        assert trainer.learner.ratio == 1  # from the checkpoint, not the config's 4
        said = "pqn.epochs = 1 as the learning balance left it in the checkpoint (the config"
        assert said in caplog.text
        before = trainer.learner.updates, trainer.learner.rollouts
        trainer.run()
        learned = trainer.learner.updates - before[0], trainer.learner.rollouts - before[1]
    assert learned[1] > 0 and learned[0] == 4 * learned[1]  # 1 epoch of 4 minibatches each


def test_a_pqn_checkpoint_keeps_its_epochs_and_an_older_one_keeps_the_configs():
    from edgerl.config import AgentConfig, PQNConfig
    from edgerl.learners.nets import MLP
    from edgerl.learners.pqn import PQN

    def learner() -> PQN:
        net = MLP(4, 2, (16,), layer_norm=True)
        return PQN(net, AgentConfig(), PQNConfig(epochs=2), 4, torch.device("cpu"))

    moved = learner()
    moved.set_ratio(1)
    assert moved.figures() == {"epochs": 1.0}
    fresh = learner()
    fresh.load_state_dict(moved.state_dict())
    assert fresh.ratio == 1
    older = {k: v for k, v in moved.state_dict().items() if k != "epochs"}
    fresh = learner()
    fresh.load_state_dict(older)
    assert fresh.ratio == 2
