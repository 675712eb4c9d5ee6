"""Samples to target (edgerl/data/samples_to_target.csv) against the runs under docs/runs/: every
Pong run on record is a row, with the settings of its config.toml and the steps of its eval.csv;
a config finds the runs that share its settings and no others."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from edgerl.config import Config
from edgerl.config.learners import learner_info
from edgerl.config.parse import tomllib
from edgerl.config.targets import (
    COMMON_KEYS,
    SampleRun,
    median_steps,
    sample_runs,
    samples_to_target,
    text_of,
)

RUNS = Path(__file__).resolve().parents[1] / "docs" / "runs"
PONG_TARGET = 18.0


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
    return SampleRun(
        env_id="ALE/Pong-v5",
        algo=algo,
        target=PONG_TARGET,
        settings=" ".join(f"{k}={text_of(v)}" for k, v in settings.items()),
        run=str(run.relative_to(RUNS)),
        reached_at=reached[0] if reached else 0,
        evaluated_to=int(evals[-1]["step"]),
    )


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


def test_pong_cpu_finds_the_pqn_runs_that_share_its_settings_whatever_machine_ran_them():
    """pong-cpu and pong-gpu learn with the same settings (the GPU's differ in speed only): seven
    of ten such runs reached 18, the rest stopped by the clock or at 1.5M steps (fp32)."""
    found = samples_to_target(preset("pong-cpu"))
    assert found is not None
    assert (found.reached, len(found.runs)) == (7, 10)
    # the two stopped at 250,112 and 500,096 say nothing of later steps; of the 8 runs evaluated
    # past 900,096, 1 reached 18 there, 1 of 7 at 1,000,064 and 2 of 6 at 1,200,000: the share
    # not there yet is 7/8 * 6/7 * 4/6 = 1/2 (the fp32 run, never at 18, counts in each)
    assert found.steps == 1_200_000
    assert samples_to_target(preset("pong-gpu")) == found
    dqn = samples_to_target(preset("pong-cpu-dqn"))  # the AMD EPYC's run; the Xeon's stopped
    assert dqn is not None and (dqn.steps, dqn.reached, len(dqn.runs)) == (500_000, 1, 2)
    said = "1,200,000 env steps to 18 (the Kaplan-Meier median of the 10 runs on record with "
    assert said + "these settings, 7 of which reached it)" in found.describe()


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
        return SampleRun("ALE/Pong-v5", "pqn", 18.0, mine, name, reached_at, evaluated_to)

    one_of_three = (run("a", 500_000, 600_000), run("b", 0, 2_000_000), run("c", 0, 2_000_000))
    monkeypatch.setattr(targets, "sample_runs", lambda: one_of_three)
    assert samples_to_target(cfg) is None
    two_of_three = (*one_of_three[:2], run("c", 900_000, 2_000_000))
    monkeypatch.setattr(targets, "sample_runs", lambda: two_of_three)
    found = samples_to_target(cfg)
    assert found is not None and (found.steps, found.reached) == (900_000, 2)


def test_a_setting_that_changes_what_a_step_teaches_leaves_the_runs_out():
    import dataclasses

    cfg = preset("pong-gpu-dqn")
    found = samples_to_target(cfg)
    assert found is not None and found.steps == 1_100_000  # the H100's run
    smaller = dataclasses.replace(cfg, agent=dataclasses.replace(cfg.agent, batch_size=32))
    assert samples_to_target(smaller) is None
    sticky = dataclasses.replace(
        cfg, env=dataclasses.replace(cfg.env, repeat_action_probability=0.25)
    )
    assert samples_to_target(sticky) is None
    other_game = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, id="ALE/Breakout-v5"))
    assert samples_to_target(other_game) is None


@pytest.mark.parametrize("algo", ["dqn", "pqn", "ppo", "ga"])
def test_every_learner_names_the_settings_its_samples_depend_on_and_each_is_a_key(algo):
    from edgerl.config import keys

    sample_keys = learner_info(algo).sample_keys
    assert sample_keys and set(sample_keys) <= set(keys())


def test_the_bench_predicts_training_time_from_the_loops_at_the_configured_environments():
    """The runs' samples to target over each loop's steps/s at the configured count; loops at
    other counts (DQN's bench runs several) predict nothing, since the runs trained at one."""
    from edgerl.measure.report import render
    from edgerl.measure.to_target import time_to_target

    loops = [
        {"mode": "sync", "num_envs": 128, "steps_per_s": 500.0},
        {"mode": "async", "num_envs": 128, "steps_per_s": 400.0},
        {"mode": "sync", "num_envs": 8, "steps_per_s": 900.0},
    ]
    predicted = time_to_target(preset("pong-cpu"), loops)
    assert predicted is not None
    assert [(lp["mode"], lp["predicted_s"]) for lp in predicted["loops"]] == [
        ("sync", 2400.0),  # 1,200,000 / 500
        ("async", 3000.0),
    ]
    text = render({"to_target": predicted})
    said = "to target:     1,200,000 env steps to 18 (the Kaplan-Meier median of the 10 runs"
    assert said in text
    assert "loop sync  128 env(s) at 500 steps/s: 40 min of training predicted" in text
    assert time_to_target(preset("pong-cpu"), loops[2:])["loops"] == []  # type: ignore[index]
    assert "no loop was measured at the configured 128 environments" in render(
        {"to_target": time_to_target(preset("pong-cpu"), loops[2:])}
    )
    sticky = Config()  # the defaults: Pong with sticky actions, which no run on record used
    assert time_to_target(sticky, loops) is None


def groups() -> list[tuple[str, str, int, int, str]]:
    """(learner, settings, reached, runs, median) per group of rows with the same settings."""
    out = []
    for algo, settings in sorted({(r.algo, r.settings) for r in sample_runs()}):
        runs = [r for r in sample_runs() if (r.algo, r.settings) == (algo, settings)]
        reached = [r.reached_at for r in runs if r.reached_at]
        steps = km_median(reached, [r.evaluated_to for r in runs if not r.reached_at])
        median = f"{steps:,}" if steps else "–"
        out.append((algo.upper(), settings, len(reached), len(runs), median))
    return out


def test_the_performance_page_shows_the_samples_to_target_of_every_group_of_runs():
    page = (RUNS.parent / "performance.md").read_text()
    section = page[page.index("## Samples to target") :]
    for algo, settings, reached, runs, median in groups():
        shown = settings.replace("env.repeat_action_probability=0.0 ", "")
        row = f"| {algo} | `{shown}` | {reached} of {runs} | {median} |"
        assert row in section, row


def test_the_bench_predicts_from_the_config_training_would_use_not_its_own_small_replay():
    """The bench measures with a small replay and early learning (its BENCH_SETTINGS); those
    are DQN sample keys, so the prediction is looked up with the config training would use."""
    from edgerl.measure.bench import BenchOptions, _config
    from edgerl.measure.to_target import time_to_target

    loops = [{"mode": "sync", "num_envs": 4, "steps_per_s": 100.0}]
    opts = BenchOptions(preset="pong-cpu-dqn")
    assert time_to_target(_config(opts), loops) is None  # the bench's own: nothing on record
    predicted = time_to_target(_config(opts, bench_settings=False), loops)
    assert predicted is not None and predicted["loops"][0]["predicted_s"] == 5000.0


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
