"""Learning curves from a real CartPole run: episodes.csv, and ``edgerl plot`` drawing it."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

SHORT = ["--set", "env.num_envs=2", "--set", "train.log_every_s=0.2"]


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def train(cli, run: Path, steps: int) -> None:
    r = cli("train", "--env", "CartPole-v1", "--steps", steps, "--run-dir", run, *SHORT)
    assert r.code == 0, r.err[-2000:]


def test_episodes_csv_has_one_row_per_episode_and_a_resume_appends(cli, tmp_path):
    run = tmp_path / "runs" / "CartPole-v1"
    train(cli, run, 2000)
    first = rows(run / "episodes.csv")
    train(cli, run, 4000)  # resumes the same run
    text = (run / "episodes.csv").read_text()
    assert text.count("step,episode,env,return,length,wall_s") == 1
    episodes = rows(run / "episodes.csv")
    assert episodes[: len(first)] == first and len(episodes) > len(first)

    metrics = rows(run / "metrics.csv")
    last = metrics[-1]
    assert int(last["episodes"]) == len(episodes)
    assert [int(e["episode"]) for e in episodes] == list(range(1, len(episodes) + 1))
    returns = [float(e["return"]) for e in episodes]
    recent = returns[-100:]  # return_mean is over the last 100 episodes
    assert math.isclose(float(last["return_mean"]), sum(recent) / len(recent), rel_tol=1e-4)
    for e in episodes:
        # CartPole pays 1 per step: an episode's return is its length
        assert float(e["return"]) == int(e["length"]) and e["env"] in ("0", "1")
    steps = [int(e["step"]) for e in episodes]
    assert steps == sorted(steps) and steps[-1] <= 4000
    walls = [float(e["wall_s"]) for e in episodes]
    assert walls == sorted(walls)


@pytest.fixture
def cartpole_run(cli, tmp_path) -> Path:
    run = tmp_path / "runs" / "CartPole-v1"
    train(cli, run, 2000)
    return run


def test_plot_terminal_draws_the_return_curve_in_the_terminal(cli, cartpole_run, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    monkeypatch.setenv("LINES", "20")
    episodes = rows(cartpole_run / "episodes.csv")
    r = cli("plot", "--run-dir", cartpole_run, "--terminal")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "training return against env steps"
    assert len(lines) <= 20 and max(len(line) for line in lines[:-1]) <= 70  # then the summary
    best = max(float(e["return"]) for e in episodes)
    assert lines[1].split("|")[0].strip() == f"{best:.4g}", r.out
    assert sum(line.count("*") for line in lines[1:-2]) >= 10  # one mark per column at most
    reached = int(rows(cartpole_run / "metrics.csv")[-1]["step"])
    assert f"CartPole-v1 | step {reached:,} | {len(episodes):,} episodes" in r.out
    assert not (cartpole_run.parent.parent / "curve.png").exists()


def test_plot_compares_runs_and_falls_back_to_metrics(cli, cartpole_run, tmp_path):
    import shutil

    other = tmp_path / "runs" / "older"
    shutil.copytree(cartpole_run, other)
    (other / "episodes.csv").unlink()  # a run of an edgerl without episodes.csv
    r = cli("plot", "--run-dir", cartpole_run, "--run-dir", other, "--terminal", "--x", "time")
    assert r.code == 0, r.err
    assert "training return against training time (seconds)" in r.out
    assert "* CartPole-v1  o older" in r.out
    last = rows(other / "metrics.csv")[-1]
    assert f"older | step {int(last['step']):,} | return {float(last['return_mean']):.1f}" in r.out


def test_plot_without_matplotlib_says_how_to_install_it(cli, cartpole_run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where the extra is not installed
    r = cli("plot", "--run-dir", cartpole_run, "-o", "curve.png")
    assert r.code == 2 and "Traceback" not in r.err
    assert "needs the Python package 'matplotlib'" in r.err
    assert "pip install 'edgerl[plot]'" in r.err and "--terminal" in r.err
    assert not Path("curve.png").exists()


def test_plot_of_a_run_without_rows_says_so(cli, tmp_path):
    run = tmp_path / "runs" / "new"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text("step,wall_s,sps,episodes,return_mean\n")
    r = cli("plot", "--run-dir", run, "--terminal")
    assert r.code == 2
    assert r.err.strip() == (
        f"edgerl: error: {run} has no finished episode and no metrics row yet: plot it once it "
        "has trained a little"
    )


def test_plot_of_a_folder_that_is_no_run_says_so(cli, tmp_path):
    """Not "no finished episode yet", which sends the user to wait for a run that is not
    there."""
    (tmp_path / "notes.txt").write_text("x")
    r = cli("plot", "--run-dir", tmp_path, "--terminal")
    assert r.code == 2
    assert r.err.strip() == (
        f"edgerl: error: {tmp_path} is not a run directory (no config.toml, metrics.csv or "
        "episodes.csv in it); give one with --run-dir"
    )


def test_without_run_dir_plot_takes_the_newest_run(cli, cartpole_run):
    r = cli("plot", "--terminal")  # cwd holds runs/CartPole-v1
    assert r.code == 0, r.err
    assert "CartPole-v1 | step" in r.out


def test_curves_skip_repeated_headers_and_rows_a_resume_replaced(tmp_path):
    from edgerl.display.curves import Series, read_curves

    path = tmp_path / "metrics.csv"
    path.write_text(
        "step,wall_s,return_mean\n"
        "100,1.0,\n"
        "200,2.0,5\n"
        "300,3.0,6\n"  # written after the checkpoint the next session resumed from
        "step,wall_s,return_mean\n"
        "250,2.5,7\n"
        "350,3.5,8\n"
        "40"  # cut short by a kill
    )
    returns, clock = Series(), Series()
    assert read_curves(path, {"return_mean": returns, "wall_s": clock}) == 5
    assert clock.finish().steps == [100, 200, 250, 350]
    assert returns.finish().steps == [200, 250, 350] and returns.y == [5, 7, 8]
    assert read_curves(tmp_path / "missing.csv", {"return_mean": Series()}) == 0


def test_the_pages_curves_read_only_the_end_of_a_huge_file(tmp_path, monkeypatch):
    """A run file far larger than any run writes (damaged, or a hostile local user's) would
    hold edgerl serve's reader threads for seconds per poll: the page's curves read its end
    and say so; edgerl plot, the user's own command, reads it all."""
    from edgerl.display.curves import load_run
    from edgerl.serve import runs as served

    run = tmp_path / "run"
    run.mkdir()
    rows = "".join(f"{s},{s / 100},{s % 7}\n" for s in range(0, 200_000, 10))
    (run / "metrics.csv").write_text("step,wall_s,return_mean\n" + rows)
    size = (run / "metrics.csv").stat().st_size
    whole = load_run(run)
    assert min(whole.returns.steps) < 1_000 and not whole.damage  # from the start
    monkeypatch.setattr(served, "CURVE_FILE_BYTES", 4096)
    page = served.RunFiles([tmp_path]).curves(run)
    steps = page["returns"]["steps"]
    assert page["problem"] is None and min(steps) > 190_000 and max(steps) > 199_000
    assert page["damage"] == [f"metrics.csv is {size / 1024:.1f} KiB: its last 4.0 KiB shown"]


def test_plot_writes_into_the_run_directory_and_says_where(cli, cartpole_run):
    r = cli("plot", "--run-dir", cartpole_run)
    assert r.code == 0, r.err
    assert (cartpole_run / "curve.png").stat().st_size > 1000
    assert not Path("curve.png").exists()  # not wherever the command was typed
    assert f"wrote {(cartpole_run / 'curve.png').resolve()}" in r.out
    r = cli("plot", "--run-dir", cartpole_run, "-o", "mine.svg")
    assert r.code == 0 and Path("mine.svg").exists() and "wrote " in r.out


def test_a_plot_that_cannot_be_written_is_one_sentence_and_leaves_nothing(cli, cartpole_run):
    r = cli("plot", "--run-dir", cartpole_run, "-o", cartpole_run / "curve.xyz")
    assert r.code == 2 and "is not a picture file name: use .png, .svg or .pdf" in r.err
    r = cli("plot", "--run-dir", cartpole_run, "-o", cartpole_run / "nodir" / "c.png")
    assert r.code == 2 and "nodir is not a directory to write c.png into" in r.err
    assert "internal" not in r.err and "Traceback" not in r.err
    assert [p.name for p in cartpole_run.iterdir() if "curve" in p.name] == []
    r = cli("plot", "--run-dir", cartpole_run, "-o", cartpole_run / "curve.png" / "c.png")
    assert r.code == 2 and "is not a directory to write c.png into" in r.err  # a file above


def test_results_checks_its_picture_before_the_work(cli, cartpole_run, tmp_path):
    """The figures (a bootstrap of 10,000 resamples) are not computed and printed only to end
    in an error about -o."""
    for bad in (tmp_path / "x.txt", tmp_path / "nodir" / "x.png"):
        r = cli("results", cartpole_run, "--target", "30", "-o", bad)
        assert r.code == 2 and r.out == "" and "'-o' / '--output'" in r.err


@pytest.mark.parametrize(
    ("value", "span", "label"),
    [
        (60_000, 59_488, "60k"),
        (512, 59_488, "500"),
        (1_250_000, 1_250_000, "1.25M"),
        (0.002267, 35.2, "0"),
        (35.2, 35.2, "35.2"),
        (-21, 42, "-21"),
        (500, 492, "500"),
        (2_500, 2_500, "2.5k"),
        (3_000_000_000, 3e9, "3G"),
    ],
)
def test_axis_labels_read_as_people_write_numbers(value, span, label):
    from edgerl.display.plot import tick

    assert tick(value, span) == label


def test_terminal_axes_have_no_exponents(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    run = tmp_path / "run"
    run.mkdir()
    rows = "".join(
        f"{s},{s // 100},0,{s % 37},{s // 100},{s / 4e6}\n" for s in range(512, 60_013, 500)
    )
    (run / "episodes.csv").write_text("step,episode,env,return,length,wall_s\n" + rows)
    for by in ("steps", "time"):
        r = cli("plot", "--run-dir", run, "--terminal", "--x", by)
        assert r.code == 0, r.err
        axis = r.out.splitlines()[-3]  # then the legend and the summary
        assert "e+" not in r.out and "e-" not in r.out, r.out
        assert axis.split() == (["500", "60k"] if by == "steps" else ["0.0001", "0.015"]), axis


def test_the_summary_names_the_step_the_run_reached(cli, cartpole_run, monkeypatch):
    """Not the step of its last finished episode beside an evaluation at a later one."""
    monkeypatch.setenv("COLUMNS", "70")
    reached = int(rows(cartpole_run / "metrics.csv")[-1]["step"])
    last_episode = int(rows(cartpole_run / "episodes.csv")[-1]["step"])
    assert last_episode < reached  # what the footer said before
    r = cli("plot", "--terminal", "--run-dir", cartpole_run)
    assert r.code == 0, r.err
    assert f" | step {reached:,} | " in r.out.splitlines()[-1]


def test_a_genetic_algorithms_elite_score_is_drawn_beside_the_returns(cli, tmp_path):
    from edgerl.display.curves import load_run

    run = tmp_path / "ga"
    run.mkdir()
    (run / "metrics.csv").write_text(
        "step,wall_s,return_mean,generation,elite_score\n"
        "1000,1.0,20,0,\n"  # no generation finished yet: no elite
        "2000,2.0,30,1,120\n"
        "3000,3.0,35,2,180\n"
    )
    curves = load_run(run)
    assert curves.elite.steps == [2000, 3000] and curves.elite.y == [120, 180]
    r = cli("plot", "--terminal", "--run-dir", run)
    assert r.code == 0 and "(^: elite)" in r.out, r.out
    grid = [line.split("|", 1)[1] for line in r.out.splitlines() if "|" in line]
    assert any("^" in row for row in grid), r.out  # drawn in the chart, not only the legend
