"""`edgerl view` (display/viewer.py, display/render.py): real Pong trainers, a real pygame surface
(dummy driver), the console view on a real pty, and every way a stream can fail the viewer."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgerl.display.attach import Attachment
from edgerl.display.render import text_frame
from edgerl.errors import EdgerlError
from edgerl.stream import (
    HEADER,
    FrameRing,
    shm_path,
)
from edgerl.stream.reader import FrameReader, StreamError

from .conftest import PONG_FAST, edgerl_cmd, run_edgerl, start_trainer, stop
from .helpers import ACTIONS, frame_for, meta_for


def test_console_text_frame():
    frame = np.tile(np.linspace(0, 255, 84).astype(np.uint8), (84, 1))
    text = text_frame(frame, meta_for(1234), ACTIONS, columns=42, width=200)
    lines = text.splitlines()
    assert len(lines) == 21 + 1  # two pixel rows per text line, then the status line
    assert all(line.count("\u2580") == 42 for line in lines[:-1])
    assert "\x1b[38;5;232m" in lines[0] and "\x1b[48;5;255m" in lines[0]  # black ... white
    assert "step 1,234" in lines[-1] and "action RIGHTFIRE" in lines[-1]
    # a narrow terminal: the status in lines that fit, cut between its parts, no word split
    narrow = text_frame(frame, meta_for(1234), ACTIONS, columns=42, width=30).splitlines()[21:]
    assert len(narrow) > 1 and all(len(line) <= 30 for line in narrow)
    assert "action RIGHTFIRE" in narrow[-1] and " | ".join(narrow).count("RIGHTFIRE") == 1


def test_snapshot_of_a_live_trainer_has_the_game_and_the_overlay(live_trainer, cli, tmp_path):
    import pygame

    run, proc = live_trainer
    # The very first frame (step 0, epsilon exactly 1) was picked without a forward pass and has
    # no Q-values to draw: wait until frames carry them.
    reader = FrameReader(run)
    deadline = time.monotonic() + 60
    while True:
        frame = reader.latest()
        if frame is not None and frame.meta.q_values:
            break
        assert time.monotonic() < deadline, "no frame with Q-values"
        time.sleep(0.02)
    reader.close()
    png = tmp_path / "snap.png"
    r = cli("view", "--run-dir", run, "--snapshot", png, "--timeout", "60")
    assert r.code == 0, r.err
    pixels = pygame.surfarray.array3d(pygame.image.load(str(png)))  # (W, H, 3)
    _, h, _ = pixels.shape
    game = pixels[:, 100 : h - 100]
    assert game.std() > 10  # not blank: the Pong field, paddles, ball
    orange = (
        (pixels[..., 0] > 220)
        & (abs(pixels[..., 1].astype(int) - 170) < 15)
        & (pixels[..., 2] < 70)
    )
    assert orange[:, h - 96 :].sum() > 100  # the chosen action's bar in the Q-value panel
    text_box = pixels[6:220, 6:70]
    assert (text_box.max(axis=2) > 200).sum() > 200  # light overlay text on its dark box
    assert proc.poll() is None  # the trainer did not notice


def test_window_and_console_views_against_a_live_trainer(live_trainer, cli, capsys):
    run, _ = live_trainer
    r = cli("view", "--run-dir", run, "--frames", "3", "--timeout", "60")
    assert r.code == 0, r.err
    r = cli("view", "--run-dir", run, "--console", "--frames", "2", "--fps", "20")
    assert r.code == 0
    assert r.out.count("score ") == 2 and "\u2580" in r.out


def test_viewer_reattaches_after_the_trainer_restarts(tmp_path):
    run = tmp_path / "pong"
    attach = Attachment(run)
    first = start_trainer(run)
    try:
        deadline = time.monotonic() + 60
        frame = None
        while frame is None and time.monotonic() < deadline:
            reader = attach.poll()
            frame = reader.latest() if reader else None
            time.sleep(0.05)
        assert frame is not None
        old_session = attach.reader.session
        stop(first)
        assert not shm_path(run).exists()  # the stream is removed with the trainer
        time.sleep(1.1)
        assert attach.poll() is None  # noticed that the trainer is gone
        second = start_trainer(run)
        try:
            frame, deadline = None, time.monotonic() + 60
            while frame is None and time.monotonic() < deadline:
                reader = attach.poll()
                frame = reader.latest() if reader else None
                time.sleep(0.1)
            assert frame is not None and attach.reader.session != old_session
        finally:
            stop(second)
    finally:
        attach.close()


def test_nothing_running_is_said_clearly(cli, tmp_path):
    (tmp_path / "idle").mkdir()
    r = cli(
        "view", "--run-dir", tmp_path / "idle", "--snapshot", tmp_path / "x.png", "--timeout", "0.5"
    )
    assert r.code == 2
    assert "no frame from" in r.err and "display.enabled = true" in r.err


def test_no_display_names_sdl_videodriver(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "no-such-driver")
    (tmp_path / "idle").mkdir()
    r = cli("view", "--run-dir", tmp_path / "idle")
    assert r.code == 2
    assert "no display available" in r.err and "SDL_VIDEODRIVER" in r.err
    assert "--snapshot FILE.png" in r.err and "Traceback" not in r.err


def test_without_pygame_the_viewer_says_how_to_install_it(cli, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pygame", None)  # import pygame now raises ImportError
    (tmp_path / "idle").mkdir()
    r = cli("view", "--run-dir", tmp_path / "idle", "--snapshot", tmp_path / "x.png")
    assert r.code == 2 and "pip install 'edgerl[viewer]'" in r.err
    r = cli("view", "--run-dir", tmp_path / "idle")  # a window: the terminal needs no pygame
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    console, install = r.err.index("edgerl view --console"), r.err.index("pip install")
    assert console < install  # the way without installing anything comes first


# -- faults in the frame stream (real files in /dev/shm, real bytes, real processes) -----------


def lookalike_trainer() -> subprocess.Popen:
    """A live process whose command line names edgerl, as a trainer's does (pid checks pass)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "edgerl"],
    )


@pytest.fixture
def ring_with_live_pid(tmp_path):
    """A ring whose pointer names a live trainer-like process, so a viewer trusts it."""
    proc = lookalike_trainer()
    ring = FrameRing(tmp_path, 84, 84, ACTIONS)
    ring.publish(frame_for(1), meta_for(1))
    pointer = json.loads((tmp_path / "display.json").read_text())
    pointer["pid"] = proc.pid
    (tmp_path / "display.json").write_text(json.dumps(pointer))
    yield ring
    ring.close()
    proc.kill()
    proc.wait(timeout=30)


def _set_header(path: Path, **fields: int | bytes) -> None:
    names = ["magic", "version", "slots", "h", "w", "actions", "reserved", "session", "writes"]
    with open(path, "r+b") as f:
        values = dict(zip(names, HEADER.unpack(f.read(HEADER.size)), strict=True))
        values.update(fields)
        f.seek(0)
        f.write(HEADER.pack(*values.values()))


def test_a_lying_header_within_the_bounds_costs_a_viewer_a_few_small_reads(tmp_path, monkeypatch):
    """The largest header a viewer accepts (64 slots of 1024x1024) over a file of zeros and
    billions of writes: latest() finds nothing without copying a slot (a header of 1,024 slots
    of 4096x4096 cost 1.2 s of CPU a call, issue 58)."""
    import edgerl.stream.reader as reader_module

    proc = lookalike_trainer()
    ring = FrameRing(tmp_path, 1024, 1024, ACTIONS, slots=64)
    try:
        pointer = json.loads((tmp_path / "display.json").read_text())
        (tmp_path / "display.json").write_text(json.dumps({**pointer, "pid": proc.pid}))
        _set_header(ring.path, writes=10**12)
        reader = FrameReader(tmp_path)
        read: list[int] = []
        pread = os.pread

        def counted(fd: int, n: int, offset: int) -> bytes:
            read.append(n)
            return pread(fd, n, offset)

        monkeypatch.setattr(reader_module.os, "pread", counted)
        assert reader.latest() is None
        assert len(read) <= 1 + 2 * 64 and max(read) <= 8, (len(read), max(read))
        reader.close()
    finally:
        ring.close()
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"magic": b"GARBAGE!"}, "does not start with EDGERLFR: it is not a frame stream"),
        ({"version": 7}, "is frame stream version 7 and this viewer reads version 1"),
        ({"slots": 2**31}, "corrupt header: slots is 2,147,483,648, not within 1..64"),
        ({"slots": 1024, "h": 4096, "w": 4096}, "slots is 1,024, not within 1..64"),
        ({"h": 0}, "corrupt header: frame height is 0, not within 1..1024"),
        ({"h": 4096}, "corrupt header: frame height is 4,096, not within 1..1024"),
        ({"w": 1000}, "but its header (4 slots of 84x1000 frames) needs"),
        ({"actions": 99}, "corrupt header: actions is 99, not within 1..18"),
        ({"session": 12345}, "says session 12345 but"),
    ],
)
def test_the_viewer_checks_every_header_field(ring_with_live_pid, cli, tmp_path, fields, says):
    _set_header(ring_with_live_pid.path, **fields)
    with pytest.raises(StreamError) as e:
        FrameReader(tmp_path)
    assert says in str(e.value)
    r = cli("view", "--run-dir", tmp_path, "--snapshot", tmp_path / "x.png", "--timeout", "0.5")
    assert r.code == 2 and says in r.err and "internal error" not in r.err, r.err
    r = cli("view", "--run-dir", tmp_path, "--console", "--frames", "1", "--timeout", "0.5")
    assert r.code == 2 and says in r.out and "waiting for a trainer in" in r.out


def test_a_truncated_file_is_named_with_its_size(ring_with_live_pid, cli, tmp_path):
    os.truncate(ring_with_live_pid.path, 20)
    r = cli("view", "--run-dir", tmp_path, "--snapshot", tmp_path / "x.png", "--timeout", "0.5")
    assert r.code == 2 and "has 20 bytes, less than a frame stream header (48)" in r.err


def test_a_viewer_refused_by_permissions_says_so(ring_with_live_pid, tmp_path):
    path = ring_with_live_pid.path
    os.chown(path, 65534, 65534)  # the stream of a trainer running as another user
    os.chmod(path, 0o600)
    args = edgerl_cmd("view", "--run-dir", tmp_path, "--snapshot", tmp_path / "x.png")
    if os.geteuid() == 0:  # root reads everything: drop the capabilities that allow it
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to drop root's file capabilities")
        args = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *args]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"permission denied reading {path} (mode 0600" in r.stderr
    assert "sudo usermod -aG" in r.stderr and "Traceback" not in r.stderr


def test_a_viewer_of_a_killed_trainer_says_so(live_trainer, cli, tmp_path):
    run, proc = live_trainer
    proc.kill()  # kill -9: the stream and its pointer stay behind
    proc.wait(timeout=60)
    try:
        r = cli("view", "--run-dir", run, "--snapshot", tmp_path / "x.png", "--timeout", "0.5")
        assert r.code == 2
        assert f"(pid {proc.pid}) is not running any more: it was killed or crashed" in r.err
    finally:
        shm_path(run).unlink(missing_ok=True)


# -- no screen, the console view, runs without frames ------------------------------------------


def without_a_screen() -> dict[str, str]:
    drop = ("DISPLAY", "WAYLAND_DISPLAY", "XDG_RUNTIME_DIR")  # as over ssh or under sudo
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.pop("SDL_VIDEODRIVER", None)  # let SDL choose, as a user's shell does
    return env


NO_SCREEN_SAYS = ("no display available", "SDL_VIDEODRIVER=kmsdrm", "--console", "--snapshot")


def test_no_screen_ends_at_once_with_the_readme_sentence(tmp_path):
    (tmp_path / "idle").mkdir()
    r = subprocess.run(
        edgerl_cmd("view", "--run-dir", tmp_path / "idle"),
        capture_output=True,
        text=True,
        timeout=120,  # the old viewer hung here on SDL's offscreen driver
        env=without_a_screen(),
    )
    assert r.returncode == 2, r.stderr
    assert all(s in r.stderr for s in NO_SCREEN_SAYS), r.stderr
    assert "Traceback" not in r.stderr
    # edgerl's sentence alone: not SDL's "error: XDG_RUNTIME_DIR is invalid" before it
    assert r.stderr.startswith("edgerl: error: no display available"), r.stderr


def test_play_on_a_screen_without_one_says_so(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "200", "--run-dir", run).code == 0
    args = ("play", "--run-dir", run, "--episodes", "1", "--render", "screen")
    r = subprocess.run(
        edgerl_cmd(*args), capture_output=True, text=True, timeout=300, env=without_a_screen()
    )
    assert r.returncode == 2, r.stderr
    assert "no display available" in r.stderr and "SDL_VIDEODRIVER=kmsdrm" in r.stderr
    assert "--render console" in r.stderr and "XDG_RUNTIME_DIR" not in r.stderr


@pytest.mark.parametrize("driver", ["dummy", "offscreen"])
def test_a_driver_asked_for_is_used_and_waiting_draws(cli, tmp_path, monkeypatch, driver):
    monkeypatch.setenv("SDL_VIDEODRIVER", driver)  # asked for: not "no display"
    (tmp_path / "idle").mkdir()
    r = cli("view", "--run-dir", tmp_path / "idle", "--frames", "1", "--timeout", "0.5")
    assert r.code == 2, r.err  # was: internal error, font not initialized
    assert "no frame from" in r.err and "internal error" not in r.err


def test_the_overlay_leaves_the_game_uncovered():
    import pygame

    from edgerl.display.render import TOP_HEIGHT, SurfaceRenderer

    renderer = SurfaceRenderer(pygame, ACTIONS, (84, 84), 6)
    surface = pygame.Surface(renderer.size)
    white = np.full((84, 84), 255, dtype=np.uint8)
    renderer.draw(surface, white, meta_for(5), overlay=True, banner="a banner too")
    pixels = pygame.surfarray.array3d(surface)  # (W, H, 3)
    width = renderer.size[0]
    left = (width - 84 * 6) // 2
    game = pixels[left : left + 84 * 6, TOP_HEIGHT : TOP_HEIGHT + 84 * 6]
    assert (game == 255).all()  # Pong's left score (top left of the field) stays visible
    assert (pixels[:, :TOP_HEIGHT].max(axis=2) > 200).sum() > 200  # the text is above it


def test_console_view_fills_the_terminal_shows_q_values_and_q_quits(live_trainer):
    import fcntl
    import pty
    import termios

    run, _ = live_trainer
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 120, 0, 0))
    viewer = subprocess.Popen(
        edgerl_cmd("view", "--run-dir", run, "--console", "--fps", "10"),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 120
        while b"q quits" not in out or b"epsilon" not in out or b">" not in out:
            assert time.monotonic() < deadline, out[-2000:]
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                out += os.read(master, 1 << 16)
        os.write(master, b"q")
        assert viewer.wait(timeout=60) == 0
    finally:
        if viewer.poll() is None:
            viewer.kill()
        with contextlib.suppress(OSError):
            while select.select([master], [], [], 0.2)[0]:
                out += os.read(master, 1 << 16)
        os.close(master)
    text = out.decode(errors="replace")
    full = [s for s in text.split("\x1b[H\x1b[2J") if "q quits" in s and "\u2580" in s]
    screen = full[-1]  # the newest whole screen
    rows = [line for line in screen.splitlines() if "\u2580" in line]
    widest = max(line.count("\u2580") for line in rows)
    assert widest > 80 and widest <= 120  # was 42 columns whatever the terminal
    assert len(rows) > 30 and len(screen.splitlines()) <= 60
    bars = [line for line in screen.splitlines() if line[1:].split(" ")[0] in ACTIONS]
    assert len(bars) == len(ACTIONS) and sum(line.startswith(">") for line in bars) == 1


def test_console_view_says_it_is_waiting(cli, tmp_path):
    (tmp_path / "idle").mkdir()
    r = cli(
        "view", "--run-dir", tmp_path / "idle", "--console", "--frames", "1", "--timeout", "0.5"
    )
    assert r.code == 2
    assert f"no trainer is running in {tmp_path / 'idle'}" in r.out
    assert "waiting up to 0.5 s for a trainer to start there" in r.out


def test_a_run_on_vector_observations_says_it_has_no_frames(cli, tmp_path):
    run = tmp_path / "cartpole"
    proc = subprocess.Popen(
        edgerl_cmd("train", "--env", "CartPole-v1", "--steps", "10000000", "--run-dir", run),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / "display.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        r = cli("view", "--run-dir", run, "--snapshot", tmp_path / "x.png", "--timeout", "30")
        assert r.code == 2
        assert "learns CartPole-v1 from vector observations" in r.err
        assert "no frames to show" in r.err
    finally:
        stop(proc)
    assert not (run / "display.json").exists()


def test_the_console_view_of_a_finished_run_ends_after_its_timeout(cli, tmp_path):
    run = tmp_path / "pong"
    assert cli("train", *PONG_FAST, "--steps", "64", "--run-dir", run, "--quiet").code == 0
    # A real process: the old viewer waited here for ever, whatever --timeout said.
    r = run_edgerl("view", "--run-dir", run, "--console", "--timeout", "1", timeout=300)
    assert r.returncode == 2, r.stderr
    assert f"no trainer is running in {run}: the run finished at" in r.stderr
    assert "step 64 of 64" in r.stderr and "Traceback" not in r.stderr
    # while it waits, the screen says why no frame comes, not only that it waits
    assert f"no trainer is running in {run}: the run finished at" in r.stdout
    assert "waiting up to 1 s for a trainer to start there" in r.stdout
    # a snapshot of a run that ended ends at once (not after its --timeout), saying why
    started = time.monotonic()
    r = cli("view", "--run-dir", run, "--snapshot", tmp_path / "x.png", "--timeout", "600")
    assert r.code == 2 and "waiting" not in r.err, r.err
    assert f"no frame to save: no trainer is running in {run}: the run finished at" in r.err
    assert time.monotonic() - started < 300  # not the 600 s it may wait for a starting trainer


@pytest.mark.parametrize("mode", [["--console"], ["--snapshot", "x.png"], []])
def test_a_finished_run_on_vector_observations_is_said_to_have_no_frames_at_once(
    cli, tmp_path, mode
):
    """Not after --timeout's 30 s of waiting for a trainer, nor asking whether one runs."""
    run = tmp_path / "cp"
    assert cli("train", "--env", "CartPole-v1", "--steps", "300", "--run-dir", run).code == 0
    r = cli("view", "--run-dir", run, *mode)
    assert r.code == 2
    assert f"the run in {run} learns CartPole-v1 from vector observations" in r.err
    assert "no frames to show" in r.err and "within" not in r.err and "waiting" not in r.out


def test_a_viewer_waits_on_while_a_trainer_holds_the_run(cli, tmp_path):
    from edgerl.display.viewer import ViewOptions, run_console

    proc = lookalike_trainer()  # a live edgerl that holds the run but publishes nothing (yet)
    try:
        (tmp_path / ".lock").write_text(f"{proc.pid}\n")
        attach = Attachment(tmp_path)
        assert attach.idle() is None  # the viewer waits on
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait(timeout=60)  # the trainer before it, killed: its pointer stays behind
        pointer = {"path": "/dev/shm/x", "session": 1, "pid": gone.pid, "height": 84}
        pointer |= {"width": 84, "slots": 4, "action_meanings": ACTIONS}
        (tmp_path / "display.json").write_text(json.dumps(pointer))
        assert attach.poll() is None and "is not running any more" in str(attach.problem)
        assert attach.idle() is None  # the new one holds the run: it is setting up
        (tmp_path / "display.json").unlink()
        attach.poll()
        proc.kill()
        proc.wait(timeout=60)
        assert f"no trainer is running in {tmp_path}" in str(attach.idle())
        with pytest.raises(EdgerlError, match=r"within 0\.2 s: no trainer is running"):
            run_console(ViewOptions(tmp_path, console=True, timeout_s=0.2), io.StringIO())
    finally:
        if proc.poll() is None:
            proc.kill()
