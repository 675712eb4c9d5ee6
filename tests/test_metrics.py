"""The progress bar on a real terminal (a pty): what it keeps at 80 columns, no early ETA."""

from __future__ import annotations

import math
import os
import pty
import re
import select
import struct
import time

import pytest

from edgerl.report.metrics import ConsoleProgress, TrainStats, progress_fields

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def draw(columns: int, stats: list[TrainStats], monkeypatch) -> list[str]:
    import fcntl
    import termios

    monkeypatch.setenv("COLUMNS", str(columns))  # what rich reads before the std streams' size
    monkeypatch.setenv("LINES", "24")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    stream = os.fdopen(slave, "w")
    progress = ConsoleProgress(total=100_000, start=0, stream=stream)
    screens = []
    out = b""
    for s in stats:
        progress.update(s)
        progress._progress.refresh()  # draw now, not on rich's timer
        stop = time.monotonic() + 0.5  # rich redraws on its own timer: read a while, not to EOF
        while time.monotonic() < stop:
            if select.select([master], [], [], 0.05)[0]:
                out += os.read(master, 1 << 16)
        text = ANSI.sub("", out.decode(errors="replace")).replace("\r", "\n")
        screens.append([line for line in text.split("\n") if line.strip()][-1])
    progress.close()
    stream.close()
    os.close(master)
    return screens


def filling(step: int) -> TrainStats:
    return TrainStats(step=step, total_steps=100_000, sps=500.0, learning_starts=20_000)


def test_filling_shows_the_fill_and_no_time_left_then_learning_does(monkeypatch):
    learning = TrainStats(step=30_000, total_steps=100_000, sps=80.0, learning_starts=20_000)
    wide = draw(200, [filling(12_000), learning], monkeypatch)
    assert "12,000/100,000" in wide[0] and "-:--:--" in wide[0]
    assert "filling replay 12,000/20,000: learning starts at step 20,000" in wide[0]
    assert "filling replay" not in wide[1] and "30,000/100,000" in wide[1]


def test_the_time_left_is_the_sessions_learning_pace_not_rich_s_window(monkeypatch):
    """Rich's own estimate over its last 30 s jumped 0:56 -> 1:48 -> 2:17 -> 0:50 within six
    minutes on a run with an hour left (issue 59): the bar shows TrainStats.left_s."""
    at = [
        TrainStats(step=30_000, total_steps=100_000, learning_starts=20_000, left_s=3_723.0),
        TrainStats(step=31_000, total_steps=100_000, learning_starts=20_000, left_s=3_600.0),
    ]
    lines = draw(200, at, monkeypatch)
    assert lines[0].startswith("30,000/100,000 1:02:03") and "31,000/100,000 1:00:00" in lines[1]
    unknown = TrainStats(step=30_000, total_steps=100_000, learning_starts=20_000)
    assert "-:--:--" in draw(200, [unknown], monkeypatch)[0]  # not measured yet


def test_at_80_columns_the_step_count_and_time_left_stay(monkeypatch):
    lines = draw(80, [filling(12_000)], monkeypatch)
    assert lines[0].startswith("12,000/100,000 -:--:--") and len(lines[0]) <= 80
    assert "filling replay" in lines[0]  # the summary is cut at the end, not wrapped


def test_log_lines_say_the_replay_fills():
    assert progress_fields(filling(12_000)).startswith(
        "filling replay 12,000/20,000: learning starts at step 20,000 | 500 steps/s"
    )
    assert "filling" not in progress_fields(TrainStats(step=20_000, learning_starts=20_000))


def test_the_newest_evaluation_return_follows_the_training_return():
    stats = TrainStats(step=3_000, learning_starts=1_000, return_mean=29.7, eval_return=265.6)
    assert "| return 29.7 | eval 265.6 |" in progress_fields(stats)
    assert "eval" not in progress_fields(TrainStats(step=3_000, return_mean=29.7))


def test_the_rate_shown_is_the_last_half_minutes_never_the_filling():
    """Pong showed 97, 572, 90 steps/s: the session's average, fill phase included; PQN on a
    CPU swung between 700 and 35 (a rollout, then an update). The rate is over the last 30 s
    of learning, and stays until a new window spans a second."""
    from edgerl.report.metrics import SMOOTH_S, Pace

    pace = Pace(0, 0.0, learning_starts=10_000)
    assert pace.rate(5_000, 1.0) == 5_000  # filling fast
    pace.follow(10_000, 10_000, 2.0)  # learning begins: the filling is forgotten
    assert pace.rate(10_090, 3.0) == 90
    assert pace.phases(10_090, 3.0) == (10_000, 2.0, 90, 1.0)
    # a rollout of 1,400 steps in 2 s, then an 8 s update with no step, again and again
    t, step = 3.0, 10_090
    shown = []
    for _ in range(12):
        for dt, steps in ((2.0, 1_400), (8.0, 0)):
            t, step = t + dt, step + steps
            shown.append(pace.rate(step, t))
    assert all(abs(r - 140) <= 14 for r in shown[-12:])  # 1,400 per 10 s, smoothed
    assert SMOOTH_S >= 20  # longer than a CPU update


def test_the_session_summary_gives_the_learning_pace_and_the_filling_apart():
    from edgerl.report.metrics import TrainResult

    def result(fill_steps: int, fill_s: float, learn_steps: int, learn_s: float) -> str:
        return TrainResult(
            50_000, 500_000, 1, math.nan, 0.0, fill_steps, fill_s, learn_steps, learn_s, None, True
        ).summary()

    said = result(40_000, 155.0, 10_000, 345.0)  # Breakout: "258 steps/s this session"
    assert "29 steps/s learning (the replay filled at 258 steps/s)" in said
    assert "1 episode," in said
    assert "0 steps/s learning" not in result(0, 0.0, 10_000, 345.0)
    assert "29 steps/s" in result(0, 0.0, 10_000, 345.0)
    assert "steps/s filling the replay (learning had not started)" in result(800, 2.0, 0, 0.0)


@pytest.mark.parametrize(
    ("algo", "game"),
    [("ga", "CartPole-v1"), ("ppo", "CartPole-v1"), ("sac", "Pendulum-v1"), ("dqn", "CartPole-v1")],
)
def test_the_progress_line_shows_epsilon_only_for_a_learner_that_explores_by_it(
    tmp_path, algo, game
):
    """The GA plays its members greedily, PPO samples its actions and SAC's policy draws its
    own noise once learning starts (its epsilon is 1 before, 0 after): "eps 0.000" on their
    progress line said nothing true; DQN's epsilon-greedy exploration is shown."""
    from edgerl.config import build_layers, resolve
    from edgerl.run.train import Trainer

    sets = ["hw.monitor=false", "display.enabled=false", f"agent.algo={algo}"]
    sets += ["agent.learning_starts=200", "agent.batch_size=32", "agent.hidden=[32, 32]"]
    shortcuts = {"env.id": game, "train.steps": 600, "train.run_dir": str(tmp_path)}
    cfg = resolve(build_layers(None, sets, shortcuts, use_system=False))
    with Trainer(cfg, quiet=True) as trainer:
        trainer.run()
        line = progress_fields(trainer.stats)
    assert ("| eps " in line) == (algo == "dqn"), line
