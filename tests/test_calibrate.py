"""The machine measures itself and picks its recipe (edgerl.run.calibrate): the least predicted
time to the target from the samples on record and the speeds measured here, among the recipes
that at least MIN_REACHING runs on record reached the target with, in the pipeline and at the
precision they would train with here (else the class's own, and the log says why); figures
remembered per machine, software and settings; the service and --preset board train the
choice."""

from __future__ import annotations

import pytest

from edgerl.config import targets, with_values
from edgerl.config.targets import MIN_REACHING, SampleRun, sample_runs, settings_of
from edgerl.hw.recipe import Recipe
from edgerl.learners.decisions import CompileDecisions
from edgerl.run.calibrate import (
    Measured,
    calibrate,
    candidate_config,
    candidates,
    choose,
)
from edgerl.run.recipe_speed import measure

CPU = Recipe("pong-cpu", "no CUDA GPU: PQN on 2 CPU cores", {})


def stand_in_run(
    preset: str,
    reached_at: int,
    name: str,
    pipeline: str = "sync",
    precision: str = "fp32",
    changes: dict | None = None,  # type: ignore[type-arg]
) -> SampleRun:
    """A stand-in run on record of ``preset`` (with ``changes``), trained in ``pipeline`` at
    ``precision``, at the target at ``reached_at`` (0: never, evaluated to 2M steps)."""
    cfg = with_values(candidate_config(Recipe(preset, "", {})), changes or {})
    return SampleRun(
        cfg.env.id,
        cfg.agent.algo,
        18.0,
        settings_of(cfg),
        pipeline,
        precision,
        100_000,
        name,
        reached_at,
        max(reached_at, 2_000_000),
    )


def on_record(monkeypatch, *runs: SampleRun, only: bool = False) -> None:  # type: ignore[no-untyped-def]
    """``runs`` on record beside the real ones (``only``: instead of them)."""
    rows = runs if only else (*sample_runs(), *runs)
    monkeypatch.setattr(targets, "sample_runs", lambda: rows)


def dqn_backed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two more runs of pong-cpu-dqn at 18 by 500,000 env steps, in one loop at fp32, as on two
    CPU cores: with the EPYC's, 3 at the target (MIN_REACHING), 500,000 their median."""
    on_record(
        monkeypatch,
        stand_in_run("pong-cpu-dqn", 500_000, "stand-in-1"),
        stand_in_run("pong-cpu-dqn", 500_000, "stand-in-2"),
    )


class StandIn:
    """Measures a recipe as a machine would give it: the emulator's speed per environment and
    the learner's cost per sample of gradient work, counted per call; ``pipeline`` as the
    recipes would run (sync on a CPU)."""

    def __init__(
        self, emulator_steps_per_s: float, learner_samples_per_s: float, pipeline: str = "sync"
    ) -> None:
        self.emulator, self.learner = emulator_steps_per_s, learner_samples_per_s
        self.pipeline = pipeline
        self.calls: list[str] = []

    def __call__(self, cfg, seconds):  # type: ignore[no-untyped-def]
        self.calls.append(cfg.agent.algo)
        if cfg.agent.algo == "pqn":  # each env step is learned from twice (2 epochs)
            work = cfg.pqn.epochs
        else:  # a batch every train_freq env steps
            work = cfg.agent.batch_size / cfg.agent.train_freq
        return self.emulator, self.learner / work, self.pipeline


def chosen(stand_in: StandIn, tmp_path) -> Recipe:  # type: ignore[no-untyped-def]
    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    return choose(calibrate(CPU, store, measure_fn=stand_in), CPU)


@pytest.fixture
def quiet(monkeypatch):
    """Other work beside a stand-in's measurement counted as none: what is remembered must not
    depend on how loaded the machine running the suite is (a real busy process has its own
    test below)."""
    monkeypatch.setattr("edgerl.hw.cpus.others_busy", lambda before, after: 0.0)


def measured_learners() -> list[str]:
    """The learners a calibration of CPU measures: its candidates and their ratio variants on
    record (PQN's epochs)."""
    return [candidate_config(r).agent.algo for r in candidates(CPU)]


def test_a_slow_emulator_picks_the_recipe_that_needs_fewer_env_steps(tmp_path, monkeypatch):
    """With the emulator the limit, every recipe runs near its speed: DQN's 500,000 env steps
    to 18 beat PQN's 1,200,000, once enough DQN runs on record back them (on today's record one
    of two did: PQN is trained, and DQN's figures say why not it)."""
    stand_in = StandIn(emulator_steps_per_s=150, learner_samples_per_s=20_000)
    pick = chosen(stand_in, tmp_path)
    assert pick.preset == "pong-cpu"
    assert "pong-cpu-dqn: actor 150 and learner 2,500 env steps/s" in pick.why
    assert "(sync, fp32: 1 of 2 runs reached it, evaluated every 50,000): " in pick.why
    assert "not chosen on it (fewer than 3 runs reached it)" in pick.why
    dqn_backed(monkeypatch)
    pick = chosen(stand_in, tmp_path)
    assert pick.preset == "pong-cpu-dqn"
    assert "the least time predicted among the recipes with 3 runs or more" in pick.why
    assert "the emulator the limit" in pick.why


def test_a_slow_learner_picks_the_recipe_that_asks_less_learning_per_env_step(
    tmp_path, monkeypatch
):
    """With the learner the limit, DQN's 8 samples of gradient work per env step cost more
    than PQN's 2 save: PQN, as on record on two CPU cores (PQN 41 minutes, DQN 68), DQN's
    runs backing it or not."""
    dqn_backed(monkeypatch)
    pick = chosen(StandIn(emulator_steps_per_s=5_000, learner_samples_per_s=1_200), tmp_path)
    assert pick.preset == "pong-cpu"
    assert "pong-cpu-dqn: actor 5,000 and learner 150 env steps/s" in pick.why


def test_a_recipe_is_chosen_only_on_three_runs_at_the_target_in_its_pipeline_and_precision(
    tmp_path, monkeypatch, caplog
):
    """Two runs at the target are a seed's luck: the recipe they back is not chosen, however
    fast, and where no recipe has three the class's own is trained, the log saying why in one
    line. Runs of another pipeline (async) or precision (bf16) count for nothing here; a third
    run in this machine's pipeline and precision makes the choice."""
    caplog.set_level("INFO", logger="edgerl")
    slow_emulator = StandIn(emulator_steps_per_s=150, learner_samples_per_s=20_000)
    elsewhere = [
        stand_in_run(name, 500_000, f"{name}-{way[0]}-{i}", *way)
        for name in ("pong-cpu", "pong-cpu-dqn")
        for way in (("async", "fp32"), ("sync", "bf16"))
        for i in range(MIN_REACHING)
    ]
    two_each = [
        stand_in_run("pong-cpu", 1_200_000, "pqn-1"),
        stand_in_run("pong-cpu", 1_200_000, "pqn-2"),
        stand_in_run("pong-cpu-dqn", 500_000, "dqn-1"),
        stand_in_run("pong-cpu-dqn", 500_000, "dqn-2"),
    ]
    on_record(monkeypatch, *elsewhere, *two_each, only=True)
    pick = chosen(slow_emulator, tmp_path)
    said = (
        "calibration: no recipe has 3 runs on record reaching the target with the sync "
        "pipeline and fp32 (pong-cpu 2 of 2, pong-cpu-dqn 2 of 2): training pong-cpu, this "
        "machine class's recipe"
    )
    assert said in caplog.text
    assert pick.preset == "pong-cpu" and pick.changes == {}
    assert "calibrated, kept: no recipe has 3 runs on record" in pick.why

    # a third PQN run: pong-cpu may be weighed, DQN's two still decide nothing
    caplog.clear()
    on_record(
        monkeypatch, *elsewhere, *two_each, stand_in_run("pong-cpu", 1_200_000, "pqn-3"), only=True
    )
    pick = chosen(slow_emulator, tmp_path)
    assert pick.preset == "pong-cpu"
    assert "the least time predicted among the recipes with 3 runs or more" in pick.why
    assert "pong-cpu-dqn: actor 150 and learner 2,500 env steps/s" in pick.why
    assert "not chosen on it (fewer than 3 runs reached it)" in pick.why
    assert "no recipe has" not in caplog.text

    # a third DQN run in this machine's pipeline and precision: DQN's 500,000 decide
    third = stand_in_run("pong-cpu-dqn", 500_000, "dqn-3")
    on_record(
        monkeypatch,
        *elsewhere,
        *two_each,
        stand_in_run("pong-cpu", 1_200_000, "pqn-3"),
        third,
        only=True,
    )
    assert chosen(slow_emulator, tmp_path).preset == "pong-cpu-dqn"


def test_the_class_own_recipe_without_enough_runs_is_kept_though_another_has_them(
    tmp_path, monkeypatch, caplog
):
    """With fewer than three runs at the target behind the class's own, there is no time of
    its own to weigh another against: it is kept, and the log says why."""
    caplog.set_level("INFO", logger="edgerl")
    runs = [stand_in_run("pong-cpu-dqn", 500_000, f"dqn-{i}") for i in range(MIN_REACHING)]
    runs.append(stand_in_run("pong-cpu", 1_200_000, "pqn-1"))
    on_record(monkeypatch, *runs, only=True)
    pick = chosen(StandIn(emulator_steps_per_s=150, learner_samples_per_s=20_000), tmp_path)
    assert pick.preset == "pong-cpu"
    said = (
        "calibration: pong-cpu has fewer than 3 runs on record reaching the target, so no time "
        "of its own to weigh the others against, with the sync pipeline and fp32 (pong-cpu 1 of "
        "1, pong-cpu-dqn 3 of 3): training pong-cpu, this machine class's recipe"
    )
    assert said in caplog.text


def test_the_figures_are_remembered_and_measured_again_when_the_machine_changes(
    tmp_path, monkeypatch, quiet
):
    stand_in = StandIn(150, 20_000)
    once = measured_learners()
    chosen(stand_in, tmp_path)
    chosen(stand_in, tmp_path)
    assert stand_in.calls == once  # the second start measured nothing
    import edgerl

    monkeypatch.setattr(edgerl, "__version__", "99.0")  # another edgerl: measured again
    chosen(stand_in, tmp_path)
    assert stand_in.calls == once + once
    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    assert calibrate(CPU, store, measure_fn=stand_in, remembered_only=True)  # a reload: known
    empty = CompileDecisions(tmp_path / "none", "calibration.json", "the calibration")
    assert calibrate(CPU, empty, measure_fn=stand_in, remembered_only=True) == []
    assert len(stand_in.calls) == 2 * len(once)


def test_a_recipe_without_samples_on_record_is_shown_and_never_chosen():
    fast = Measured(Recipe("pong-cpu", "", {}), 9e9, 9e9, "sync", samples=None)
    assert fast.predicted_s is None and not fast.backed
    said = "no samples to target on record at its settings (sync, fp32: 0 of 0 runs reached"
    assert said in fast.describe()
    assert choose([fast], CPU).preset == "pong-cpu"  # the class's own, nothing to choose by


def test_measuring_a_recipe_runs_its_real_actor_and_learner_here():
    """The real measurement of pong-cpu-dqn (4 Pong environments, DQN's update), briefly."""
    cfg = with_values(candidate_config(Recipe("pong-cpu-dqn", "", {})), {"perf.device": "cpu"})
    actor, learner, pipeline = measure(cfg, 0.5)
    assert actor > 0 and learner > 0
    assert pipeline == "sync"  # on the CPU


def test_preset_board_and_the_service_train_the_calibrated_choice(
    cli, tmp_path, monkeypatch, quiet
):
    """Figures remembered in the cache directory (as a first start leaves them) make the
    choice; the run's first lines say which recipe and why."""
    from edgerl.run.calibrate import calibrated_recipe
    from edgerl.service.daemon import daemon_config

    dqn_backed(monkeypatch)  # DQN's 500,000 env steps may decide
    monkeypatch.setenv("CACHE_DIRECTORY", str(tmp_path / "cache"))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    store = CompileDecisions(tmp_path / "cache", "calibration.json", "the calibration")
    calibrate(calibrated_recipe(calibrated=False), store, measure_fn=StandIn(150, 20_000))
    silent = tmp_path / "silent.toml"
    silent.write_text(f'[train]\nrun_dir = "{tmp_path / "run"}"\n')
    cfg = daemon_config(silent, measure=False)
    assert cfg.agent.algo == "dqn" and cfg.env.num_envs == 4
    assert cfg.train.recipe.startswith("pong-cpu-dqn (")
    r = cli("config", "--preset", "board")
    assert r.code == 0, r.err
    assert 'algo = "dqn"' in r.out and 'recipe = "pong-cpu-dqn (' in r.out
    r = cli("config", "--preset", "board", "--set", "hw.calibrate=false")
    assert r.code == 0 and 'algo = "pqn"' in r.out, r.err


@pytest.mark.parametrize(
    ("name", "pipeline", "precision", "backed"),
    [
        ("pong-cpu", "sync", "fp32", True),  # on two CPU cores: 4 of 5 at 18
        ("pong-cpu-dqn", "sync", "fp32", False),  # 1 of 2
        ("pong-gpu", "async", "bf16", False),  # 2 of 4, two stopped by the clock
        ("pong-gpu-dqn", "async", "fp32", False),  # 1 of 2
    ],
)
def test_every_candidate_has_its_samples_to_target_on_record(name, pipeline, precision, backed):
    """In the pipeline and at the precision each trains with on its class of machine; only
    pong-cpu's are enough runs to choose on."""
    from edgerl.config.targets import samples_to_target

    found = samples_to_target(candidate_config(Recipe(name, "", {})), pipeline, precision)
    assert found is not None and found.enough is backed


def test_a_recipe_trains_here_in_the_pipeline_and_precision_its_config_resolves_to():
    """What the runs on record are looked up with: this CPU's, as training resolves them."""
    from edgerl.run.calibrate import trained_here

    assert trained_here(candidate_config(CPU)) == ("sync", "fp32")
    dqn = candidate_config(Recipe("pong-cpu-dqn", "", {}))
    assert trained_here(dqn) == ("sync", "fp32")
    off = with_values(dqn, {"perf.amp": "off", "perf.device": "cpu"})
    assert trained_here(off) == ("sync", "fp32")


def test_a_small_boards_own_recipe_without_a_prediction_is_kept_not_traded(
    tmp_path, monkeypatch, caplog
):
    """A board under 16 GiB runs pong-jetson with 64 environments, which no run on record
    used: with no time predicted for it, nothing can be weighed against it, not even a recipe
    enough runs back (pong-gpu-dqn's, given two more at the target here)."""
    caplog.set_level("INFO", logger="edgerl")
    on_record(
        monkeypatch,
        stand_in_run("pong-gpu-dqn", 1_000_000, "stand-in-1", "async", "fp32"),
        stand_in_run("pong-gpu-dqn", 1_000_000, "stand-in-2", "async", "fp32"),
    )
    small = Recipe("pong-jetson", "an integrated GPU sharing 4 GiB: PQN", {"env.num_envs": 64})
    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    measured = calibrate(small, store, measure_fn=StandIn(150, 20_000, pipeline="async"))
    assert [m.predicted_s is None for m in measured] == [True, False]
    assert [m.backed for m in measured] == [False, True]
    pick = choose(measured, small)
    assert pick.preset == "pong-jetson" and pick.changes == {"env.num_envs": 64}
    assert "kept: pong-jetson env.num_envs=64 has fewer than 3 runs on record" in pick.why
    assert "(pong-jetson env.num_envs=64 0 of 0, pong-gpu-dqn 3 of 4)" in caplog.text


def test_a_recipe_that_cannot_be_measured_is_left_out_and_the_rest_decide(tmp_path, caplog):
    def dqn_fails(cfg, seconds):  # type: ignore[no-untyped-def]
        if cfg.agent.algo == "dqn":
            raise RuntimeError("CUDA out of memory")
        return 1000.0, 500.0, "sync"

    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    measured = calibrate(CPU, store, measure_fn=dqn_fails)
    pqn = [r.name for r in candidates(CPU) if candidate_config(r).agent.algo == "pqn"]
    assert [m.recipe.name for m in measured] == pqn  # pong-cpu, and at the epochs on record
    assert "pong-cpu-dqn could not be measured here (CUDA out of memory): left out" in caplog.text
    assert choose(measured, CPU).preset == "pong-cpu"


def test_a_damaged_remembered_figure_is_measured_again(tmp_path, quiet):
    import json

    stand_in = StandIn(150, 20_000)
    chosen(stand_in, tmp_path)
    path = tmp_path / "calibration.json"
    doc = json.loads(path.read_text())
    for entry in doc["entries"].values():
        entry["actor"] = None  # an edit by hand, or a bug of an older edgerl
    path.write_text(json.dumps(doc))
    chosen(stand_in, tmp_path)
    assert stand_in.calls == measured_learners() * 2


def test_figures_taken_while_other_work_kept_the_cpus_busy_are_kept_with_that_load(
    tmp_path, monkeypatch
):
    """A real busy process beside the measurement (its CPU time counted, however loaded the
    machine is): the figures choose now and are remembered with that load; a later start on a
    machine still busy uses them (measuring again at every start of a busy board found
    nothing new), a quiet one measures again and replaces them."""
    import json
    import subprocess
    import sys
    import time

    import psutil

    from edgerl.run.calibrate import BUSY_TO_REMEMBER

    def beside_a_busy_loop(cfg, seconds):  # type: ignore[no-untyped-def]
        busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
        try:
            deadline = time.monotonic() + 600
            while psutil.Process(busy.pid).cpu_times().user < 1.5 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            busy.kill()
            busy.wait(timeout=60)
        return 1000.0, 500.0, "sync"

    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    assert len(calibrate(CPU, store, measure_fn=beside_a_busy_loop)) == len(candidates(CPU))

    def loads() -> list[float]:
        doc = json.loads((tmp_path / "calibration.json").read_text())
        return [entry["busy"] for entry in doc["entries"].values()]

    assert len(loads()) == len(candidates(CPU))
    assert all(busy > BUSY_TO_REMEMBER for busy in loads())
    stand_in = StandIn(150, 20_000)
    monkeypatch.setattr("edgerl.hw.cpus.others_busy", lambda before, after: 1.5)  # still busy
    assert [m.actor_steps_per_s for m in calibrate(CPU, store, measure_fn=stand_in)] == [
        1000.0
    ] * len(candidates(CPU))
    assert stand_in.calls == []
    monkeypatch.setattr("edgerl.hw.cpus.others_busy", lambda before, after: 0.0)  # quiet now
    assert calibrate(CPU, store, measure_fn=stand_in)[0].actor_steps_per_s == 150
    assert stand_in.calls == measured_learners()
    assert loads() == [0.0] * len(candidates(CPU))
    calibrate(CPU, store, measure_fn=stand_in)  # quiet figures: remembered for good
    assert stand_in.calls == measured_learners()


def test_measuring_runs_in_a_process_of_its_own_which_a_stop_ends_at_once(tmp_path, caplog):
    """The real measurement in its own process (ALE builds a recipe's environments in one call
    that holds Python's lock: a stop could not be heard in the same process): its figures come
    back and are remembered; a stop while it measures ends it within seconds, said, and
    nothing is remembered. Its thread count is judged by a look at the CPUs as it begins, not
    by the load average (which still counts a run ended seconds before: right after one, a
    learner was measured at one thread of two and remembered as quiet), and said with that
    look; the starting process then judges the CPUs anew, the measuring process's work behind
    it. (The count itself is not checked: the suite runs at OMP_NUM_THREADS=1.)"""
    import logging
    import time

    import psutil

    from edgerl.hw import cpus
    from edgerl.run.signals import StoppedDuringSetup

    caplog.set_level(logging.INFO)
    dqn = Recipe("pong-cpu-dqn", "", {})  # 4 environments: quick to build
    store = CompileDecisions(tmp_path, "calibration.json", "the calibration")
    heard: list[tuple[str, float]] = []
    began = time.monotonic()
    (measured,) = calibrate(dqn, store, seconds=0.5, progress=lambda *said: heard.append(said))
    assert measured.actor_steps_per_s > 0 and measured.learner_steps_per_s > 0
    said = next(r.getMessage() for r in caplog.records if " measured with " in r.getMessage())
    assert said.startswith("calibration: pong-cpu-dqn measured with ")
    assert said.endswith(" busy with other work) as it began"), said  # not the load average
    assert cpus._mark is not None and cpus._mark.wall > began  # begun after the measuring
    assert cpus.cpu_load().measured_s >= cpus.MIN_WINDOW_S
    assert (tmp_path / "calibration.json").exists()
    assert heard and "measuring pong-cpu-dqn (1 of 1)" in heard[0][0] and heard[0][1] > 0

    other = CompileDecisions(tmp_path / "other", "calibration.json", "the calibration")
    asked = []

    def stop_once_measuring() -> str | None:  # a SIGTERM some polls into the measuring
        asked.append(time.monotonic())
        return "SIGTERM" if len(asked) > 10 else None

    started = time.monotonic()
    with pytest.raises(StoppedDuringSetup, match="stopped by SIGTERM during start-up"):
        calibrate(dqn, other, seconds=600, stop=stop_once_measuring)
    assert time.monotonic() - started < 120  # not the 600 s it was to measure for
    assert "calibration: stopped by SIGTERM while measuring pong-cpu-dqn (1 of 1)" in caplog.text
    assert not (tmp_path / "other" / "calibration.json").exists()
    assert not psutil.Process().children()  # the measuring process is gone


def test_a_run_already_begun_keeps_the_recipe_it_trained_with(tmp_path):
    """After an upgrade or on other CPUs the calibration may choose another learner, which the
    run's checkpoints refuse: a run in the run directory goes on with its own recipe."""
    from edgerl.run.calibrate import calibrated_recipe

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[train]\nrecipe = "pong-cpu-dqn (no CUDA GPU: ...)"\n')
    store = CompileDecisions(tmp_path / "empty", "calibration.json", "the calibration")
    kept = calibrated_recipe(store=store, run_dir=run)  # nothing remembered: nothing measured
    assert kept.preset == "pong-cpu-dqn"
    assert kept.describe() == "pong-cpu-dqn (no CUDA GPU: ...)"  # as the run began, unchanged
    # a name this machine would not give (another board's environment count): its own reason
    (run / "config.toml").write_text('[train]\nrecipe = "pong-cpu-dqn env.num_envs=64 (a Nano)"\n')
    assert "a Nano" not in calibrated_recipe(store=store, run_dir=run).describe()
    assert not (tmp_path / "empty" / "calibration.json").exists()
    (run / "config.toml").write_text('[train]\nrecipe = ""\n')  # trained without one
    assert calibrated_recipe(calibrated=False, run_dir=run).preset in ("pong-cpu", "pong-gpu")


def test_the_epochs_on_record_are_weighed_too_and_a_run_keeps_the_value_chosen(
    tmp_path, monkeypatch
):
    """With pong-cpu's settings on record at 1 epoch too (stand-in runs: 1.4M env steps),
    a slow learner makes 1 epoch the least time (half the learning per env step for 14% more
    steps); the choice names it, trains it, and a run begun with it keeps it."""
    from edgerl.run.calibrate import calibrated_recipe

    # three stand-in runs at 1.4M: with the record's three one-epoch runs (1 of them at 18 by
    # 1,500,032), 4 of 6 at the target, the median 1.4M
    one = {"pqn.epochs": 1}
    on_record(
        monkeypatch, *(stand_in_run("pong-cpu", 1_400_000, f"s{i}", changes=one) for i in range(3))
    )
    assert [r.name for r in candidates(CPU)][:2] == ["pong-cpu", "pong-cpu pqn.epochs=1"]
    pick = chosen(StandIn(emulator_steps_per_s=5_000, learner_samples_per_s=1_200), tmp_path)
    assert pick.preset == "pong-cpu" and pick.changes == {"pqn.epochs": 1}
    assert "pong-cpu pqn.epochs=1: actor 5,000 and learner 1,200 env steps/s" in pick.why
    assert candidate_config(pick).pqn.epochs == 1

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f'[train]\nrecipe = "{pick.describe()}"\n')
    store = CompileDecisions(tmp_path / "empty", "calibration.json", "the calibration")
    kept = calibrated_recipe(store=store, run_dir=run)
    assert kept.preset == "pong-cpu" and kept.changes == {"pqn.epochs": 1}
    # the resume writes back what the run began with: the prediction it is compared with
    assert kept.describe() == pick.describe()
    assert kept.layer().values["train.recipe"] == pick.describe()
