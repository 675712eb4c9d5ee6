"""docs/results.md against the runs it reports: every row's figures are those of the committed
eval.csv, the evaluation it names is the first to reach its target, and `edgerl plot` reads
each committed run. No test trains Pong: the runs under docs/runs/ are what was trained."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results.md"
ROW = re.compile(r"^\|(?P<cells>.*)\|\s*$")


def table_rows() -> list[dict[str, str]]:
    """The rows of the results table (the first table of docs/results.md), by header."""
    lines = RESULTS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| game"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        m = ROW.match(line)
        if m is None:
            break
        cells = [c.strip() for c in m["cells"].split("|")]
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def run_dir(row: dict[str, str]) -> Path:
    target = re.search(r"\]\((runs/[^)]+)\)", row["run files"])
    assert target, f"row {row['game']} links no run directory"
    return (RESULTS.parent / target[1]).resolve()


def evaluations(run: Path) -> list[dict[str, str]]:
    with (run / "eval.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def number(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))


def wall_seconds(text: str) -> float:
    """``17 min 32 s`` or ``52 s`` as seconds."""
    m = re.fullmatch(r"(?:(\d+) min)?\s*(?:(\d+) s)?", text.strip())
    assert m and any(m.groups()), f"wall time {text!r} is not 'M min S s'"
    return int(m[1] or 0) * 60 + int(m[2] or 0)


ROWS = table_rows()


def test_the_table_has_pong_and_cartpole_with_both_learners():
    games = {(r["game"].split()[0], r["learner"]) for r in ROWS}
    assert {
        ("Pong", "PQN"),
        ("Pong", "DQN"),
        ("CartPole-v1", "DQN"),
        ("CartPole-v1", "PQN"),
    } <= games


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_a_rows_figures_are_its_runs_first_evaluation_at_the_target_or_its_best(row):
    run = run_dir(row)
    for name in ("eval.csv", "metrics.csv", "config.toml"):
        assert (run / name).is_file(), f"{run} lacks {name}"
    target = number(re.search(r"\(target (-?[\d.]+)[^)]*\)", row["game"])[1])
    found = re.fullmatch(r"(-?[\d.]+) ± ([\d.]+) \((\d+) episodes\)(.*)", row["greedy mean ± std"])
    assert found, f"{row['greedy mean ± std']!r} is not 'MEAN ± STD (N episodes)'"
    mean, std, episodes, note = found.groups()
    evals = evaluations(run)
    reached = [e for e in evals if float(e["return_mean"]) >= target]
    if reached:  # the first evaluation at the target
        shown = reached[0]
        assert not note.strip()
    else:  # none reached it: the best one, and the row says so
        shown = max(evals, key=lambda e: float(e["return_mean"]))
        assert "not reached" in note
    assert int(number(row["env steps"])) == int(shown["step"])
    assert wall_seconds(row["wall time"]) == round(float(shown["wall_s"]))
    assert float(mean) == pytest.approx(float(shown["return_mean"]), abs=0.05)
    assert float(std) == pytest.approx(float(shown["return_std"]), abs=0.05)
    assert int(episodes) == int(shown["episodes"])


FINAL = "final (mean of the last 3 evaluations)"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_a_rows_final_score_is_the_mean_of_its_last_three_evaluations(row):
    """Beside the first evaluation at the target (or the best), what the run ended at: the mean
    of its last three evaluations, to its last evaluated step, saying so where it had three or
    fewer in all."""
    evals = evaluations(run_dir(row))
    found = re.fullmatch(r"(-?[\d.]+) \(to step ([\d,]+)(?:; (.+))?\)", row[FINAL])
    assert found, f"{row[FINAL]!r} is not 'FINAL (to step N)'"
    last = [float(e["return_mean"]) for e in evals[-3:]]
    assert float(found[1]) == pytest.approx(sum(last) / len(last), abs=0.05)
    assert int(number(found[2])) == int(evals[-1]["step"])
    if len(evals) == 1:
        assert found[3] == "its only evaluation"
    elif len(evals) <= 3:
        assert found[3] == f"all {len(evals)} of its evaluations"
    else:
        assert found[3] is None


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_a_rows_human_normalised_score_is_its_evaluations_against_the_reference(row):
    """The column holds the shown evaluation's mean return human-normalised with the reference
    scores edgerl ships for the run's game (config.toml's env.id), or a dash where it has none."""
    import tomllib

    from edgerl.envs.scores import human_normalised

    run = run_dir(row)
    env_id = tomllib.loads((run / "config.toml").read_text())["env"]["id"]
    mean = number(re.match(r"(-?[\d.]+)", row["greedy mean ± std"])[1])
    expected = human_normalised(env_id, mean)
    if expected is None:
        assert row["human-normalised"] == "–"
    else:
        assert number(row["human-normalised"]) == pytest.approx(expected, abs=0.005)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_a_rows_energy_is_its_load_csv_up_to_the_evaluation_shown(row):
    """Where the run's load.csv holds power samples, the energy to the row's evaluation is
    their integral up to its step; elsewhere a dash (nothing is estimated)."""
    from edgerl.hw.energy import energy_from_load_csv

    run = run_dir(row)
    joules, samples = energy_from_load_csv(run / "load.csv", int(number(row["env steps"])))
    if samples == 0:
        assert row["energy to it"] == "–"
    else:
        shown = re.fullmatch(r"([\d.]+) Wh \((.+)\)", row["energy to it"])
        assert shown, row["energy to it"]
        assert float(shown[1]) == pytest.approx(joules / 3600, abs=0.05)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_edgerl_plot_reads_every_committed_run(cli, row):
    run = run_dir(row)
    r = cli("plot", "--terminal", "--run-dir", run)
    assert r.code == 0, r.err
    assert "eval" in r.out  # the greedy evaluations are drawn


def test_the_command_of_a_row_is_what_its_config_says(cli):
    """A row whose command names a preset resolves to the settings its run saved (the run
    directory and the machine's threads aside)."""
    import tomllib

    checked = 0
    for row in ROWS:
        command = re.search(r"`edgerl train ([^`]*)`", row["command"])
        if command is None or "--preset" not in command[1]:
            continue
        r = cli("config", *command[1].split())
        assert r.code == 0, r.err
        shown = tomllib.loads(r.out)
        saved = tomllib.loads((run_dir(row) / "config.toml").read_text())
        # env.batch_size = -1 and env.pin_threads (auto) are resolved by the trainer for its
        # device (a run from before pin_threads has none)
        assert shown["env"].pop("batch_size") == -1
        saved["env"].pop("batch_size")
        assert shown["env"].pop("pin_threads") == "auto"
        saved["env"].pop("pin_threads", None)
        if "make_kwargs" not in saved["env"]:  # a run from before the key: gymnasium's defaults
            assert shown["env"].pop("make_kwargs") == {}
        for section in ("env", "agent", "pqn", "eval"):
            assert shown[section] == saved[section], section
        assert shown["train"]["steps"] == saved["train"]["steps"]
        checked += 1
    assert checked, "no row is trained by a --preset command"


def test_the_records_training_quotes_are_rows_of_the_table():
    """What `edgerl train` says a run can expect (edgerl/data/records.csv) is the table's: each
    record is a row with its run directory, env steps, wall time and greedy mean; every Atari
    row whose target was reached is a record, and so is every row of a game no row reached the
    target of (its best: what an hour gave there)."""
    from edgerl.report.estimate import records

    by_run = {run_dir(r).name: r for r in ROWS}
    for rec in records():
        row = by_run[rec.run]
        assert int(number(row["env steps"])) == rec.steps
        assert wall_seconds(row["wall time"]) == round(rec.wall_s)
        assert number(row["greedy mean ± std"].split()[0]) == pytest.approx(rec.greedy_mean)
        assert row["learner"].lower() == rec.algo
        assert ("no GPU" not in row["machine"]) == (rec.machine == "gpu")
    games = {r["game"] for r in ROWS if not r["game"].startswith("CartPole")}
    reached = {
        g
        for g in games
        for r in ROWS
        if r["game"] == g and "not reached" not in r["greedy mean ± std"]
    }
    atari = [
        r
        for r in ROWS
        if r["game"] in games
        and ("not reached" not in r["greedy mean ± std"] or r["game"] not in reached)
    ]
    assert {run_dir(r).name for r in atari} == {rec.run for rec in records()}


RUNS = REPO / "docs" / "runs"
# Each seed table: the runs it sums up, its target and the training time it counts it within.
SEED_TABLES = {
    "CartPole, 5 seeds each": (
        [RUNS / "cartpole-seeds" / a for a in ("dqn", "pqn", "ga", "ppo")],
        500,
        None,
    ),
    "Pong on two CPU cores, 4 seeds: `--preset pong-cpu`": (
        [RUNS / "pong-cpu-2core", RUNS / "pong-cpu-seeds"],
        18,
        3600.0,
    ),
    "Pong at one epoch on two CPU cores, 3 seeds: `--preset pong-cpu --set pqn.epochs=1`": (
        [RUNS / "pong-cpu-2core-epochs1", RUNS / "pong-cpu-epochs1-seeds"],
        18,
        2700.0,
    ),
    "Pong on two CPU cores, seeds 4-6 on the Intel Xeon: `--preset board`": (
        [RUNS / "pong-cpu-xeon-seeds"],
        18,
        3600.0,
    ),
    "Breakout on two CPU cores, 3 seeds: `--preset atari-cpu --env ALE/Breakout-v5`": (
        [RUNS / "breakout-cpu-2core-pqn", RUNS / "breakout-cpu-seeds"],
        30.5,
        3600.0,
    ),
}


def table_at(lines: list[str], first: str, at: int = 0) -> list[dict[str, str]]:
    """The rows of the first table from line ``at`` on whose header starts ``| first``, by
    header."""
    start = next(i for i in range(at, len(lines)) if lines[i].startswith(f"| {first}"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in line.strip("|").split("|")], strict=True)))
    return rows


def seed_rows(title: str) -> list[dict[str, str]]:
    """The table under the heading ``### title`` of docs/results.md, by header."""
    lines = RESULTS.read_text().splitlines()
    return table_at(lines, "recipe", lines.index(f"### {title}"))


def cell(row: dict[str, str], starts: str) -> tuple[str, str]:
    """The header and the cell of ``row``'s column whose header starts with ``starts``."""
    return next((k, v) for k, v in row.items() if k.startswith(starts))


@pytest.mark.parametrize("title", SEED_TABLES)
def test_a_seed_tables_figures_are_those_of_its_committed_runs(title):
    """k of n reached and held, the median time to the target (when the evaluation that reached
    it ended), each seed's final score and best within the table's time, and the IQM's point
    estimate, as `edgerl results` computes them from the committed eval.csv files; from 5 seeds
    up with rliable's interval (a bootstrap: checked to contain the point, not to the digit),
    from fewer with the seeds' range and no "95% CI"."""
    from edgerl.display.seeds import MIN_RUNS, figures, find_runs, grouped
    from edgerl.words import duration

    folders, target, within = SEED_TABLES[title]
    groups = grouped(find_runs(folders))
    by_learner = {runs[0].learner.upper(): runs for runs in groups.values()}
    rows = seed_rows(title)
    assert sorted(r["recipe"].split()[0].strip(",") for r in rows) == sorted(by_learner)
    for row in rows:
        runs = by_learner[row["recipe"].split()[0].strip(",")]
        f = figures(runs, target=target, within_s=within, reps=1000)
        assert cell(row, "reached")[1] == f"**{f.k} of {len(runs)}**"
        assert cell(row, "held it")[1] == f"{sum(f.held)} of {len(runs)}"
        # as `edgerl results` writes it: over every run (one not at the target counted as
        # later), beside the median of those that reached it where one did not
        said = row["median time to it (steps)"]
        everyone = f.to_dict()["median_wall_s_to_target_all_runs"]
        assert said.startswith("none (" if everyone is None else f"{duration(everyone)} (")
        if f.k < len(runs):
            theirs = f"{duration(f.median_s_to_target)} of the {f.k} that reached it"
            assert f"(over all {len(runs)}; {theirs}; " in said
        shown = [float(v) for v in cell(row, "final score per seed")[1].split(", ")]
        assert shown == pytest.approx(f.finals, abs=0.05)
        best = cell(row, "best")[1]
        if best.endswith(" each"):
            assert f.bests == [number(best.split()[0])] * len(runs)
        else:
            assert [number(b) for b in best.split(", ")] == pytest.approx(f.bests, abs=0.05)
        header, iqm = cell(row, "IQM of the final scores")
        if len(runs) >= MIN_RUNS:
            point, low, high = re.fullmatch(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", iqm).groups()
            assert "95% CI" in header and float(low) <= float(point) <= float(high)
        else:
            found = re.match(r"(-?[\d.]+) \(range (-?[\d.]+)(?:-| to )(-?[\d.]+)[;)]", iqm)
            assert found, f"{iqm!r} is not 'IQM (range LOW-HIGH)'"
            point, low, high = found.groups()
            assert "95% CI" not in header + iqm and "range" in header
            assert (float(low), float(high)) == pytest.approx(f.iqm.spread, abs=0.05)
        assert float(point) == pytest.approx(f.iqm.point, abs=0.05)


PONG_SEEDS = "Pong on two CPU cores, 4 seeds: `--preset pong-cpu`"


def test_results_within_an_hour_takes_each_final_from_the_evaluations_inside_it(cli):
    """`edgerl results --within 1h` of pong-cpu's four seeds: seed 1 trained 84 minutes, and
    its final is the mean of its last three evaluations that ended inside the hour (17.5), not
    of those at 74-84 minutes (20.2), so it reached 18 but did not hold it; four runs give no
    95% interval but their range; the time to 18 is when its evaluation ended."""
    from edgerl.words import duration

    r = cli("results", *SEED_TABLES[PONG_SEEDS][0], "--target", "18", "--within", "1h")
    assert r.code == 0, r.err
    evals = evaluations(RUNS / "pong-cpu-seeds" / "seed-1")
    ended = [e for e in evals if float(e["wall_s"]) + float(e["eval_s"]) <= 3600]
    assert len(ended) < len(evals)  # it trained past the hour
    inside = sum(float(e["return_mean"]) for e in ended[-3:]) / 3
    after = sum(float(e["return_mean"]) for e in evals[-3:]) / 3
    assert (round(inside, 1), round(after, 1)) == (17.5, 20.2)
    assert "per seed 19.2, 17.5, 19.2, 20.9" in r.out
    assert "IQM 19.2, range 17.5-20.9 (4 runs: no interval from fewer than 5)" in r.out
    assert "95% CI" not in r.out
    assert "4 of 4 reached it (one evaluation at it or above), 3 of 4 held it" in r.out
    hit = next(e for e in ended if float(e["return_mean"]) >= 18)
    began, done = float(hit["wall_s"]), float(hit["wall_s"]) + float(hit["eval_s"])
    assert f"step {int(hit['step']):,}: {duration(began)} to {duration(done)}" in r.out


README = REPO / "README.md"


# Every seed of pong-cpu on record (each seed's first run: docs/results.md's rule), and the one
# that ran on an AMD EPYC (the rest on the Intel Xeon class).
PONG_CPU_EVERY_SEED = [
    RUNS / "pong-cpu-2core",
    RUNS / "pong-cpu-seeds",
    RUNS / "pong-cpu-xeon-seeds",
]
PONG_CPU_EPYC_SEED = 3


def test_readmes_pong_cpu_headline_is_what_results_prints_within_the_hour():
    """README's "N of N seeds within an hour" sentence: reached and held, the median time to 18
    (whole minutes) and each seed's final in the hour (the Xeon's in seed order, then the
    EPYC's), as `edgerl results --within 1h` of every seed of pong-cpu on record computes
    them."""
    text = " ".join(README.read_text().split())
    found = re.search(
        r"\(`--preset pong-cpu`\): \*\*(\d+) of (\d+) seeds within an hour\*\*, (\d+) of (\d+) "
        r"held it \(median (\d+) minutes(?: over all (\d+), (\d+) of the (\d+) that reached it)?; "
        r"finals in the hour ([\d., ]+) on a Xeon, ([\d.]+) on an EPYC\)",
        text,
    )
    assert found, "README's pong-cpu headline is not in the form this test reads"
    from edgerl.display.seeds import figures, find_runs

    f = figures(find_runs(PONG_CPU_EVERY_SEED), target=18, within_s=3600.0)
    n = len(f.runs)
    assert found.groups()[:4] == (str(f.k), str(n), str(sum(f.held)), str(n))
    # over every seed (one not at 18 counted as later), and of those at 18 where one was not
    assert f.median_s_over_runs is not None and f.median_s_to_target is not None
    assert int(found[5]) == round(f.median_s_over_runs / 60)
    if f.k == n:
        assert found[6] is None, "every seed reached 18: one median"
    else:
        assert found[6] is not None, "a seed did not reach 18: both medians, said as such"
        assert (int(found[6]), int(found[8])) == (n, f.k)
        assert int(found[7]) == round(f.median_s_to_target / 60)
    final_of = {run.seed: final for run, final in zip(f.runs, f.finals, strict=True)}
    epyc = final_of.pop(PONG_CPU_EPYC_SEED)
    xeon = [final_of[seed] for seed in sorted(final_of)]
    assert [float(v) for v in found[9].split(", ")] == pytest.approx(xeon, abs=0.05)
    assert float(found[10]) == pytest.approx(epyc, abs=0.05)


# What `edgerl results` printed for each seed section: its runs (under docs/runs/) and options.
PRINTED = {
    "cartpole-seeds/results.txt": (
        ["cartpole-seeds/dqn", "cartpole-seeds/pqn", "cartpole-seeds/ga", "cartpole-seeds/ppo"],
        ["--target", "500"],
    ),
    "pong-cpu-seeds/results.txt": (
        ["pong-cpu-2core", "pong-cpu-seeds"],
        ["--target", "18", "--within", "1h"],
    ),
    "pong-cpu-epochs1-seeds/results.txt": (
        ["pong-cpu-2core-epochs1", "pong-cpu-epochs1-seeds"],
        ["--target", "18", "--within", "45m"],
    ),
    "pong-cpu-xeon-seeds/results.txt": (
        ["pong-cpu-xeon-seeds"],
        ["--target", "18", "--within", "1h"],
    ),
    "pong-cpu-xeon-seeds/every-seed.txt": (
        ["pong-cpu-2core", "pong-cpu-seeds", "pong-cpu-xeon-seeds"],
        ["--target", "18", "--within", "1h"],
    ),
    "breakout-cpu-seeds/results.txt": (
        ["breakout-cpu-2core-pqn", "breakout-cpu-seeds"],
        ["--target", "30.5", "--within", "1h"],
    ),
    "pendulum-seeds/results.txt": (["pendulum-seeds/sac"], ["--target", "-300"]),
    "halfcheetah-ppo-seeds/results.txt": (["halfcheetah-ppo-seeds"], []),
    "hopper-ppo-seeds/results.txt": (["hopper-ppo-seeds"], []),
    "halfcheetah-sac-seeds/results.txt": (["halfcheetah-sac-seeds"], []),
    "hopper-sac-seeds/results.txt": (["hopper-sac-seeds"], []),
}


@pytest.mark.parametrize("name", PRINTED)
def test_what_results_printed_is_what_it_prints_today(cli, name):
    """A committed results.txt is `edgerl results`' output for its runs, line for line (times
    to the second as the tables write them; rliable's bootstrap is seeded)."""
    runs, options = PRINTED[name]
    r = cli("results", *[RUNS / run for run in runs], *options)
    assert r.code == 0, r.err
    assert r.out == (RUNS / name).read_text()


ES_COLUMN = "OpenAI ES after 1 hour on 720 CPUs"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['game']}-{r['learner']}")
def test_a_rows_es_column_is_the_papers_hour_for_its_game(row):
    """OpenAI ES's one-hour score of the run's game (config.toml's env.id) as edgerl ships it,
    or a dash where the paper has none."""
    import tomllib

    from edgerl.envs.scores import es_hour

    env_id = tomllib.loads((run_dir(row) / "config.toml").read_text())["env"]["id"]
    expected = es_hour(env_id)
    assert row[ES_COLUMN] == ("–" if expected is None else f"{expected:,g}")


def atari5_rows() -> tuple[list[dict[str, str]], str]:
    """The Atari-5 section's table, by header, and the section's text."""
    text = RESULTS.read_text()
    section = text.split("## Atari-5 on two CPU cores")[1].split("\n## ")[0]
    return table_at(section.splitlines(), "Atari-5 game"), section


def test_the_atari5_table_is_its_runs_final_scores_and_the_summary_the_regressions():
    """Each Atari-5 row's final score, human-normalised final and OpenAI ES column are its
    committed run's (the mean of its last three evaluations), each game once; the summary score
    is the regression's prediction from those finals once all five are there, and said to be
    not yet computed before."""
    import tomllib

    from edgerl.envs.scores import atari5_median, es_hour, human_normalised

    rows, section = atari5_rows()
    finals = {}
    for row in rows:
        run = (RESULTS.parent / re.search(r"\]\((runs/[^)]+)\)", row["run"])[1]).resolve()
        env_id = tomllib.loads((run / "config.toml").read_text())["env"]["id"]
        last = [float(e["return_mean"]) for e in evaluations(run)[-3:]]
        finals[env_id] = sum(last) / len(last)
        assert number(row["final score"]) == pytest.approx(finals[env_id], abs=0.05)
        hns = human_normalised(env_id, finals[env_id])
        assert number(row["human-normalised final"]) == pytest.approx(hns, abs=0.005)
        es = es_hour(env_id)
        assert row[ES_COLUMN] == ("–" if es is None else f"{es:,g}")
        assert row["final above ES"] == (
            "–" if es is None else "yes" if finals[env_id] > es else "no"
        )
    assert len(finals) == len(rows)  # each game once
    predicted = atari5_median(finals)
    if predicted is None:
        assert "**The summary score**: not yet computed" in section
    else:
        assert f"57-game median of **{predicted:.2f}**" in section


ATARI5_DIRS = ["battlezone", "doubledunk", "namethisgame", "phoenix", "qbert"]


def test_the_atari5_per_seed_table_is_each_games_final_in_its_hour_and_the_prediction():
    """Each seed's row: every game's final in its hour (its first run for seed 0, its folder of
    seeds for the others) with its human-normalised score, a dash for a game with no run of
    that seed, and the regression's prediction once all five are there; every seed on record."""
    from edgerl.display.seeds import figures, find_runs
    from edgerl.envs.scores import atari5_median, human_normalised

    _, section = atari5_rows()
    rows = table_at(section.splitlines(), "seed")
    finals: dict[int, dict[str, float]] = {}
    env_of = {}
    for game in ATARI5_DIRS:
        f = figures(
            find_runs([RUNS / f"{game}-cpu-2core-pqn", RUNS / f"{game}-cpu-seeds"]),
            within_s=3600.0,
            reps=1000,
        )
        env_of[game] = f.game
        for run, final in zip(f.runs, f.finals, strict=True):
            finals.setdefault(run.seed, {})[f.game] = final
    assert [int(r["seed"]) for r in rows] == sorted(finals)
    columns = [h for h in rows[0] if h not in ("seed", "the five predict")]
    assert len(columns) == len(ATARI5_DIRS)
    for row in rows:
        mine = finals[int(row["seed"])]
        for header, game in zip(columns, ATARI5_DIRS, strict=True):
            env_id = env_of[game]
            if env_id not in mine:
                assert row[header] == "–"
                continue
            said = re.fullmatch(r"(-?[\d,.]+) \((-?[\d.]+)\)", row[header])
            assert said, (header, row[header])
            assert number(said[1]) == pytest.approx(mine[env_id], abs=0.05)
            assert float(said[2]) == pytest.approx(
                human_normalised(env_id, mine[env_id]), abs=0.005
            )
        predicted = atari5_median(mine)
        shown = row["the five predict"]
        assert shown == ("–" if predicted is None else f"**{predicted:.2f}**")


def atari5_printed() -> list[tuple[list[str], str]]:
    """Each `edgerl results` console block of the Atari-5 section: its arguments and the line
    it quotes (every console block there is one command and one line)."""
    _, section = atari5_rows()
    blocks = re.findall(r"```console\nedgerl results ([^\n]+)\n([^\n]+)\n```", section)
    assert blocks, "the Atari-5 section quotes no `edgerl results`"
    assert section.count("```console") == len(blocks), "a console block this test cannot read"
    return [(args.split(), said) for args, said in blocks]


@pytest.mark.parametrize("args, said", atari5_printed())
def test_the_atari5_summaries_quoted_are_what_results_prints(cli, args, said):
    """The Atari-5 prediction results.md quotes is the line `edgerl results` prints today for
    the runs and options quoted with it, and seed 0's runs there are each game's first (the
    rule of "Which runs count"), never a rerun."""
    r = cli("results", *[REPO / a if a.startswith("docs/") else a for a in args])
    assert r.code == 0, r.err
    assert said in r.out.splitlines()
    assert all(f"docs/runs/{g}-cpu-2core-pqn" in args for g in ATARI5_DIRS)
    assert not any(a.endswith(("-quiet", "-loaded")) for a in args)


def test_readmes_atari5_headline_is_the_prediction_of_every_seed_on_record():
    """README's Atari-5 figures are, seed by seed, what results.md's quote over all five games'
    folders of seeds prints, and that quote takes every seed all five games have a committed run
    (with an evaluation) of, seed 0's outside those folders: each game's first run, as the rule
    in results.md counts them."""
    over_seeds = [
        said
        for args, said in atari5_printed()
        if all(f"docs/runs/{g}-cpu-seeds" in args for g in ATARI5_DIRS)
    ]
    assert len(over_seeds) == 1, "results.md should quote one summary over all seeds"
    (said,) = over_seeds
    text = " ".join(README.read_text().split())
    found = re.search(r"57-game median predicted: ((?:seed \d+ \d\.\d+(?:, )?)+)", text)
    assert found, "README's Atari-5 headline is not in the form this test reads"
    readme = dict(re.findall(r"seed (\d+) (\d\.\d+)", found[1]))
    printed = dict((s, v) for v, s in re.findall(r"(\d\.\d+) \(seed (\d+)\)", said))
    assert readme == printed

    def seeds_of(game: str) -> set[int]:
        return {
            int(p.name.removeprefix("seed-"))
            for p in RUNS.glob(f"{game}-cpu-seeds/seed-*")
            if (p / "eval.csv").exists() and evaluations(p)
        }

    every_game_has = set.intersection(*(seeds_of(g) for g in ATARI5_DIRS))
    assert {int(s) for s in printed} == every_game_has | {0}  # seed 0: each game's first run
