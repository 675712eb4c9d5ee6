"""`edgerl bench` (bench.py, loops.py, replay.py): the JSON document, and a loop's share of the
limit."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
import torch

from .conftest import REPO, edgerl_cmd
from .helpers import CUDA

# The Nature CNN's multiply-adds per 84x84x4 observation, by hand: three convolutions
# (32x20x20 outputs of 4x8x8, 64x9x9 of 32x4x4, 64x7x7 of 64x3x3) and two dense layers
# (3136x512, 512x6 for Pong's actions).
NATURE_CNN_MACS = (
    32 * 20 * 20 * 4 * 8 * 8
    + 64 * 9 * 9 * 32 * 4 * 4
    + 64 * 7 * 7 * 64 * 3 * 3
    + 3136 * 512
    + 512 * 6
)


@pytest.mark.slow
def test_bench_json(cli):
    r = cli(
        "bench",
        "--set",
        "agent.algo=dqn",
        "--seconds",
        "1",
        "--actor-envs",
        "2",
        "--batch-shapes",
        "16/8",
        "--json",
        "--set",
        "agent.learning_starts=64",
        "--set",
        "agent.batch_size=8",
        "--set",
        "replay.capacity=2000",
    )
    assert r.code == 0, r.err
    # what it is about to do, set-up included: the actor at 2 envs, the loops sync 1 and 4, async 4
    assert "4 measurements of 1 s" in r.err and "at least 4 s of measuring" in r.err
    assert "on 2 CPU cores the whole takes about 12 s or more" in r.err
    doc = json.loads(r.out)
    assert set(doc["env_steps_per_s"]) == {"1", "4", "8", "16"}
    assert set(doc["act_per_s"]) == {"1", "8", "32"}
    assert {"eager", "channels_last"} <= set(doc["updates_per_s"])
    limit = doc["learner_bound_limit"]
    assert limit["steps_per_s"] == pytest.approx(  # both rounded: a loaded machine is slow
        doc["train_freq"] * limit["updates_per_s"], rel=0.01, abs=0.1
    )
    assert limit["measured_s"] >= 3  # never a one-second limit
    assert (
        "sampling and update" in limit["update_variant"] and "perf.amp=" in limit["update_variant"]
    )
    assert limit["updates_per_launch"] == (4 if CUDA else 1) and limit["host_us_per_update"] > 0
    # The same learner at another batch / train_freq: its limit follows its own train_freq.
    [shape] = limit["shapes"]
    assert (shape["batch_size"], shape["train_freq"]) == (16, 8)
    assert shape["steps_per_s"] == pytest.approx(8 * shape["updates_per_s"], rel=0.01, abs=0.1)
    # The actor alone beside the raw vector env, with the same environments.
    assert [a["num_envs"] for a in doc["actor"]] == [2]
    for a in doc["actor"]:
        assert a["raw_steps_per_s"] > 0 and a["steps_per_s"] > 0 and a["host_us_per_env_step"] > 0
        assert a["share_of_raw"] == pytest.approx(
            a["steps_per_s"] / a["raw_steps_per_s"], rel=0.01, abs=0.01
        )
    assert doc["pipeline_verdict"].startswith("perf.pipeline=auto picks")
    assert any("--seconds 1 is too short for steady figures" in w for w in doc["warnings"])
    assert doc["others_busy_cpus"] is None or doc["others_busy_cpus"] >= 0
    assert [(lp["mode"], lp["num_envs"]) for lp in doc["loops"]] == [
        ("sync", 1),
        ("sync", 4),
        ("async", 4),
    ]
    # it said at the start what it would measure, and that set-up is not in --seconds
    assert "bench: 4 measurements of 1 s (the whole loop and the actor alone)" in r.err
    # each stage says what it measures, and once done what it took in all, set-up included
    assert "bench: the whole loop, sync with 4 envs: 1 s measured, after an untimed set-up" in r.err
    assert "bench: the whole loop, sync with 4 envs took " in r.err
    assert "untimed" in r.err and doc["elapsed_s"] > 0
    for loop in doc["loops"]:
        assert loop["steps_per_s"] > 0 and 0 < loop["learner_busy"] <= 1
        assert 0 < loop["share_of_limit"] <= 1.0  # a loop cannot beat the learner bound
        if "share_note" not in loop:
            assert loop["share_of_limit"] == pytest.approx(  # the JSON's figures are rounded
                loop["steps_per_s"] / limit["steps_per_s"], rel=0.03, abs=0.01
            )
        assert loop["updates"] > 0 and loop["ms_per_update_in_loop"] > 0
        # A step's wall time, split: acting and learning measured, the rest what is left (in
        # the sync loop; the async learner's time is on a thread of its own).
        assert loop["act_us_per_env_step"] > 0 and loop["learn_us_per_env_step"] > 0
        if loop["mode"] == "sync":
            assert loop["act_us_per_env_step"] + loop["learn_us_per_env_step"] <= (
                loop["us_per_env_step"] * 1.05  # rounded figures, from one window
            )
    compute = doc["compute"]
    assert compute["macs_per_forward"] == NATURE_CNN_MACS
    assert compute["matmul_peak_gflops"] > 0 and compute["update_gflops"] > 0
    assert compute["update_share_of_peak"] == pytest.approx(
        compute["update_gflops"] / compute["matmul_peak_gflops"], rel=0.02, abs=0.002
    )
    # A peak for each precision the hardware runs (bf16 where the CPU or GPU has it), the
    # update's share of the best of them beside.
    from edgerl.measure.compute import hardware_precisions

    peaks = compute["matmul_peaks_gflops"]
    assert set(peaks) == set(hardware_precisions(torch.device("cuda" if CUDA else "cpu")))
    assert peaks["fp32"] == compute["matmul_peak_gflops"]
    assert compute["update_share_of_best_peak"] == pytest.approx(
        compute["update_gflops"] / max(peaks.values()), rel=0.02, abs=0.002
    )
    assert doc["loops"][0]["vs_sync_1_env"] == 1.0
    assert doc["auto_pipeline"] == ("async" if CUDA else "sync")
    saved = doc["replay_save"]
    assert saved["full"]["transitions"] == saved["capacity"] == 2000
    assert 0 < saved["incremental"]["transitions"] < 2000  # only the changed range
    for save in (saved["full"], saved["incremental"]):
        assert save["bytes"] > 0 and save["ratio"] > 1  # Pong frames compress
        assert save["actor_longest_pause_ms"] > 0 and "snapshot_ms" in save
    assert saved["restore_s"] > 0 and "zlib-1" in saved["codecs"]


def test_bench_measures_the_learner_of_the_readmes_recipe_unless_told_another(tmp_path):
    """README leads with a PQN recipe; a bare `edgerl bench` measured DQN. It measures the
    recipe's learner now, and another where --set, a config file or --preset names one."""
    from edgerl.config.presets import FIRST_RECIPE, NAMED_PRESETS
    from edgerl.measure.bench import BenchOptions, _config

    readme = (REPO / "README.md").read_text()
    assert f"--preset {FIRST_RECIPE}" in readme.partition("## Install")[0]
    learner = NAMED_PRESETS[FIRST_RECIPE].values["agent.algo"]
    assert _config(BenchOptions()).agent.algo == learner != "dqn"
    assert _config(BenchOptions(overrides=("agent.algo=dqn",))).agent.algo == "dqn"
    (tmp_path / "ga.toml").write_text('[agent]\nalgo = "ga"\n')
    assert _config(BenchOptions(config_file=tmp_path / "ga.toml")).agent.algo == "ga"
    assert _config(BenchOptions(preset="pong-cpu-dqn")).agent.algo == "dqn"


def test_a_stage_says_what_it_measures_and_then_how_long_it_took_in_all(caplog):
    from edgerl.measure.stages import stage

    with caplog.at_level("INFO"), stage("the whole loop, sync with 4 envs", 20.0):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert (
        said[0] == "bench: the whole loop, sync with 4 envs: 20 s measured, after an untimed set-up"
    )
    assert said[1].startswith("bench: the whole loop, sync with 4 envs took ")
    assert said[1].endswith(" s in all")


def test_ctrl_c_prints_what_the_bench_measured_so_far_and_exits_130():
    """A bench stopped by Ctrl-C (or SIGINT from a time limit) keeps what it measured: the
    JSON document has the stages before the interrupt, marked interrupted. It starts with SIGINT
    ignored, as a shell script's background job (or ``timeout -s INT`` run from one) hands it
    over, and Python then installs no handler of its own: the bench installs one (it ran to its
    end and exited 0 when this test was run from such a job)."""
    args = ["bench", "--env", "CartPole-v1", "--seconds", "10", "--envs", "1"]
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child inherits it ignored
    try:
        proc = subprocess.Popen(
            edgerl_cmd(*args, "--actor-envs", "", "--loop-envs", "1", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    err: list[str] = []
    reached = threading.Event()

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if "bench: the learner alone" in line:  # env steps, actions, updates measured
                reached.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    try:
        assert reached.wait(600), "".join(err)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    reader.join(60)
    assert proc.returncode == 130, "".join(err)
    doc = json.loads(out)
    assert doc["interrupted"] is True and "1" in doc["env_steps_per_s"]
    assert "loops" not in doc and any("interrupted" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("sps", "limit", "share", "says"),
    [
        (50.0, 100.0, 0.5, ""),
        (100.0, 100.0, 1.0, ""),
        (108.0, 100.0, 1.0, "108% measured: at the limit within noise"),
        (385.0, 100.0, 1.0, "385% measured, which a loop cannot reach"),
        (99.96, 100.0, 0.9996, ""),  # from unrounded figures, not 100.0 / 100
    ],
)
def test_a_loops_share_of_the_limit_is_at_most_one(sps, limit, share, says):
    from edgerl.measure.bench import share_of_limit

    got, note = share_of_limit(sps, limit)
    assert got == pytest.approx(share) and (says in note if says else note == "")


def loops_at_4(sync: float, async_: float) -> list[dict[str, object]]:
    return [
        {"mode": "sync", "num_envs": 1, "steps_per_s": sync / 2},
        {"mode": "sync", "num_envs": 4, "steps_per_s": sync},
        {"mode": "async", "num_envs": 4, "steps_per_s": async_},
    ]


@pytest.mark.parametrize(
    ("sync", "async_", "says"),
    [
        (100.0, 90.0, "and this run agrees (sync 1.11x async at 4 envs)"),
        (100.0, 108.0, "async 1.08x sync at 4 envs, within the 10%"),
        (100.0, 179.0, "but this run measured async 1.79x faster at 4 envs"),
    ],
)
def test_what_auto_picks_and_what_bench_measured_agree_or_the_report_says_why(sync, async_, says):
    import torch

    from edgerl.measure.bench import pipeline_verdict

    verdict = pipeline_verdict(loops_at_4(sync, async_), "sync", torch.device("cpu"))
    assert verdict.startswith("perf.pipeline=auto picks sync here") and says in verdict
    if "faster" in says:  # the way to use what was measured, and why auto does not
        assert "set perf.pipeline=async" in verdict and "often stalls them" in verdict


def test_the_verdict_compares_the_pipelines_at_the_most_environments_both_ran():
    import torch

    from edgerl.measure.bench import pipeline_verdict

    loops = [
        *loops_at_4(100.0, 90.0),
        {"mode": "sync", "num_envs": 32, "steps_per_s": 400.0},
        {"mode": "async", "num_envs": 32, "steps_per_s": 900.0},
        {"mode": "sync", "num_envs": 64, "steps_per_s": 500.0},  # no async beside it
    ]
    verdict = pipeline_verdict(loops, "async", torch.device("cuda"))
    assert "and this run agrees (async 2.25x sync at 32 envs)" in verdict
    only_sync = [lp for lp in loops if lp["mode"] == "sync"]
    assert pipeline_verdict(only_sync, "sync", torch.device("cpu")) == (
        "perf.pipeline=auto picks sync here"
    )


def test_the_whole_loop_runs_at_the_environments_asked_for(monkeypatch):
    from edgerl.config import Config, with_values
    from edgerl.measure import bench

    ran = []

    def whole_loop(cfg, mode, n, seconds):  # what the loop measures is tested above, for real
        ran.append((mode, n))
        return {"mode": mode, "num_envs": n, "steps_per_s": 10.0 * n, "steps_per_s_raw": 10.0 * n}

    monkeypatch.setattr(bench, "whole_loop", whole_loop)
    opts = bench.BenchOptions(loop_envs=(4, 32))
    bench._loops(Config(), opts, 1e6, [], loops := [])
    assert ran == [("sync", 4), ("async", 4), ("sync", 32), ("async", 32)]
    assert all(lp["vs_sync_1_env"] is None for lp in loops)  # no 1-env loop to compare with
    ran.clear()
    bench._loops(Config(), bench.BenchOptions(), 1e6, [], [])
    assert ran == [("sync", 1), ("sync", 4), ("async", 4)]  # the default
    ran.clear()  # each number once; the 1-env baseline wherever it is in the list
    bench._loops(Config(), bench.BenchOptions(loop_envs=(4, 1, 4)), 1e6, [], loops := [])
    assert ran == [("sync", 4), ("async", 4), ("sync", 1)]
    assert [lp["vs_sync_1_env"] for lp in loops] == [4.0, 4.0, 1.0]
    ran.clear()  # a rollout learner runs its loops at its own environments, and says so
    pqn = with_values(Config(), {"agent.algo": "pqn", "env.num_envs": 16})
    warnings: list[str] = []
    bench._loops(pqn, bench.BenchOptions(loop_envs=(4, 32)), 1e6, warnings, [])
    assert ran == [("sync", 16), ("async", 16)]  # the plain loop and the lagged one
    assert warnings == [
        "--loop-envs is not used with pqn: its loop runs at its own env.num_envs (16)"
    ]


@pytest.mark.parametrize(("given", "says"), [("", "at least one"), ("4,0", "1 or more")])
def test_bench_refuses_loop_environments_it_cannot_run(cli, given, says):
    r = cli("bench", "--loop-envs", given)
    assert r.code == 2 and says in r.err and "--loop-envs" in r.err and "Traceback" not in r.err


def test_a_busy_or_oversubscribed_machine_is_named_in_the_report():
    from edgerl.measure.bench import machine_warnings

    assert machine_warnings(2, 0.1, 2) == []  # a quiet machine
    busy = machine_warnings(2, 1.6, 1)
    assert len(busy) == 1 and "other programs kept 1.6 of the 2 CPUs busy" in busy[0]
    both = machine_warnings(2, 1.6, 2)  # two torch threads, one CPU free
    assert len(both) == 2 and "PyTorch runs 2 threads but 2 CPUs, 1.6 busy" in both[1]
    assert machine_warnings(2, None, 2) == []  # not measured: nothing said


def test_the_learner_limit_of_a_rollout_learner_counts_whole_rollouts():
    import torch

    from edgerl.config import Config, with_values
    from edgerl.config.presets import apply_presets
    from edgerl.envs import probe
    from edgerl.run.learner_alone import learner_limit

    spec = probe("CartPole-v1")
    cfg = with_values(Config(), {"env.id": "CartPole-v1", "agent.algo": "pqn"})
    cfg = apply_presets(cfg, spec.kind)
    limit = learner_limit(cfg, spec, torch.device("cpu"), 0.5)
    per_rollout = cfg.pqn.epochs * cfg.pqn.minibatches  # gradient updates in one rollout
    assert "PQN" in limit["describe"] and limit["updates_per_launch"] == 1
    # Env steps stand for whole rollouts: num_envs x rollout_steps per epochs x minibatches.
    rollout = cfg.env.num_envs * cfg.pqn.rollout_steps
    assert limit["steps_per_s"] == pytest.approx(
        limit["updates_per_s"] * rollout / per_rollout, rel=1e-6
    )


def test_flops_per_env_step_follow_the_learner():
    """PQN: one forward pass to act, its values reused but for each rollout's last step, and
    epochs x (forward + backward); DQN: a batch's forward and backward plus its two target
    passes every train_freq steps."""
    from edgerl.config import Config, with_values
    from edgerl.measure.compute import forwards_per_env_step, learning_forwards_per_update

    pqn = with_values(Config(), {"agent.algo": "pqn", "env.num_envs": 128})
    assert forwards_per_env_step(pqn, values_reused=True) == {
        "act": 1.0,
        "values": 1 / 32,
        "targets": 0.0,
        "gradients": 6.0,
    }
    assert forwards_per_env_step(pqn, values_reused=False)["values"] == 1.0
    # a minibatch of 128 (4,096 transitions / 32), its values computed apart (over 2 epochs)
    assert learning_forwards_per_update(pqn) == 128 * (3 + 0.5)
    dqn = with_values(Config(), {"agent.batch_size": 32, "agent.train_freq": 4})
    assert forwards_per_env_step(dqn, values_reused=False) == {
        "act": 1.0,
        "values": 0.0,
        "targets": 16.0,
        "gradients": 24.0,
    }
    assert learning_forwards_per_update(dqn) == 32 * 5


def test_the_multiply_adds_of_a_network_are_counted_from_its_layers():
    from edgerl.learners.nets import MLP, NatureCNN
    from edgerl.measure.compute import macs_per_forward

    assert macs_per_forward(NatureCNN(4, 6, layer_norm=True), (4, 84, 84), "uint8") == (
        NATURE_CNN_MACS
    )
    assert macs_per_forward(MLP(4, 2, (256, 256)), (4,), "float32") == 4 * 256 + 256 * 256 + 512


@pytest.mark.parametrize(
    ("share", "shown", "says"),
    [
        (0.98, "98% of the raw vector env's", ""),
        (1.78, "100% of the raw vector env's", "measured 178%, which the actor cannot reach"),
        (0.72, "72% of the raw vector env's", "below the 90% goal; env.batch_size=4"),
    ],
)
def test_an_actor_row_never_says_the_actor_beat_the_raw_env(share, shown, says):
    """`8 envs x 2 threads: 3,439 steps/s = 178% of the raw vector env's 1,929` was a report
    line: the actor runs on top of the raw env, so more than 100% is noise, and says so."""
    from edgerl.measure.report import actor_row

    row = actor_row(
        {
            "num_envs": 8,
            "threads": 2,
            "windows": 3,
            "window_s": 5.0,
            "steps_per_s": 1929 * share,
            "raw_steps_per_s": 1929.0,
            "share_of_raw": share,
            "host_us_per_env_step": 5.1,
            "thread_us_per_env_step": 20.0,
        }
    )
    assert shown in row and "3 alternating windows of 5 s each" in row
    assert (says in row) if says else ("noise" not in row and "goal" not in row)


def test_the_learner_limit_counts_work_that_ends_after_its_launch_returns():
    """A launch that returns at once while its work goes on elsewhere (a CUDA graph's replay)
    is timed until that work is done: a stand-in device works through its queue in a thread of
    its own, 20 ms a launch, one launch at a time, as a GPU works through its stream."""
    import queue
    import threading
    import time

    from edgerl.run.learner_alone import QUEUE_BOUND, time_launches

    work: queue.Queue[float] = queue.Queue()

    def device() -> None:
        while (seconds := work.get()) is not None:
            time.sleep(seconds)
            work.task_done()

    thread = threading.Thread(target=device, daemon=True)
    thread.start()
    launches = QUEUE_BOUND + 6  # the queue is drained once inside the window, then at its end
    seconds, host = time_launches(lambda: work.put(0.02), launches, work.join)
    assert work.unfinished_tasks == 0
    work.put(None)  # the stand-in device ends
    thread.join(timeout=60)
    assert seconds >= launches * 0.02  # every launch's work is inside the window
    assert host < seconds / 4  # host time is the launching alone, not the waiting


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("128", "expected pairs such as 128/16"),
        ("128/x", "expected pairs such as 128/16"),
        ("0/4", "a batch size and a train_freq are 1 or more"),
    ],
)
def test_a_bad_batch_shape_is_one_sentence(cli, given, says):
    r = cli("bench", "--batch-shapes", given)
    assert r.code == 2 and says in r.err and "--batch-shapes" in r.err and "Traceback" not in r.err


def test_a_loops_energy_per_env_step_is_the_reported_power_over_its_window(monkeypatch):
    """With a power source (a stand-in reporting 10 W, as a Jetson's VDD_IN would), the loop's
    energy per env step is that power over its steps; without one (this machine) there is none."""
    import functools

    from edgerl.config import Config, with_values
    from edgerl.hw.tegrastats import LoadRecord
    from edgerl.measure import loops

    cfg = with_values(
        Config(),
        {"env.id": "CartPole-v1", "agent.learning_starts": 64, "hw.monitor": False,
         "display.enabled": False, "eval.every_steps": 0, "replay.capacity": 2000},
    )  # fmt: skip
    plain = loops.whole_loop(cfg, "sync", 1, 2.0)
    assert plain["mj_per_env_step"] is None  # procfs reports no power

    class TenWatts:
        name = "stand-in"

        def __init__(self, hw, interval_ms):
            self.interval_s = interval_ms / 1000
            self.open = True

        def read(self):
            if not self.open:
                return None
            time.sleep(self.interval_s)
            return LoadRecord(cpu=[50.0], power_mw={"VDD_IN": 10_000})

        def close(self):
            self.open = False

    monitor = functools.partial(loops.LoadMonitor, source_factory=TenWatts)
    monkeypatch.setattr(loops, "LoadMonitor", monitor)
    loop = loops.whole_loop(cfg, "sync", 1, 3.0)
    expected_mj = 10_000 / loop["steps_per_s_raw"]  # 10 W over the window's steps
    assert loop["mj_per_env_step"] == pytest.approx(expected_mj, rel=0.35)


def test_a_loop_that_counted_no_step_says_so_and_gives_no_figure_or_advice():
    """Under load a loop's window can pass while its 128 environments are built: a newcomer
    saw '0.0 steps/s = 0% of the limit ... the learner waits for the environments'."""
    from edgerl.measure.report import _loop_lines

    loop = {
        "mode": "sync", "num_envs": 128, "steps_per_s": 0.0, "share_of_limit": 0.0,
        "vs_sync_1_env": None, "learner_busy": 0.0,
        "who_waits": "the learner waits for the environments",
    }  # fmt: skip
    (line,) = _loop_lines(loop, None)
    assert "no step was counted" in line and "--seconds" in line
    assert "of the limit" not in line and "waits" not in line


def test_dqns_update_modes_and_replay_are_named_as_dqns_where_another_learner_is_benched():
    """The stage table measures DQN's update modes whichever learner is configured: a bench of
    PQN or PPO says they are DQN's, and prints none of DQN's settings as its learner's."""
    from edgerl.measure.report import render

    result = {
        "device": "cpu",
        "cpus": 2,
        "torch_threads": 2,
        "env": "CartPole-v1",
        "train_freq": 2,
        "batch_size": 64,
        "n_step": 1,
        "replay_bytes_per_transition": 22,
        "env_steps_per_s": {"8": 40_000.0},
        "act_per_s": {"1": {"actions_per_s": 9_000.0}},
        "updates_per_s": {"eager": 800.0},
    }
    dqn = render({**result, "algo": "dqn"}).splitlines()
    assert dqn[0].endswith("CartPole-v1, dqn, train_freq 2, batch 64, n_step 1")
    assert "replay:        22 bytes" in dqn[1] and any(ln.startswith("updates/s:") for ln in dqn)
    ppo = render({**result, "algo": "ppo"}).splitlines()
    assert ppo[0].endswith("CartPole-v1, ppo") and "train_freq" not in ppo[0]
    assert ppo[1].startswith("DQN's replay:") and any(
        ln.startswith("DQN's updates/s:") for ln in ppo
    )


def test_a_rollout_learners_loop_is_timed_over_whole_rollouts():
    """PQN learns from whole rollouts: a window opened and closed at fixed times counted the
    env steps of the rollouts done inside it, a figure that moved a rollout at a time (4,096
    steps at Pong's recipe: 205 steps/s over 20 s, issue 72). Its window now opens and closes as
    a rollout's learning ends, so it holds whole rollouts (here of 4 x 16 steps)."""
    from edgerl.config import Config, with_values
    from edgerl.measure import loops

    cfg = with_values(
        Config(),
        {"env.id": "CartPole-v1", "agent.algo": "pqn", "env.num_envs": 4,
         "pqn.rollout_steps": 16, "pqn.minibatches": 4, "hw.monitor": False,
         "display.enabled": False, "eval.every_steps": 0, "train.steps": 10**12},
    )  # fmt: skip
    out = loops._trainer_window(cfg, 2.0, lambda t: t.learner.updates >= 3, 3)
    assert not out.get("timed_out") and out["steps"] >= 64, out
    assert out["steps"] % 64 == 0, out
    # the loop's own counter, read as each rollout's end is seen (late by the polls' sleep,
    # longer on a loaded machine), tells the same story: a sanity check, not a timing one
    assert abs(out["counted_steps"] - out["steps"]) <= 0.5 * out["steps"] + 256, out
