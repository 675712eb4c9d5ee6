"""The balance (balance.py): the CPU/GPU ratio and its sentence, the walk's steps (bounded,
logged, kept only when steps/s rise, threads given up to other programs first), the ratio in
metrics.csv and status.json of a real run, and perf.deterministic holding a run still."""

from __future__ import annotations

import csv
import logging
import math
import subprocess
import sys

import pytest
import torch

from edgerl.config import build_layers, resolve
from edgerl.report.balance import (
    Balancer,
    BalanceSample,
    Knob,
    cpu_gpu_ratio,
    who_waits,
)
from edgerl.run.train import Trainer


def test_the_ratio_is_the_learners_busy_time_over_the_actors():
    before = BalanceSample(wall=100.0, actor_wait_s=5.0, learner_busy_s=2.0)
    # 10 s: the actor waited 6 of them (busy 4), the learner was busy 8: it is the limit.
    assert cpu_gpu_ratio(before, BalanceSample(110.0, 11.0, 10.0)) == pytest.approx(2.0)
    # The learner busy 1 s of 10 while the actor never waited: the GPU idles.
    assert cpu_gpu_ratio(before, BalanceSample(110.0, 5.0, 3.0)) == pytest.approx(0.1)
    assert math.isnan(cpu_gpu_ratio(before, before))  # an empty window says nothing
    assert math.isnan(cpu_gpu_ratio(before, BalanceSample(110.0, 5.0, math.nan)))
    # no update in the window (the replay filling): not a ratio of 0.00 that blames the actor
    assert math.isnan(cpu_gpu_ratio(before, BalanceSample(110.0, 5.0, 2.0)))


def test_who_waits_names_the_side_that_waits_and_what_would_help():
    assert "the GPU waits for the environments" in who_waits(0.3, gpu=True)
    assert "more environments or ALE threads would help" in who_waits(0.3, gpu=True)
    assert "the environments wait for the GPU" in who_waits(2.5, gpu=True)
    assert "bigger batches" in who_waits(2.5, gpu=True)
    assert "the environments wait for the learner" in who_waits(2.5, gpu=False)
    assert who_waits(1.05, gpu=True) == "both sides busy (CPU/GPU ratio 1.05)"
    # without a GPU, no "CPU/GPU" ratio: both sides are on the CPU
    assert who_waits(1.05, gpu=False) == "both sides busy (learner/actor time ratio 1.05)"
    assert who_waits(math.nan, gpu=True) == ""


def knobs(threads: int = 2, cpus: int = 4, lead: int | None = None):
    applied: list[tuple[str, int]] = []
    made = [Knob("threads", threads, 1, cpus, lambda n: applied.append(("threads", n)))]
    if lead is not None:
        apply = lambda n: applied.append(("max_ahead", n))  # noqa: E731
        made.append(Knob("max_ahead", lead, 4, 64, apply, doubling=True))
    return made, applied


def test_threads_are_given_up_to_other_programs_at_once_and_tried_again_when_free(caplog):
    made, applied = knobs(threads=4, cpus=4)
    walk = Balancer(made, cpus=4)
    with caplog.at_level(logging.INFO, logger="edgerl.report.balance"):
        move = walk.window(1000.0, others_busy=2.2)  # two CPUs taken: two threads left
    assert applied == [("threads", 2)] and move is not None and move.new == 2
    assert "other programs kept 2.2 of 4 CPUs busy" in caplog.text
    assert walk.window(600.0, others_busy=2.1) is None  # still busy: nothing to try
    move = walk.window(600.0, others_busy=0.1)  # free again: one step back up, on trial
    assert applied[-1] == ("threads", 3) and "free" in move.reason
    move = walk.window(590.0, others_busy=0.1)  # no faster: undone
    assert applied[-1] == ("threads", 2) and move.reason.startswith("undone")
    assert [m.new for m in walk.moves] == [2, 3, 2]


def test_a_trial_is_kept_only_when_steps_per_second_rise_and_an_undone_one_waits():
    applied: list[int] = []
    lead = Knob("max_ahead", 8, 4, 64, applied.append, doubling=True)
    walk = Balancer([lead], cpus=4, seed=1)
    moves = [walk.window(1000.0, others_busy=None) for _ in range(3)]
    trial = moves[-1]
    assert moves[:2] == [None, None] and trial is not None  # every third quiet window
    assert trial.new in (4, 16)
    kept = walk.window(1000.0 * 1.05, others_busy=None)
    assert kept is not None and kept.reason.startswith("kept") and kept.new == trial.new
    assert applied == [trial.new]  # kept: nothing applied again
    # a step that does not pay is undone, and not tried again for twice as long as before
    tried = []
    for _ in range(40):
        move = walk.window(1000.0, others_busy=None)
        if move is not None and "trying" in move.reason:
            tried.append((move.old, move.new))
        elif move is not None:
            assert move.reason.startswith("undone") and "not tried again for" in move.reason
    assert 2 <= len(tried) < 40 // 3  # fewer trials than one every third window


def test_threads_follow_the_load_and_are_never_tried_at_random():
    made, applied = knobs(threads=2, cpus=2)
    walk = Balancer(made, cpus=2)
    for _ in range(30):  # quiet, both CPUs the run's own: nothing to try
        assert walk.window(900.0, others_busy=0.1) is None
    assert applied == []


@pytest.mark.parametrize("seed", range(20))
def test_the_walk_stays_within_its_bounds(seed):
    made, applied = knobs(threads=1, cpus=2, lead=4)
    walk = Balancer(made, cpus=2, seed=seed)
    rng = __import__("random").Random(seed)
    for _ in range(200):
        walk.window(rng.uniform(500, 1500), others_busy=rng.choice([None, 0.0, 0.5, 1.5]))
    assert applied and all(
        (1 <= n <= 2) if name == "threads" else (4 <= n <= 64) for name, n in applied
    )
    assert len(walk.moves) <= 5  # status keeps the newest


def cartpole(tmp_path, *sets: str, steps: int = 3000):
    return resolve(
        build_layers(
            None,
            ["hw.monitor=false", "display.enabled=false", "train.log_every_s=0.2", *sets],
            {"env.id": "CartPole-v1", "train.steps": steps, "train.run_dir": str(tmp_path)},
            use_system=False,
        )
    )


@pytest.mark.parametrize("algo", ["dqn", "pqn"])
def test_a_runs_metrics_and_status_say_who_waits(tmp_path, algo):
    import json

    from edgerl.report.status import StatusWriter

    cfg = cartpole(tmp_path, f"agent.algo={algo}", "agent.learning_starts=200")
    with Trainer(cfg, quiet=True) as trainer:
        status = StatusWriter(every_s=0.1, side=trainer.side_files)
        trainer.add_hook(status)
        trainer.run()
    with (tmp_path / "metrics.csv").open() as f:
        ratios = [float(r["cpu_gpu_ratio"]) for r in csv.DictReader(f) if r["cpu_gpu_ratio"]]
    assert ratios and all(r >= 0 for r in ratios)
    doc = json.loads((tmp_path / "status.json").read_text())
    assert doc["who_waits"] and " ratio " in doc["who_waits"]
    assert isinstance(doc["cpu_gpu_ratio"], float)


@pytest.mark.parametrize(("algo", "pipeline"), [("dqn", "sync"), ("pqn", "async")])
def test_deterministic_runs_repeat_while_other_programs_come_and_go(tmp_path, algo, pipeline):
    """Two seeded runs, the second beside two busy loops (which change the threads a run takes
    and the balancer's moves, and the timing of PQN's learner thread): in deterministic mode
    both hold still, and their weights are the same to the bit."""
    weights = []
    for i in range(2):
        cfg = cartpole(
            tmp_path / str(i),
            f"agent.algo={algo}",
            f"perf.pipeline={pipeline}",
            "perf.deterministic=true",
            "perf.balance_every_s=2",
            "agent.learning_starts=200",
            steps=2000,
        )
        busy = []
        if i == 1:
            loop = [sys.executable, "-c", "while True: pass"]
            busy = [subprocess.Popen(loop) for _ in range(2)]
        try:
            with Trainer(cfg, quiet=True) as trainer:
                # fixed whatever the load, and deterministic kernels asked for
                assert torch.get_num_threads() == 1
                assert torch.are_deterministic_algorithms_enabled()
                trainer.run()
                weights.append({k: v.clone() for k, v in trainer.learner.q.state_dict().items()})
                assert trainer.learning.mode == pipeline
                assert trainer.stats.balance_moves == []
        finally:
            for p in busy:
                p.kill()
                p.wait(timeout=60)
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["perf.pipeline=async"], "perf.pipeline=async lets timing decide what agent.algo=dqn"),
        (["perf.autotune=true"], "perf.autotune picks env.num_envs by timing"),
    ],
)
def test_what_cannot_repeat_is_refused_in_deterministic_mode(cli, tmp_path, sets, says):
    extra = [arg for s in sets for arg in ("--set", s)]
    r = cli("train", "--env", "CartPole-v1", "--set", "perf.deterministic=true", *extra,
            "--run-dir", tmp_path / "run")  # fmt: skip
    assert r.code == 2 and says in r.err and "Traceback" not in r.err
