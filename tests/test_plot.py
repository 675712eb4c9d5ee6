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
