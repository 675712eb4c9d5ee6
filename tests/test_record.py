"""Recordings: GIFs read back with Pillow, MP4s with ffmpeg, atomic writes, refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgerl.errors import MissingDependencyError
from edgerl.play.record import (
    CAPTION_HEIGHT,
    RecordError,
    caption_frame,
    find_ffmpeg,
    open_recorder,
)

PIL = pytest.importorskip("PIL", reason="the record extra (Pillow) is not installed")
from PIL import Image  # noqa: E402


def atari_like_frames(n: int) -> list[np.ndarray]:
    """A ball moving over a brown field between two paddles: Pong's colours and sizes."""
    frames = []
    for i in range(n):
        f = np.zeros((210, 160, 3), dtype=np.uint8)
        f[:] = (144, 72, 17)
        f[34 + (i * 3) % 150 : 50 + (i * 3) % 150, 140:144] = (92, 186, 92)
        f[100 + i % 60 : 102 + i % 60, 20 + i % 110 : 22 + i % 110] = (236, 236, 236)
        frames.append(f)
    return frames


def read_gif(path: Path) -> tuple[list[np.ndarray], list[int], Image.Image]:
    im = Image.open(path)
    frames, durations = [], []
    for i in range(im.n_frames):
        im.seek(i)
        durations.append(im.info["duration"])
        frames.append(np.asarray(im.convert("RGB")))
    return frames, durations, im


def test_a_gif_gives_back_every_frame_exactly_with_its_caption(tmp_path):
    frames = atari_like_frames(40)
    with open_recorder(tmp_path / "game.gif", fps=15) as rec:
        for i, f in enumerate(frames):
            rec.add(f, caption=f"episode 1  score {i:+d}")
    got, durations, im = read_gif(tmp_path / "game.gif")
    assert im.size == (160, 210 + CAPTION_HEIGHT) and im.info.get("loop") == 0
    assert len(got) == 40
    for i, (g, f) in enumerate(zip(got, frames, strict=True)):
        assert np.array_equal(g, caption_frame(f, f"episode 1  score {i:+d}"))
    # 15 fps is 6.67 hundredths a frame: the delays add up to the exact playing time
    assert sum(durations) == pytest.approx(40 / 15 * 1000, abs=10)
    assert set(durations) <= {60, 70}


def test_the_caption_is_drawn_in_a_band_beneath_the_frame(tmp_path):
    frame = atari_like_frames(1)[0]
    captioned = caption_frame(frame, "episode 3  score -7")
    assert captioned.shape == (210 + CAPTION_HEIGHT, 160, 3)
    assert np.array_equal(captioned[:210], frame)  # the game's own score stays visible
    band = captioned[210:]
    assert band.max() > 200 and (band == 0).mean() > 0.5  # light text on black


def test_grey_frames_are_recorded(tmp_path):
    grey = [np.full((84, 84), v, dtype=np.uint8) for v in (0, 80, 160, 240)]
    with open_recorder(tmp_path / "agent.gif", fps=15) as rec:
        for f in grey:
            rec.add(f)
    got, _, _ = read_gif(tmp_path / "agent.gif")
    assert [int(g[40, 40, 0]) for g in got] == [0, 80, 160, 240]
    assert all(np.array_equal(g[..., 0], g[..., 2]) for g in got)


def test_a_frame_of_many_colours_is_quantised_not_refused(tmp_path):
    rng = np.random.default_rng(0)
    noisy = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)  # thousands of colours
    smooth = np.zeros((60, 80, 3), dtype=np.uint8)
    with open_recorder(tmp_path / "noise.gif", fps=10) as rec:
        rec.add(smooth)
        rec.add(noisy)
    got, _, _ = read_gif(tmp_path / "noise.gif")
    assert len(got) == 2 and np.array_equal(got[0], smooth)
    err = np.abs(got[1].astype(int) - noisy.astype(int)).mean()
    assert err < 40  # 255 colours for 4,800 random ones: close, not exact


def test_a_gif_faster_than_50_fps_keeps_every_other_frame(tmp_path):
    with open_recorder(tmp_path / "fast.gif", fps=60) as rec:
        for f in atari_like_frames(10):
            rec.add(f)
    got, durations, _ = read_gif(tmp_path / "fast.gif")
    assert len(got) == 5 and set(durations) == {30, 40}  # 2 frames of 1/60 s each: 3.33 cs


def test_close_reports_what_was_written(tmp_path):
    rec = open_recorder(tmp_path / "r.gif", fps=15)
    for f in atari_like_frames(30):
        rec.add(f)
    done = rec.close()
    assert done is not None
    assert done.path == (tmp_path / "r.gif").resolve() and done.frames == 30
    assert done.seconds == pytest.approx(2.0) and done.bytes == (tmp_path / "r.gif").stat().st_size
    assert "recorded 30 frames (2.0 s) to" in done.describe()
    assert os.listdir(tmp_path) == ["r.gif"]  # no temporary file left


def test_frames_of_another_size_are_refused(tmp_path):
    with open_recorder(tmp_path / "r.gif", fps=15) as rec:
        rec.add(np.zeros((10, 10, 3), dtype=np.uint8))
        with pytest.raises(ValueError, match="frame of"):
            rec.add(np.zeros((12, 10, 3), dtype=np.uint8))


def test_an_exception_while_recording_leaves_no_file(tmp_path):
    with pytest.raises(KeyboardInterrupt), open_recorder(tmp_path / "r.gif", fps=15) as rec:
        rec.add(atari_like_frames(1)[0])
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


KILLED_WRITER = """
import sys, time
from pathlib import Path
import numpy as np
from edgerl.play.record import open_recorder
rec = open_recorder(Path(sys.argv[1]), fps=15)
for i in range(5):
    rec.add(np.full((210, 160, 3), i * 40, dtype=np.uint8))
print("recording", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_a_killed_recording_leaves_nothing_under_its_name(tmp_path, suffix):
    if suffix == ".mp4" and find_ffmpeg() is None:
        pytest.skip("no ffmpeg here (neither on PATH nor from imageio-ffmpeg)")
    out = tmp_path / f"killed{suffix}"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(out)], stdout=subprocess.PIPE, text=True
    )
    temp = tmp_path / f".{out.name}.tmp-{proc.pid}"
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "recording"
        deadline = time.monotonic() + 60  # ffmpeg creates its file once it has read a frame
        while not temp.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert temp.exists()  # the frames so far are being written, under another name
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()
    # The next recording to that name clears the dead writer's leftover, then writes its own.
    with open_recorder(out, fps=15) as rec:
        assert not temp.exists()
        rec.add(np.zeros((16, 16, 3), dtype=np.uint8))
    assert out.exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("out.avi", "the file must end in .gif (needs nothing but the record extra) or .mp4"),
        ("nowhere/out.gif", "the directory nowhere does not exist"),
    ],
)
def test_play_refuses_a_recording_it_cannot_make_before_playing(cli, name, message):
    r = cli("play", "--model", "absent.ckpt", "--record", name)
    assert r.code == 2, r.err
    assert message in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_without_pillow_the_error_says_how_to_install_it(cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    r = cli("play", "--model", "absent.ckpt", "--record", "out.gif")
    assert r.code == 2
    assert "needs the Python package 'pillow'" in r.err
    assert "pip install 'edgerl[record]'" in r.err and "Traceback" not in r.err
    with pytest.raises(MissingDependencyError):
        open_recorder(Path("out.gif"), fps=15)


def test_an_mp4_without_an_encoder_says_how_to_get_one(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    r = cli("play", "--model", "absent.ckpt", "--record", "out.mp4")
    assert r.code == 2
    assert "an MP4 needs ffmpeg" in r.err and "pip install imageio-ffmpeg" in r.err
    assert "record a .gif, which needs nothing more" in r.err
    with pytest.raises(RecordError):
        open_recorder(Path("out.mp4"), fps=15)


def test_an_mp4_has_every_frame_at_the_game_pace(tmp_path):
    if find_ffmpeg() is None:
        pytest.skip("no ffmpeg here (neither on PATH nor from imageio-ffmpeg)")
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg", reason="reads the MP4 back")
    out = tmp_path / "game.mp4"
    with open_recorder(out, fps=15) as rec:
        for i, f in enumerate(atari_like_frames(45)):
            rec.add(f, caption=f"episode 1  score {i:+d}")
    reader = imageio_ffmpeg.read_frames(str(out))
    meta = next(reader)
    frames = list(reader)
    # 160 wide is scaled up twice (nearest) so players keep the pixels sharp; even sizes
    assert meta["size"] == (320, 2 * (210 + CAPTION_HEIGHT)) and meta["fps"] == 15
    assert len(frames) == 45
    first = np.frombuffer(frames[0], dtype=np.uint8).reshape(448, 320, 3)
    assert np.abs(first[100, 100].astype(int) - (144, 72, 17)).max() < 12  # Pong's brown


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_a_gif_to_a_full_disk_is_one_sentence_and_leaves_nothing(cli, tmp_path):
    from .test_faults import fill, tiny_filesystem

    run = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run).code == 0
    with tiny_filesystem(tmp_path / "disk", "1m") as disk:
        fill(disk / "filler")
        out = disk / "play.gif"
        full = r"No space left on device \(the disk is full\)"
        with pytest.raises(RecordError, match=full), open_recorder(out, fps=30) as rec:
            for frame in atari_like_frames(200):
                rec.add(frame)
        r = cli("play", "--run-dir", run, "--episodes", "1", "--record", out)
        assert r.code == 2 and "internal error" not in r.err, r.err
        assert r.err.strip().splitlines()[-1] == (
            f"edgerl: error: cannot write the recording {out}: No space left on device "
            "(the disk is full)"
        )
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no GIF, no partial one
