"""Several seeds of a recipe (display/seeds.py, `edgerl train --seeds`, `edgerl results`): real
CartPole runs one after another, then summed up as the field does: k of n at the target, the
final score beside the best, the IQM and its 95% interval from rliable."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgerl.display.seeds import (
    Evaluation,
    SeedRun,
    curve,
    describe,
    figures,
    find_runs,
    protocol,
)
from edgerl.errors import MissingDependencyError, RunDirError

REPO = Path(__file__).resolve().parents[1]


def seed_run(seed: int, means: list[float], every: int = 1000, pace: float = 10.0) -> SeedRun:
    """A run whose evaluations every ``every`` steps scored ``means``, ``pace`` s apart."""
    evals = [Evaluation(every * (i + 1), pace * (i + 1), m) for i, m in enumerate(means)]
    return SeedRun(Path(f"seed-{seed}"), "CartPole-v1", "dqn", seed, evals)


def test_reached_is_the_first_evaluation_at_the_target_and_final_is_the_last_three():
    runs = [
        seed_run(0, [10, 500, 200, 300, 400]),  # reached early, then fell: final 300, best 500
        seed_run(1, [10, 20, 30, 500, 500]),
        seed_run(2, [10, 20, 30, 40, 50]),  # never
    ]
    f = figures(runs, target=500, reps=1000)
    assert [None if r is None else r.step for r in f.reached] == [2000, 4000, None]
    assert f.k == 2 and f.finals == [300.0, pytest.approx(343.333, abs=1e-3), 40.0]
    assert [r.best for r in runs] == [500, 500, 50]
    within = figures(runs, target=500, within_s=30.0, reps=1000)  # 40 s for seed 1: too late
    assert within.k == 1
    assert f.held == [False, False, False]  # seed 0 reached 500 and fell: reached, not held
    assert f.iqm.spread == pytest.approx((40.0, 1030 / 3)) and f.iqm.ci95 is None  # the range
    assert "  final score (mean of the last 3 evaluations): " in describe(f)
    # a run with fewer evaluations than the final's 3: the line says what each final is
    short = figures([seed_run(0, [10, 20]), seed_run(1, [5, 6, 7, 8])], target=500, reps=1000)
    assert short.finals == [15.0, 7.0]
    said = "  final score (mean of the last 3 evaluations, all of a run's where it has fewer (2)): "
    assert said in describe(short)
    both = figures([seed_run(0, [10, 20]), seed_run(1, [5, 7])], target=500, reps=1000)
    assert "  final score (mean of its 2 evaluations, fewer than 3): " in describe(both)


def test_the_median_time_to_the_target_counts_the_runs_that_did_not_reach_it():
    """The median of the runs that reached the target alone forgets the others: with one run of
    three not there, the median over all three is the slower of the two that were (the third
    counted as later); with two of three not there, there is none. Each is said beside the
    median of those that reached it."""
    from edgerl.display.seeds import describe

    fast, slow, never = seed_run(0, [500]), seed_run(1, [10, 10, 10, 500]), seed_run(2, [10] * 5)
    f = figures([fast, slow, never], target=500, reps=1000)
    assert (f.median_s_to_target, f.median_s_over_runs) == (25.0, 40.0)
    said = "median time to it 40 s over all 3 runs (the 1 that did not reach it counted as "
    assert said + "later), 25 s of the 2 that reached it, when the evaluation" in describe(f)
    assert f.to_dict()["median_wall_s_to_target_all_runs"] == 40.0
    f = figures([fast, never, seed_run(3, [10] * 5)], target=500, reps=1000)
    assert (f.median_s_to_target, f.median_s_over_runs) == (10.0, None)
    said = "no median time to it over all 3 runs (2 did not reach it); 10 s of the 1 that reached"
    assert said in describe(f)
    four = [fast, slow, seed_run(3, [10, 10, 500]), never]  # 3 of 4: the middle two's mean
    assert figures(four, target=500, reps=1000).median_s_over_runs == 35.0
    four[2] = seed_run(3, [10] * 4)  # 2 of 4: the middle two are 40 s and later: none
    assert figures(four, target=500, reps=1000).median_s_over_runs is None
    # --within: a run at the target only after the window counts as not there
    f = figures([fast, slow, never], target=500, within_s=30.0, reps=1000)
    assert (f.k, f.median_s_to_target, f.median_s_over_runs) == (1, 10.0, None)
    f = figures([fast, slow], target=500, reps=1000)  # all there: one median, said once
    assert f.median_s_over_runs == f.median_s_to_target == 25.0
    assert "; median time to it 25 s, when the evaluation that reached it ended" in describe(f)


def test_a_seed_given_two_runs_is_left_out_and_named_not_counted_twice_or_chosen():
    """Two runs of one seed (an hour rerun beside its first): neither is counted, the seed is
    named with both runs; where every seed has two, one sentence says to give the first."""
    first, rerun = seed_run(0, [10, 20, 30]), seed_run(0, [400, 500, 500])
    rerun.path = Path("seed-0-rerun")
    f = figures([first, rerun, seed_run(1, [100, 200, 300])], target=500, reps=1000)
    assert [r.seed for r in f.runs] == [1] and f.finals == [200.0] and f.k == 0
    said = "seed 0 left out: 2 runs of it given (seed-0, seed-0-rerun), and only its first counts"
    assert f.left_out == [said]
    assert describe(f).splitlines()[:2] == ["CartPole-v1, DQN: 1 run (seed 1)", f"  {said}"]
    assert f.to_dict()["left_out"] == [said]
    with pytest.raises(RunDirError, match=r"every seed given has more than one run .*seed-0-rerun"):
        figures([first, rerun], target=500, reps=1000)


def test_within_counts_only_the_evaluations_that_ended_inside_it_for_every_figure():
    """`--within T`: an evaluation counts when its result came within T (it began at wall_s
    and played eval_s while training went on), for reaching, holding, the final and the best."""
    evals = [
        Evaluation(1000 * (i + 1), 100.0 * (i + 1), m, 20.0)
        for i, m in enumerate([100, 500, 400, 300, 500, 500, 500])
    ]  # ended at 120, 220, ..., 720 s
    late = SeedRun(Path("late"), "CartPole-v1", "dqn", 0, evals)
    f = figures([late], target=450, within_s=430.0, reps=1000)  # the one of 400 s ended at 420
    assert f.finals == [400.0] and f.bests == [500.0] and f.held == [False]
    assert f.reached[0] is not None and f.reached[0].step == 2000 and f.k == 1
    assert f.median_s_to_target == 220.0  # when the evaluation that reached it ended
    assert f.to_dict()["runs"][0]["last_step"] == 4000
    assert figures([late], target=450, within_s=410.0, reps=1000).finals == [
        pytest.approx(1000 / 3)
    ]
    whole = figures([late], target=450, reps=1000)
    assert whole.finals == [500.0] and whole.held == [True]
    with pytest.raises(RunDirError, match="no evaluation that ended within 1 min 40 s"):
        figures([late], target=450, within_s=100.0, reps=1000)


def test_the_interval_is_the_same_whatever_numpys_global_generator_holds():
    """rliable's stratified bootstrap draws from NumPy's global generator, not the random_state
    it is given: the interval is seeded there for the call (what results.txt files quote must
    print again to the digit), and the caller's generator is given back as it was."""
    import numpy as np

    runs = [seed_run(s, [10, 20 + 7 * s, 30 + 11 * s, 40 + 3 * s]) for s in range(6)]
    intervals = []
    for before in (1, 2):
        np.random.seed(before)
        state = np.random.get_state()
        intervals.append(figures(runs, target=500, reps=2000).iqm.ci95)
        after = np.random.get_state()
        assert after[0] == state[0] and (after[1] == state[1]).all() and after[2:] == state[2:]
    assert intervals[0] is not None and intervals[0] == intervals[1]


def test_no_interval_from_fewer_than_five_runs_the_range_said_instead():
    """A percentile bootstrap of 3 runs' IQM is [min, max], of 4 the middle two's range: below
    5 runs `edgerl results` prints the range and says it is one; from 5 up rliable's interval."""
    from edgerl.display.seeds import describe

    four = [seed_run(0, [18.5, 17.0, 17.0])]  # reached 18 and fell: final 17.5
    four += [seed_run(i + 1, [v] * 3) for i, v in enumerate([19.2, 19.2, 20.9])]
    said = describe(figures(four, target=18, reps=1000))
    assert "95% CI" not in said
    assert "IQM 19.2, range 17.5-20.9 (4 runs: no interval from fewer than 5)" in said
    assert "4 of 4 reached it (one evaluation at it or above), 3 of 4 held it" in said
    one = describe(figures(four[:1], target=18, reps=1000))
    assert "IQM 17.5 (1 run: no interval from fewer than 5)" in one and "95% CI" not in one
    five = figures([*four, seed_run(4, [21.0] * 3)], target=18, reps=1000)
    assert five.iqm.ci95 is not None and "[95% CI " in describe(five)
    low, high = five.iqm.ci95
    assert low <= five.iqm.point <= high and five.to_dict()["final_iqm"]["range"] == [17.5, 21.0]


def test_the_iqm_is_rliables_to_the_last_bit():
    from rliable import metrics

    from edgerl.display.seeds import iqm

    rng = np.random.default_rng(0)
    for shape in [(1, 1), (3, 1), (4, 1), (5, 1), (7, 3), (10, 5)]:
        scores = rng.normal(size=shape) * 100
        assert iqm(scores) == metrics.aggregate_iqm(scores)


def test_the_iqm_is_rliables_the_mean_of_the_middle_half():
    runs = [seed_run(i, [v, v, v]) for i, v in enumerate([1.0, 2.0, 3.0, 100.0])]
    f = figures(runs, target=1000, reps=1000)
    assert f.iqm.point == pytest.approx(2.5)  # the outer quarters (1 and 100) left out
    assert f.human is None  # CartPole has no human reference


def test_seeds_on_one_grid_start_where_each_has_its_first_evaluation():
    a = seed_run(0, [1, 2, 3], every=100)  # at 100, 200, 300
    b = SeedRun(Path("b"), "CartPole-v1", "dqn", 1, [Evaluation(150, 1, 5), Evaluation(250, 2, 6)])
    x, values = curve([a, b], "steps")
    assert x.tolist() == [100, 150, 200, 250]  # up to the shorter one's last
    assert values[0].tolist() == [1, 1, 2, 2]  # the last evaluation at or before each x
    assert np.isnan(values[1][0]) and values[1][1:].tolist() == [5, 5, 6]


def test_the_protocol_is_read_from_the_runs_config():
    (run,) = find_runs([REPO / "docs" / "runs" / "pong-cpu-2core"])
    said = protocol(run)
    assert "sticky actions off" in said and "30 no-op starts" in said
    assert "108,000 frames (the human reference played 18,000" in said
    assert "10 greedy episodes an evaluation at epsilon 0.001" in said


def train_seeds(cli, run: Path, *more: str):
    args = ["--env", "CartPole-v1", "--steps", "2000", "--seeds", "2", "--run-dir", run]
    args += ["--set", "eval.every_steps=500", "--set", "eval.episodes=2", "--quiet", *more]
    return cli("train", *args)


def test_train_seeds_runs_each_seed_in_its_folder_and_results_sums_them_up(cli, tmp_path):
    run = tmp_path / "cartpole"
    r = train_seeds(cli, run, "--seed", "3")
    assert r.code == 0, r.err[-3000:]
    assert sorted(p.name for p in run.iterdir()) == ["seed-3", "seed-4"]
    for seed in (3, 4):
        assert f"seed = {seed}\n" in (run / f"seed-{seed}" / "config.toml").read_text()
    assert "== seed 4 (2 of 2)" in r.err and f"results {run}" in r.err
    # The same command again: both seeds have trained all their steps, nothing is redone.
    again = train_seeds(cli, run, "--seed", "3")
    assert again.code == 0 and "step 2,000/2,000:" not in again.err

    # The seed and the folder given with --set work as --seed and --run-dir do (each seed's
    # own are given to its run, and must not be taken for a disagreement with the --set).
    other = tmp_path / "other"
    sets = ["--set", "env.seed=7", "--set", f"train.run_dir={other}"]
    r = cli("train", "--env", "CartPole-v1", "--steps", "200", "--seeds", "2", "--quiet", *sets)
    assert r.code == 0, r.err[-3000:]
    assert sorted(p.name for p in other.iterdir()) == ["seed-7", "seed-8"]
    # 200 steps evaluate never (auto: off below 50,000): no `next: results` that would fail
    assert "next: " not in r.err and "these runs made no greedy evaluation" in r.err
    assert "--set eval.every_steps=N" in r.err

    picture = tmp_path / "seeds.png"
    r = cli("results", run, "--target", "30", "--json", "-o", picture, "--reps", "500")
    assert r.code == 0, r.err[-3000:]
    (doc,) = json.loads(r.out)
    assert doc["game"] == "CartPole-v1" and doc["learner"] == "dqn" and len(doc["runs"]) == 2
    for seed_doc in doc["runs"]:
        with (Path(seed_doc["path"]) / "eval.csv").open(newline="") as f:
            means = [float(row["return_mean"]) for row in csv.DictReader(f)]
        assert seed_doc["final"] == pytest.approx(np.mean(means[-3:]))
        assert seed_doc["best"] == max(means)
        first = next((i for i, m in enumerate(means) if m >= 30), None)
        assert (seed_doc["reached_step"] is None) == (first is None)
    assert doc["reached"] == sum(s["reached_step"] is not None for s in doc["runs"])
    assert doc["final_iqm"]["ci95"] is None  # two runs: no interval, their range
    low, high = doc["final_iqm"]["range"]
    assert low == min(s["final"] for s in doc["runs"]) and high == max(
        s["final"] for s in doc["runs"]
    )
    assert picture.stat().st_size > 10_000 and picture.read_bytes()[:4] == b"\x89PNG"
    text = cli("results", run, "--target", "30", "--reps", "500")
    assert "CartPole-v1, DQN: 2 runs (seeds 3, 4)" in text.out
    assert "target 30 (the given target): " in text.out and "of 2 held it" in text.out
    assert "95% CI" not in text.out and "(2 runs: no interval from fewer than 5)" in text.out


def test_the_pictures_band_is_an_interval_from_five_seeds_and_the_range_below():
    """`results -o` drew a "95% CI" band from 2-4 seeds, where the bootstrap gives about their
    range: below 5 seeds the band is the seeds' range, and its legend says so."""
    from edgerl.display.seeds import MIN_RUNS, _rliable, curve_band, iqm

    rng = np.random.default_rng(0)
    values = rng.normal(size=(MIN_RUNS, 6))
    few = values[: MIN_RUNS - 1]
    point, band, said = curve_band(_rliable(), few, 500)
    assert said == f"range (no interval from fewer than {MIN_RUNS} seeds)"
    assert np.array_equal(band[0], few.min(axis=0)) and np.array_equal(band[1], few.max(axis=0))
    assert point == pytest.approx([iqm(few[:, j]) for j in range(6)])
    point, band, said = curve_band(_rliable(), values, 500)
    assert said == "95% CI" and point == pytest.approx([iqm(values[:, j]) for j in range(6)])
    assert (band[0] <= point).all() and (point <= band[1]).all()
    assert not np.array_equal(band[0], values.min(axis=0))  # a bootstrap, not the range


def test_seeds_are_never_hidden_inside_a_run_and_every_tool_finds_them(cli, tmp_path):
    """README's order, a run then `--seeds`, nested the seeds inside the run, where results,
    status and play missed them: it is refused in one sentence. Seeds in a folder of their own
    are found by status, play, plot, serve and results, whether named or not."""
    from edgerl.serve.runs import find_runs as served_runs

    sets = ["--set", "eval.every_steps=200", "--set", "eval.episodes=1", "--quiet"]
    single = ["train", "--env", "CartPole-v1", "--steps", "400", *sets]
    assert cli(*single, "--run-dir", "runs/cp").code == 0
    r = cli(*single, "--seeds", "2", "--run-dir", "runs/cp")
    assert r.code == 2 and "Traceback" not in r.err
    assert "runs/cp holds a run of its own" in r.err and "--run-dir runs/cp-seeds" in r.err
    assert not list(Path("runs/cp").glob("seed-*"))

    assert cli(*single, "--seeds", "2", "--run-dir", "runs/cp-seeds").code == 0
    newest = Path("runs/cp-seeds/seed-1")
    r = cli("status", "--run-dir", "runs/cp-seeds")
    assert r.code == 0 and f"run {newest}:" in r.err, r.err
    r = cli("status")
    assert r.code == 0 and f"run {newest}:" in r.err, r.err
    r = cli("play", "--episodes", "1", "--json")
    assert r.code == 0 and f"run {newest}:" in r.err, r.err
    r = cli("play", "--run-dir", "runs/cp-seeds")  # which of them: one sentence naming them
    assert r.code == 2 and "holds the runs of `edgerl train --seeds` (seed-0, seed-1)" in r.err
    r = cli("plot", "--terminal", "--run-dir", "runs/cp-seeds")
    assert r.code == 0, r.err
    assert {"cp", "cp-seeds.seed-0", "cp-seeds.seed-1"} <= set(served_runs([Path("runs")]))
    r = cli("results", "runs", "--json", "--reps", "500")
    assert r.code == 0, r.err
    (doc,) = json.loads(r.out)  # all three found; seed 0's two runs named, neither counted
    assert [Path(run["path"]).name for run in doc["runs"]] == ["seed-1"]
    (left_out,) = doc["left_out"]
    assert str(Path("runs/cp")) in left_out and str(Path("runs/cp-seeds/seed-0")) in left_out
    # a plain run where the seeds are: refused, naming them, not as a folder of strangers
    r = cli("train", "--env", "CartPole-v1", "--steps", "400", "--run-dir", "runs/cp-seeds")
    assert r.code == 2 and "holds runs of `edgerl train --seeds` (seed-0, seed-1)" in r.err


def test_results_says_in_one_sentence_what_is_not_a_run(cli, tmp_path):
    r = cli("results", tmp_path / "nothing")
    assert r.code != 0 and "is not a directory; give run directories" in r.err
    (tmp_path / "empty").mkdir()
    r = cli("results", tmp_path / "empty")
    assert r.code != 0 and "neither a run directory nor a folder of them" in r.err
    assert "Traceback" not in r.err
    run = tmp_path / "young"
    run.mkdir()
    (run / "config.toml").write_text('[env]\nid = "CartPole-v1"\n')
    with pytest.raises(RunDirError, match="has no greedy evaluation yet"):
        find_runs([run])
    r = cli("results", "--within", "soon", run)
    assert r.code == 2 and "'soon' is not a duration" in r.err


def test_results_of_a_runs_folder_leaves_out_a_run_not_evaluated_yet(cli, tmp_path):
    """`edgerl results runs`: a game's run still filling its replay (no eval.csv yet) is left
    out and named, the others are summed up, seeds' folders in runs/ included; only a folder
    none of whose runs has an evaluation is refused."""
    runs = tmp_path / "runs"
    shutil.copytree(REPO / "docs" / "runs" / "pong-cpu-2core", runs / "Pong-v5")
    shutil.copytree(REPO / "docs" / "runs" / "pong-cpu-seeds", runs / "pong-seeds")
    young = runs / "CartPole-v1"
    young.mkdir()
    (young / "config.toml").write_text('[env]\nid = "CartPole-v1"\n[agent]\nalgo = "dqn"\n')
    r = cli("results", runs, "--reps", "500")
    assert r.code == 0, r.err[-3000:]
    assert "left out 1 run, with no greedy evaluation yet: CartPole-v1" in r.err
    seeds = len(list((runs / "pong-seeds").glob("seed-*")))
    assert f"ALE/Pong-v5, PQN, pong-cpu: {seeds + 1} runs" in r.out
    only_young = tmp_path / "young-runs"
    shutil.copytree(young, only_young / "CartPole-v1")
    r = cli("results", only_young)
    assert r.code != 0 and "none of the 1 run in" in r.err and "Traceback" not in r.err


def test_without_rliable_results_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "rliable", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'edgerl\[results\]'"):
        figures([seed_run(0, [1, 2, 3])], target=2)


def test_a_damaged_or_resumed_eval_csv_is_read_as_plot_reads_it(tmp_path, caplog):
    """A damaged line is skipped and said; rows a resume from an older checkpoint wrote again
    replace the ones they overlap (the run's evaluations are those of its final history)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[env]\nid = "CartPole-v1"\nseed = 7\n[agent]\nalgo = "pqn"\n')
    header = (
        "step,wall_s,episodes,return_mean,return_std,return_min,return_max,length_mean,cut,eval_s\n"
    )
    rows = [
        "1000,10,5,20,0,20,20,20,0,1",
        "2000,20,5,30,0,30,30,30,0,1",
        "3000,30,5,99,0,1,1,1,0,1",
    ]
    resumed = ["2000,21,5,40,0,40,40,40,0,1", "3000,31,5,50,0,50,50,50,0,1"]
    text = header + "\n".join(rows) + "\n\x00\x00garbage\n" + "\n".join(resumed) + "\n"
    (run / "eval.csv").write_bytes(text.encode())
    (found,) = find_runs([run])
    assert [(e.step, e.mean) for e in found.evaluations] == [(1000, 20), (2000, 40), (3000, 50)]
    assert found.seed == 7 and found.learner == "pqn"
    assert "1 damaged line at line 5" in caplog.text


def atari_run(game: str, seed: int, final: float) -> SeedRun:
    """A run of ``ALE/<game>-v5`` whose last three evaluations scored ``final``."""
    evals = [Evaluation(1000 * (i + 1), 10.0 * (i + 1), final) for i in range(3)]
    return SeedRun(Path(f"{game}-{seed}"), f"ALE/{game}-v5", "pqn", seed, evals)


def test_results_sets_es_hour_beside_a_game_and_predicts_the_57_game_median_from_atari5():
    """OpenAI ES's one-hour score beside each game that has one, and for a learner with runs of
    all five Atari-5 games the 57-game median their final scores predict, seed by seed and over
    the seeds; with a game of the five missing, no prediction (a missing game is not a zero)."""
    from edgerl.display.across_games import across_games
    from edgerl.display.seeds import describe, grouped
    from edgerl.envs.scores import atari5_median

    humans = {"BattleZone": 37187.5, "DoubleDunk": -16.4, "NameThisGame": 8049.0}
    humans |= {"Phoenix": 7242.6, "Qbert": 13455.0}
    runs = [atari_run(g, 0, h) for g, h in humans.items()]  # seed 0 plays like the human
    runs += [atari_run(g, 1, 2 * h if h > 0 else 0.0) for g, h in humans.items()]
    groups = grouped(runs)
    lines = across_games(groups, 3, 1000)
    seed1 = atari5_median({f"ALE/{g}-v5": 2 * h if h > 0 else 0.0 for g, h in humans.items()})
    (said,) = [line for line in lines if "Atari-5" in line]
    assert f"score of 0.85 (seed 0), {seed1:.2f} (seed 1); over the 2 seeds IQM " in said
    low, high = sorted((0.85, seed1))
    assert f"range {low:.2f}-{high:.2f} (2 seeds: no interval from fewer than 5)" in said
    # Seeds pair by their number, not their order; a second run of seed 0 in one game (two
    # hours of one seed) leaves seed 0 out, said, rather than choosing one of the two; so does
    # a seed one game has no run of. Both lines choose alike.
    twice = [*runs, atari_run("BattleZone", 0, 0.0), atari_run("Phoenix", 2, 0.0)]
    over, said = across_games(grouped(twice[::-1]), 3, 1000)
    doubled = "seed 0 left out (ALE/BattleZone-v5 has 2 runs of it)"
    missing = "seed 2 left out (no run of ALE/BattleZone-v5, ALE/DoubleDunk-v5,"
    assert f"score of {seed1:.2f} (seed 1); {doubled}; {missing}" in said
    assert "over the" not in said
    assert over.startswith("PQN over 5 games x 1 seed: ") and doubled in over and missing in over
    only_twice = [r for r in twice if r.seed == 0]
    (over, said) = across_games(grouped(only_twice), 3, 1000)
    assert said.startswith("PQN on Atari-5 (Aitchison et al. 2022): no seed has one run of each")
    assert over == f"PQN over 5 games: no seed has one run of each game; {doubled}"
    (over,) = [line for line in lines if "over 5 games x 2 seeds" in line]
    assert "95% CI" not in over and "(2 seeds a game: no interval from fewer than 5)" in over
    (one_seed,) = across_games(grouped(runs[:5]), 3, 1000)[:1]  # one run a game: no "CI 0.61, 0.61"
    assert "95% CI" not in one_seed and "(1 seed a game: no interval" in one_seed
    assert not any("Atari-5" in line for line in across_games(grouped(runs[1:5]), 3, 1000))

    qbert = describe(figures(groups[("ALE/Qbert-v5", "pqn")], reps=1000))
    assert "OpenAI ES after an hour on 720 CPUs (Salimans et al. 2017): 147.5" in qbert
    assert "final scores above it: 2 of 2" in qbert
    phoenix = figures(groups[("ALE/Phoenix-v5", "pqn")], reps=1000)
    assert "OpenAI ES" not in describe(phoenix)  # the paper has no Phoenix
    assert phoenix.to_dict()["es_hour"] is None


def test_runs_are_named_by_their_recipe_and_the_learning_they_changed_in_it(tmp_path):
    """`--preset pong-cpu --set pqn.epochs=1` and `--preset board`'s calibrated choice of the
    same learn alike and are named alike (each was "pong-cpu (--preset pong-cpu)" or the
    calibration's whole why); a run of the preset as it is keeps its name."""
    from edgerl.display.seeds import read_run

    runs = REPO / "docs" / "runs"
    by_set = read_run(runs / "pong-cpu-epochs1-seeds" / "seed-1")
    assert by_set.recipe == "pong-cpu pqn.epochs=1"
    assert read_run(runs / "pong-cpu-seeds" / "seed-1").recipe == "pong-cpu"
    assert read_run(runs / "pong-cpu-2core-ppo").recipe == "pong-cpu agent.algo=ppo"
    board = tmp_path / "board"
    board.mkdir()
    for name in ("eval.csv", "metrics.csv"):
        (board / name).write_bytes((runs / "pong-cpu-seeds" / "seed-1" / name).read_bytes())
    config = (runs / "pong-cpu-epochs1-seeds" / "seed-1" / "config.toml").read_text()
    said = 'recipe = "pong-cpu (--preset pong-cpu)"'
    assert said in config
    why = "no CUDA GPU: calibrated here, the least time predicted: pong-cpu: actor 3,044 ..."
    (board / "config.toml").write_text(
        config.replace(said, f'recipe = "pong-cpu pqn.epochs=1 ({why})"')
    )
    assert read_run(board).recipe == "pong-cpu pqn.epochs=1"


def test_a_run_of_the_continuous_recipe_is_named_by_it_alone(tmp_path):
    """A HalfCheetah SAC seed on record as if trained by `--preset halfcheetah-cpu`: named
    plainly, its settings read against SAC's presets for a continuous game of vectors (against
    the frames' it would seem to change seven)."""
    from edgerl.display.seeds import read_run

    seed = REPO / "docs" / "runs" / "halfcheetah-sac-seeds" / "seed-0"
    run = tmp_path / "seed-0"
    run.mkdir()
    for name in ("eval.csv", "metrics.csv"):
        (run / name).write_bytes((seed / name).read_bytes())
    config = (seed / "config.toml").read_text()
    assert 'recipe = ""' in config
    said = 'recipe = "halfcheetah-cpu (--preset halfcheetah-cpu)"'
    (run / "config.toml").write_text(config.replace('recipe = ""', said))
    assert read_run(run).recipe == "halfcheetah-cpu"
