"""The progress bar on a real terminal (a pty): what it keeps at 80 columns, no early ETA."""

from __future__ import annotations

import os
import pty
import re
import select
import struct
import time

from edgerl.run.metrics import ConsoleProgress, TrainStats, progress_fields

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
