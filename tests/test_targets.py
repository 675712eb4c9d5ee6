"""Samples to target (edgerl/data/samples_to_target.csv) against the runs under docs/runs/: every
Pong run on record is a row, with the settings of its config.toml and the steps of its eval.csv;
a config finds the runs that share its settings and no others."""

from __future__ import annotations

import csv
import itertools
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from edgerl.config import Config
from edgerl.config.learners import learner_info, pipeline_mode
from edgerl.config.parse import tomllib
from edgerl.config.targets import (
    COMMON_KEYS,
    MIN_REACHING,
    SampleRun,
    median_steps,
    sample_runs,
    samples_to_target,
    settings_of,
    text_of,
)

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"
PONG_TARGET = 18.0


# perf.amp=auto made bf16 on a discrete GPU until commit 5063f2f made it fp32 there; this run of
# pong-gpu came before (docs/results.md, "bf16 against fp32 at equal steps": its fp32 twin is
# pong-h200-pqn-fp32, set perf.amp=off) and keeps no train.log to say so.
AUTO_WAS_BF16 = {"pong-h200-pqn"}

# Calibrated before commit 0b3ac7e, whose measuring process took its thread count from the load
# average: right after another run that was one thread of two, so the prediction its config.toml
# keeps says nothing of the host work the halves leave out (the loop made 1.72x of it): recorded
# as not calibrated (0).
PREDICTED_AT_ONE_THREAD = {"pong-cpu-xeon-seeds/seed-4"}


def recorded(run: Path) -> SampleRun | None:
    """The row a run directory makes: None unless it trained Pong."""
    config = tomllib.loads((run / "config.toml").read_text())
    defaults = Config()

    def value(key: str) -> object:
        section, name = key.split(".", 1)
        return config.get(section, {}).get(name, defaults.get(key))

    if value("env.id") != "ALE/Pong-v5":
        return None
    algo = str(value("agent.algo"))
    keys = COMMON_KEYS + learner_info(algo).sample_keys
    with (run / "eval.csv").open(newline="") as f:
        evals = list(csv.DictReader(f))
    reached = [int(e["step"]) for e in evals if float(e["return_mean"]) >= PONG_TARGET]
    until = reached[0] if reached else int(evals[-1]["step"])
    settings = {k: value(k) for k in keys}
    ratio_key = learner_info(algo).ratio_key
    if ratio_key:  # the value the learning balance left, where it moved it
        trained = trained_at(run, ratio_key, until, settings[ratio_key])
        if trained is None:
            return None  # a sample of no one value
        settings[ratio_key] = trained
    name = str(run.relative_to(RUNS))
    pipeline, precision = trained_with(run, value, algo, auto_bf16=name in AUTO_WAS_BF16)
    every = int(value("eval.every_steps"))  # type: ignore[call-overload]
    loop_sps, eval_cost, eval_tail = loop_and_evaluations(run, evals, until, every)
    return SampleRun(
        env_id="ALE/Pong-v5",
        algo=algo,
        target=PONG_TARGET,
        settings=" ".join(f"{k}={text_of(v)}" for k, v in settings.items()),
        pipeline=pipeline,
        precision=precision,
        eval_every=every,
        run=name,
        reached_at=reached[0] if reached else 0,
        evaluated_to=int(evals[-1]["step"]),
        loop_sps=loop_sps,
        eval_cost_steps=eval_cost,
        eval_tail_steps=eval_tail,
        predicted_loop_sps=0
        if name in PREDICTED_AT_ONE_THREAD
        else predicted_loop(str(value("train.recipe")), pipeline),
    )


def loop_and_evaluations(
    run: Path, evals: list[dict[str, str]], until: int, every: int
) -> tuple[float, int, int]:
    """(the loop's env steps/s outside evaluations, the training time each evaluation before
    the one at ``until`` added, the time that one took, both in env steps of that loop):
    metrics.csv's windows that overlap no evaluation (eval.csv's wall_s, when it began, to wall_s
    + eval_s) up to the evaluation at ``until`` give the loop; the rest of the time to its
    beginning, start-up included, is shared among the evaluations before it (at most one
    period each: they never overlap; -1 where there was none). (0.0, 0, 0) where no window was
    outside an evaluation."""
    spans = [(float(e["wall_s"]), float(e["wall_s"]) + float(e["eval_s"])) for e in evals]
    last = next(e for e in evals if int(e["step"]) == until)
    began = float(last["wall_s"])
    with (run / "metrics.csv").open(newline="") as f:
        points = [(int(r["step"]), float(r["wall_s"])) for r in csv.DictReader(f)]
    steps = seconds = 0.0
    for (s0, w0), (s1, w1) in itertools.pairwise(points):
        if w1 <= began and w1 > w0 and not any(a < w1 and w0 < b for a, b in spans):
            steps, seconds = steps + s1 - s0, seconds + w1 - w0
    if seconds <= 0:
        return 0.0, 0, 0
    loop = steps / seconds
    before = sum(1 for e in evals if int(e["step"]) < until)
    cost = max(0, min(every, round((began * loop - until) / before))) if before else -1
    return round(loop, 1), cost, round(float(last["eval_s"]) * loop)


def predicted_loop(recipe: str, pipeline: str) -> int:
    """The loop's env steps/s the calibration predicted for the recipe a run trained (its
    config's ``train.recipe`` line names each recipe it measured); 0 where it measured none."""
    name = recipe.split(" (", 1)[0]
    said = re.search(
        re.escape(name) + rf": actor [\d,]+ and learner [\d,]+ env steps/s, {pipeline}: "
        r"([\d,]+) predicted",
        recipe,
    )
    return int(said[1].replace(",", "")) if said else 0


def trained_with(
    run: Path, value: Callable[[str], object], algo: str, auto_bf16: bool = False
) -> tuple[str, str]:
    """(pipeline, precision) a run trained with, from its config.toml as the trainer resolves
    ``perf.pipeline`` and ``perf.amp`` on its device: a GPU where it says ``perf.device = cuda``
    or its metrics.csv has the GPU's busy share (NVML's, empty on a machine without one).
    ``auto_bf16``: perf.amp=auto as it resolved on a discrete GPU before it became fp32 there.
    Where the run kept its train.log, the log's ``learning:`` line must say the same."""
    with (run / "metrics.csv").open(newline="") as f:
        gpu_sampled = any(row.get("gr3d") for row in csv.DictReader(f))
    device = str(value("perf.device"))
    device = device if device in ("cpu", "cuda") else "cuda" if gpu_sampled else "cpu"
    pipeline = pipeline_mode(str(value("perf.pipeline")), device, algo)
    amp = str(value("perf.amp"))
    if amp == "auto":  # Atari frames: fp32 on a CPU and (now) on a discrete GPU
        amp = "bf16" if auto_bf16 and device == "cuda" else "off"
    precision = {"off": "fp32", "bf16": "bf16", "fp16": "fp16"}[amp]
    log = run / "train.log"
    said = LEARNING_LINE.search(log.read_text()) if log.is_file() else None
    if said is not None:
        amp_said = re.search(r"amp (\w+)", said["rest"])
        logged_amp = LOGGED_AMP[amp_said[1]] if amp_said else "fp32"
        logged = (said["pipeline"], said["device"], logged_amp)
        assert logged == (pipeline, device, precision), (run, logged)
    return pipeline, precision


# train.log's "learning: async pipeline, update on cuda, PQN, channels_last, amp bfloat16, ..."
LEARNING_LINE = re.compile(
    r"learning: (?P<pipeline>\w+) pipeline, update on (?P<device>cpu|cuda)(?P<rest>[^\n]*)"
)
LOGGED_AMP = {"bfloat16": "bf16", "float16": "fp16"}


def trained_at(run: Path, key: str, until: int, configured: object) -> object | None:
    """The value of ``key`` (its metrics.csv column: the learner's figure) the run trained at
    for 90% of its env steps to ``until``; the configured one for a run from before the
    column; None where no value had 90% (the learning balance moved it early)."""
    column = key.rsplit(".", 1)[1]
    with (run / "metrics.csv").open(newline="") as f:
        rows = [(int(r["step"]), r.get(column) or "") for r in csv.DictReader(f)]
    if not rows or not rows[0][1]:
        return configured
    steps: dict[str, int] = {}
    before = 0
    for step, value in rows:
        if before >= until:
            break
        steps[value] = steps.get(value, 0) + min(step, until) - before
        before = step
    value, most = max(steps.items(), key=lambda kv: kv[1])
    if most < 0.9 * sum(steps.values()):
        return None
    return type(configured)(float(value))  # type: ignore[call-arg]


def pong_runs() -> set[SampleRun]:
    runs = {p.parent for p in RUNS.rglob("eval.csv") if (p.parent / "config.toml").is_file()}
    return {row for run in runs if (row := recorded(run)) is not None}


def test_every_pong_run_on_record_is_a_row_with_its_settings_and_steps():
    assert set(sample_runs()) == pong_runs()


def preset(name: str) -> Config:
    from edgerl.config import build_layers, resolve
    from edgerl.config.presets import apply_presets, named_preset_layer

    layers = [*build_layers(None, [], use_system=False), named_preset_layer(name)]
    return apply_presets(resolve(layers), "frames")


def test_pong_cpu_finds_the_pqn_runs_that_share_its_settings_pipeline_and_precision():
    """pong-cpu and pong-gpu learn with the same settings, but the CPU's runs learned in one
    loop at fp32 and the GPU's mostly beside the actor in bf16: each finds its own. On two CPU
    cores (sync, fp32) 6 of 7 reached 18; pong-gpu's async bf16 runs 2 of 4 (two stopped by the
    clock), too few to choose on; the H200's fp32 run (sync, never at 18) speaks for neither."""
    found = samples_to_target(preset("pong-cpu"), "sync", "fp32")
    assert found is not None and found.enough
    assert (found.reached, len(found.runs)) == (6, 8)
    assert {r.run for r in found.runs} == {
        "pong-cpu-2core",
        "pong-cpu-seeds/seed-1",
        "pong-cpu-seeds/seed-2",
        "pong-cpu-seeds/seed-3",
        "pong-cpu-xeon-seeds/seed-4",
        "pong-cpu-xeon-seeds/seed-5",
        "pong-cpu-xeon-seeds/seed-6",  # never at 18 within its 2,000,000 steps
        "pong-h200-pqn-fp32",  # a GPU in one loop at fp32: the same pipeline and precision
    }
    # 900,096 (1 of 8), 1,100,032 (2 of 7), 1,200,000 (2 of 5): the share not there yet is
    # 7/8 * 5/7 * 3/5 = 3/8, and 5/8 before 1,200,000
    assert found.steps == 1_200_000
    said = "1,200,000 env steps to 18 (the Kaplan-Meier median of the 8 runs on record with "
    said += "these settings, the sync pipeline and fp32, 6 of which reached it; evaluated every "
    assert said + "100,000-500,000 env steps)" in found.describe()
    gpu = samples_to_target(preset("pong-gpu"), "async", "bf16")
    assert gpu is not None and not gpu.enough
    assert (gpu.steps, gpu.reached, len(gpu.runs)) == (1_000_064, 2, 4)
    assert "evaluated every 250,000-500,000 env steps" in gpu.describe()
    one_loop = samples_to_target(preset("pong-gpu"), "sync", "bf16")  # the H200's first run
    assert one_loop is not None and (one_loop.reached, len(one_loop.runs)) == (1, 1)
    assert samples_to_target(preset("pong-cpu"), "async", "fp32") is None  # no such run
    dqn = samples_to_target(preset("pong-cpu-dqn"), "sync", "fp32")  # the AMD EPYC's run
    assert dqn is not None and (dqn.steps, dqn.reached, len(dqn.runs)) == (500_000, 1, 2)
    assert not dqn.enough


def test_only_pqn_on_two_cpu_cores_has_enough_runs_at_the_target_to_choose_on():
    """What the calibration may choose on today (MIN_REACHING runs at the target with the
    settings, pipeline and precision): pong-cpu in one loop at fp32, nothing else."""
    backed = {
        (r.algo, r.settings, r.pipeline, r.precision)
        for r in sample_runs()
        if sum(
            1
            for o in sample_runs()
            if (o.algo, o.settings, o.pipeline, o.precision)
            == (r.algo, r.settings, r.pipeline, r.precision)
            and o.reached_at
        )
        >= MIN_REACHING
    }
    cpu = preset("pong-cpu")
    assert backed == {("pqn", settings_of(cpu), "sync", "fp32")}


def km_median(reached: list[int], stopped: list[int]) -> int | None:
    """The median of SciPy's Kaplan-Meier estimate (scipy.stats.ecdf on right-censored data)."""
    from scipy import stats

    if not reached:
        return None
    sf = stats.ecdf(stats.CensoredData(uncensored=reached, right=stopped)).sf
    below = [q for q, p in zip(sf.quantiles, sf.probabilities, strict=True) if p <= 0.5 + 1e-12]
    return int(min(below)) if below else None


@pytest.mark.parametrize(
    ("reached", "stopped"),
    [
        ([1_500_032], [1_500_032]),  # a tie: the stopped run was not there at that step either
        ([1_500_032], [1_500_032, 1_700_000]),  # 1 of 3: no median
        ([1_000_000], [300_000]),  # stopped before: says nothing of 1M
        ([1_000_000, 1_200_000], [2_000_000, 2_000_000]),  # half by 1.2M
        ([5, 5, 7, 9], [6, 8, 8, 20]),
        ([], [100]),
        ([100, 200, 300], []),  # all reached: the middle one
    ],
)
def test_the_median_counts_runs_that_did_not_reach_the_target_as_scipy_does(reached, stopped):
    """Kaplan-Meier by hand (the core install has no SciPy; the calibration runs in the
    service) against SciPy's estimate."""
    assert median_steps(reached, stopped) == km_median(reached, stopped)


def test_a_recipe_that_reached_the_target_in_fewer_than_half_its_runs_has_no_figure(monkeypatch):
    """Its fastest run alone would make it the calibration's choice; one in three reaching the
    target is no recipe to train with."""
    import edgerl.config.targets as targets

    cfg = preset("pong-cpu")
    mine = targets.settings_of(cfg)

    def run(name: str, reached_at: int, evaluated_to: int) -> SampleRun:
        return SampleRun(
            "ALE/Pong-v5", "pqn", 18.0, mine, "sync", "fp32", 100_000, name, reached_at,
            evaluated_to,
        )  # fmt: skip

    one_of_three = (run("a", 500_000, 600_000), run("b", 0, 2_000_000), run("c", 0, 2_000_000))
    monkeypatch.setattr(targets, "sample_runs", lambda: one_of_three)
    assert samples_to_target(cfg, "sync", "fp32") is None
    two_of_three = (*one_of_three[:2], run("c", 900_000, 2_000_000))
    monkeypatch.setattr(targets, "sample_runs", lambda: two_of_three)
    found = samples_to_target(cfg, "sync", "fp32")
    assert found is not None and (found.steps, found.reached) == (900_000, 2)
    assert not found.enough  # a figure, but two runs at the target: not one to choose on
    three = (*two_of_three, run("d", 1_000_000, 2_000_000))
    monkeypatch.setattr(targets, "sample_runs", lambda: three)
    found = samples_to_target(cfg, "sync", "fp32")
    assert found is not None and found.reached == MIN_REACHING == 3 and found.enough


def test_runs_of_another_pipeline_or_precision_say_nothing_of_a_config(monkeypatch):
    """Three runs at the target in one loop at fp32 back that way of training only: not the
    async pipeline, not bf16, not a precision this machine cannot train in (None)."""
    import edgerl.config.targets as targets

    cfg = preset("pong-cpu")
    mine = targets.settings_of(cfg)

    def run(name: str, pipeline: str, precision: str) -> SampleRun:
        return SampleRun(
            "ALE/Pong-v5", "pqn", 18.0, mine, pipeline, precision, 100_000, name, 800_000,
            2_000_000,
        )  # fmt: skip

    rows = tuple(run(f"s{i}", "sync", "fp32") for i in range(3))
    rows += (run("a", "async", "fp32"), run("b", "sync", "bf16"))
    monkeypatch.setattr(targets, "sample_runs", lambda: rows)
    found = samples_to_target(cfg, "sync", "fp32")
    assert found is not None and found.enough and {r.run for r in found.runs} == {"s0", "s1", "s2"}
    for pipeline, precision in [("async", "fp32"), ("sync", "bf16")]:
        other = samples_to_target(cfg, pipeline, precision)
        assert other is not None and not other.enough and len(other.runs) == 1
    assert samples_to_target(cfg, "async", "bf16") is None
    assert samples_to_target(cfg, "sync", None) is None


def test_a_setting_that_changes_what_a_step_teaches_leaves_the_runs_out():
    import dataclasses

    cfg = preset("pong-gpu-dqn")
    found = samples_to_target(cfg, "async", "fp32")
    assert found is not None and found.steps == 1_100_000  # the H100's run
    smaller = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, batch_size=32))
    assert samples_to_target(smaller, "async", "fp32") is None
    sticky = dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, repeat_action_probability=0.25)
    )
    assert samples_to_target(sticky, "async", "fp32") is None
    other_game = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, id="ALE/Breakout-v5"))
    assert samples_to_target(other_game, "async", "fp32") is None


@pytest.mark.parametrize("algo", ["dqn", "pqn", "ppo", "ga"])
def test_every_learner_names_the_settings_its_samples_depend_on_and_each_is_a_key(algo):
    from edgerl.config import keys

    sample_keys = learner_info(algo).sample_keys
    assert sample_keys and set(sample_keys) <= set(keys())


def test_the_bench_predicts_training_time_from_the_loops_at_the_configured_environments():
    """Each loop's pipeline's samples to target at the configured precision over its steps/s;
    loops at other counts (DQN's bench runs several) predict nothing, since the runs trained at
    one, and a pipeline no run of that precision trained in predicts nothing either."""
    from edgerl.measure.report import render
    from edgerl.measure.to_target import time_to_target

    loops = [
        {"mode": "sync", "num_envs": 128, "steps_per_s": 500.0},
        {"mode": "async", "num_envs": 128, "steps_per_s": 400.0},
        {"mode": "sync", "num_envs": 8, "steps_per_s": 900.0},
    ]
    predicted = time_to_target(preset("pong-cpu"), loops, "fp32")
    assert predicted is not None
    assert [(lp["mode"], lp["predicted_s"]) for lp in predicted["loops"]] == [
        # (1,200,000 + 11 evaluations before the last at 11,621 loop steps each + the last's
        # 22,290, the upper medians of the 8 runs on record) / 500
        ("sync", 2700.2),
        ("async", None),  # no run learned beside the actor at fp32
    ]
    text = render({"to_target": predicted})
    said = "to target:     1,200,000 env steps to 18 (the Kaplan-Meier median of the 8 runs"
    assert said in text
    said = "loop sync  128 env(s) at 500 steps/s: 45 min of training predicted, "
    assert said + "12 evaluations included" in text
    assert "loop async 128 env(s) at 400 steps/s: no run on record reached the target with" in text
    assert time_to_target(preset("pong-cpu"), loops[2:], "fp32")["loops"] == []  # type: ignore[index]
    assert "no loop was measured at the configured 128 environments" in render(
        {"to_target": time_to_target(preset("pong-cpu"), loops[2:], "fp32")}
    )
    gpu = time_to_target(preset("pong-gpu"), loops[:2], "bf16")
    assert gpu is not None
    # (1,500,032 + 2 x 43,571 + 167,121) / 500 and (1,000,064 + 134,207 + 698,483) / 400:
    # evaluations every 500,000 steps, each costing a GPU's loop far more of its steps than a
    # CPU's (the CPU evaluates while the GPU's loop would have run on)
    assert [lp["predicted_s"] for lp in gpu["loops"]] == [3508.6, 4581.9]
    assert "2 of 4 async runs at the target: fewer than 3" in render({"to_target": gpu})
    sticky = Config()  # the defaults: Pong with sticky actions, which no run on record used
    assert time_to_target(sticky, loops, "fp32") is None


def groups() -> list[tuple[str, str, str, str, str, int, int, str]]:
    """(learner, settings, pipeline, precision, evaluation periods, reached, runs, median) per
    group of rows with the same settings, pipeline and precision."""
    from edgerl.config.targets import grid

    out = []
    for key in sorted({(r.algo, r.settings, r.pipeline, r.precision) for r in sample_runs()}):
        runs = tuple(
            r for r in sample_runs() if (r.algo, r.settings, r.pipeline, r.precision) == key
        )
        reached = [r.reached_at for r in runs if r.reached_at]
        steps = km_median(reached, [r.evaluated_to for r in runs if not r.reached_at])
        median = f"{steps:,}" if steps else "–"
        algo, settings, pipeline, precision = key
        out.append(
            (
                algo.upper(),
                settings,
                pipeline,
                precision,
                grid(runs),
                len(reached),
                len(runs),
                median,
            )
        )
    return out


def test_the_performance_page_shows_the_samples_to_target_of_every_group_of_runs():
    page = (RUNS.parent / "performance.md").read_text()
    section = page[page.index("## Samples to target") :]
    rows = [line for line in section.splitlines() if line.startswith(("| DQN", "| PPO", "| PQN"))]
    shown = []
    for algo, settings, pipeline, precision, every, reached, runs, median in groups():
        words = settings.replace("env.repeat_action_probability=0.0 ", "")
        shown.append(
            f"| {algo} | `{words}` | {pipeline} | {precision} | {every} | {reached} of {runs} | "
            f"{median} |"
        )
    assert rows[: len(shown)] == shown


def test_the_bench_predicts_from_the_config_training_would_use_not_its_own_small_replay():
    """The bench measures with a small replay and early learning (its BENCH_SETTINGS); those
    are DQN sample keys, so the prediction is looked up with the config training would use."""
    from edgerl.measure.bench import BenchOptions, _config
    from edgerl.measure.to_target import time_to_target

    loops = [{"mode": "sync", "num_envs": 4, "steps_per_s": 100.0}]
    opts = BenchOptions(preset="pong-cpu-dqn")
    assert time_to_target(_config(opts), loops, "fp32") is None  # the bench's own: none on record
    predicted = time_to_target(_config(opts, bench_settings=False), loops, "fp32")
    assert predicted is not None  # (500,000 + 4 evaluations of 829 loop steps + 3,367) / 100
    assert predicted["loops"][0]["predicted_s"] == 5066.8


def test_a_run_whose_epochs_moved_counts_at_the_value_it_trained_at_or_not_at_all(tmp_path):
    """The learning balance may move PQN's epochs: a run counts at the value it held for 90%
    of its steps to the target, and where none did, it is a sample of no one value."""

    def metrics(*rows: tuple[int, str]) -> Path:
        lines = ["step,sps,epochs", *(f"{step},500,{epochs}" for step, epochs in rows)]
        (tmp_path / "metrics.csv").write_text("\n".join(lines) + "\n")
        return tmp_path

    early = metrics((10_000, "2.0"), (50_000, "1.0"), (1_000_000, "1.0"), (1_500_000, "2.0"))
    assert trained_at(early, "pqn.epochs", 1_000_000, 2) == 1  # 95% at 1 before the target
    halves = metrics((500_000, "2.0"), (1_000_000, "1.0"))
    assert trained_at(halves, "pqn.epochs", 1_000_000, 2) is None
    (tmp_path / "metrics.csv").write_text("step,sps\n10000,500\n")  # from before the column
    assert trained_at(tmp_path, "pqn.epochs", 1_000_000, 2) == 2


def test_the_prediction_adds_the_evaluations_on_record_and_says_how_far_off_it_may_be():
    """pong-cpu's prediction on two CPU cores: its 1,200,000 steps and 12 evaluations, the 11
    before the last costing the loop the time of 11,621 of its steps each and the last taking
    that of 22,290 (the upper medians of its 8 runs: start-up shared among the earlier ones, each at
    most one period; the H200's loop far outruns the CPU that evaluates), at the loop the
    halves predict times what the sync runs that kept their prediction made of theirs (the
    middle of 0.84, 0.97 and 1.14: 779.7 env steps/s against 925, 605.4 against 621, 1,113.0
    against 976); its error as the
    runs that reached 18 spread it (900,096 to 1,500,032 steps). At each run's own loop speed the
    model gives that run's time to the end of its evaluation at 18 within 15%."""
    from edgerl.hw.recipe import Recipe
    from edgerl.run.recipe_choice import Measured

    cfg = preset("pong-cpu")
    found = samples_to_target(cfg, "sync", "fp32")
    assert found is not None and (found.eval_cost_steps, found.eval_tail_steps) == (11_621, 22_290)
    assert found.evaluations(cfg.eval.every_steps) == 12
    measured = Measured(
        Recipe("pong-cpu", "", {}), 3044.0, 781.0, "sync", found, "fp32", found.runs, 100_000
    )
    assert measured.host_share == pytest.approx(605.4 / 621)
    loop = measured.loop_steps_per_s * measured.host_share
    assert measured.predicted_s == pytest.approx((1_200_000 + 11 * 11_621 + 22_290) / loop)
    said = measured.describe()
    assert "with 12 evaluations (each before the last adds the time of 11,621 loop steps " in said
    assert "and the last takes that of 22,290, on record; " in said
    assert (
        "the loop at 0.97 of the halves' prediction, as the 3 runs on record in the sync " in said
    )
    assert "pipeline that kept theirs went (0.84-1.14): the host work the halves leave out" in said
    assert "the 6 runs on record that reached it took 900,096 to 1,500,032 env steps: " in said
    gpu = Measured(Recipe("pong-gpu", "", {}), 9e3, 8e3, "async", found, "fp32", (), 100_000)
    assert gpu.host_share == 1.0  # no async run kept its prediction: said, not guessed
    assert "no run on record in the async pipeline kept its prediction" in gpu.describe()
    for run in (r for r in found.runs if r.reached_at):
        with (RUNS / run.run / "eval.csv").open(newline="") as f:
            at = next(e for e in csv.DictReader(f) if int(e["step"]) == run.reached_at)
        took = float(at["wall_s"]) + float(at["eval_s"])
        model = found.training_s(run.loop_sps, run.eval_every, run.reached_at)
        assert abs(model / took - 1) < 0.15, (run.run, model, took)
