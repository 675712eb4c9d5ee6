"""``edgerl view``: watch a running trainer on the board's screen, in a terminal, or as a PNG.

The viewer is a separate process that maps the trainer's frame stream read-only: opening, closing or
crashing it never touches training. It draws only when a new frame has arrived (at most ``--fps``),
waits while a trainer runs (starting, or with the display off), and reattaches when the trainer
restarts. After ``--timeout`` seconds without a frame while no trainer runs (a stopped or finished
run, a killed trainer) or the stream is damaged, it ends with a sentence saying which.

Keys: q/Esc quit, f fullscreen, +/- scale, o overlay on/off, s screenshot (--console: q quits).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shutil
import sys
import termios
import time
import tty
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from edgerl.display.attach import Attachment, NoFramesToShow
from edgerl.display.render import SurfaceRenderer, import_pygame, open_display, text_frame
from edgerl.errors import EdgerlError
from edgerl.report.status import game_without_frames
from edgerl.stream.reader import Frame, no_frames

log = logging.getLogger(__name__)

# A stream problem that lasts this long ends --snapshot and --frames at once: a damaged header
# stays damaged (a stream being made looks so only for a moment).
PROBLEM_GRACE_S = 1.0
PAUSE_NOTE_S = 2.0  # a live trainer's picture still for this long is said to be paused


@dataclass
class ViewOptions:
    run_dir: Path
    scale: int = 6
    fullscreen: bool = False
    snapshot: Path | None = None
    console: bool = False
    fps: float = 30.0
    frames: int = 0  # stop after this many frames drawn (0: until quit)
    timeout_s: float = 30.0  # --snapshot / --frames: how long to wait for frames


def pause_note(seconds: float) -> str:
    """What a still picture means while the trainer runs (PQN's update on a CPU takes seconds
    with no step, and a frozen game looked like a hung trainer)."""
    return (
        f"no new frame for {seconds:.0f} s; the trainer runs (it may be learning, evaluating or "
        "saving a checkpoint, or shows a frame only every display.every steps)"
    )


def _waiting_banner(run_dir: Path) -> str:
    return f"waiting for a trainer in {run_dir} (display.enabled = true)..."


def _start_wait(opts: ViewOptions) -> str:
    return f"waiting up to {opts.timeout_s:g} s for a trainer to start there"


def _console_wait(opts: ViewOptions, attach: Attachment) -> str:
    """What the console shows while no trainer gives frames: the banner, and why none does when
    no trainer runs there (a stopped run waited in silence for the whole timeout)."""
    if attach.problem:
        return _waiting_banner(opts.run_dir) + "\n" + attach.problem
    if (why := attach.idle()) is not None:
        return f"{why}\n{_start_wait(opts)}"
    return _waiting_banner(opts.run_dir)


def _give_up(opts: ViewOptions, attach: Attachment) -> EdgerlError | None:
    """For the window and the console after ``--timeout`` without a frame: the error to end
    with when no frame will come, or None to wait on for a trainer that runs."""
    why = attach.idle()
    if why is None:
        return None
    return EdgerlError(f"no frame from {opts.run_dir} within {opts.timeout_s:g} s: {why}")


def _say_waiting(opts: ViewOptions, attach: Attachment) -> bool:
    """Say once, a second in, why no frame has come and how long the wait is (a trainer may be
    starting there: the wait goes on); True once said."""
    why = attach.idle()
    if why is not None:
        log.warning("%s; %s", why, _start_wait(opts))
    else:
        log.info(
            "waiting up to %g s for the trainer in %s to show a frame", opts.timeout_s, opts.run_dir
        )
    return True


def _no_frames(opts: ViewOptions, attach: Attachment) -> EdgerlError:
    if attach.problem:
        return EdgerlError(
            f"no frame from {opts.run_dir} within {opts.timeout_s:g} s: {attach.problem}"
        )
    if why := attach.idle():
        return EdgerlError(
            f"no frame from {opts.run_dir} within {opts.timeout_s:g} s: {why} (frames come "
            "from a trainer running there with display.enabled = true)"
        )
    return EdgerlError(
        f"no frame from {opts.run_dir} within {opts.timeout_s:g} s: is a trainer running there "
        "with display.enabled = true? (edgerl status shows it)"
    )


def terminal_size(out: TextIO) -> os.terminal_size:
    """The terminal's size now (it may have been resized), not a stale COLUMNS/LINES."""
    try:
        return os.get_terminal_size(out.fileno())
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size((100, 40))


class Keys:
    """Single key presses from a terminal (cbreak mode, restored on exit); none when stdin is not
    a terminal."""

    def __init__(self) -> None:
        self.fd = -1
        self._saved: Any = None

    def __enter__(self) -> Keys:
        with contextlib.suppress(OSError, ValueError, termios.error):
            if sys.stdin.isatty():
                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.fd = fd
        return self

    def wait(self, seconds: float) -> str:
        """Wait up to ``seconds`` for key presses; returns what was typed ("" if nothing)."""
        if self.fd < 0:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self.fd], [], [], seconds)
        return os.read(self.fd, 64).decode(errors="replace") if ready else ""

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0 and self._saved is not None:
            with contextlib.suppress(OSError, termios.error):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)


def run_console(opts: ViewOptions, out: TextIO | None = None) -> int:
    """Draw frames as text in place, filling the terminal, a few times a second; q quits."""
    out = out or sys.stdout
    attach = Attachment(opts.run_dir)
    drawn = 0
    deadline = time.monotonic() + opts.timeout_s
    tty_out = out.isatty()
    clear = "\x1b[H\x1b[2J" if tty_out else ""
    shown_wait, text, last_at, noted = "", "", 0.0, 0.0
    wait, idle_at = _waiting_banner(opts.run_dir), 0.0
    try:
        with Keys() as keys:
            while True:
                frame = attach.latest()
                reader = attach.reader
                if frame is not None and reader is not None:
                    size = terminal_size(out)
                    text = text_frame(
                        frame.pixels,
                        frame.meta,
                        reader.action_meanings,
                        columns=size.columns,
                        rows=size.lines - 1,
                        q_bars=True,
                        width=size.columns,
                    )
                    out.write(clear + text + "\nq quits\n")
                    out.flush()
                    drawn, shown_wait = drawn + 1, ""
                    last_at = time.monotonic()
                    deadline = last_at + opts.timeout_s
                    if opts.frames and drawn >= opts.frames:
                        return 0
                elif (
                    reader is not None
                    and text
                    and tty_out
                    and time.monotonic() - last_at >= PAUSE_NOTE_S
                ):
                    now = time.monotonic()
                    if now - noted >= 1.0:  # the last picture, and why it stands still
                        out.write(clear + text + "\n" + pause_note(now - last_at) + "\nq quits\n")
                        out.flush()
                        noted = now
                elif reader is None:
                    if time.monotonic() - idle_at >= 1.0:  # why, looked up once a second
                        idle_at, wait = time.monotonic(), _console_wait(opts, attach)
                    if wait != shown_wait:  # say it once, not a blank screen, not a flood
                        out.write(clear + wait + "\n" + ("q quits\n" if keys.fd >= 0 else ""))
                        out.flush()
                        shown_wait = wait
                if frame is None and time.monotonic() > deadline:
                    if opts.frames:
                        raise _no_frames(opts, attach)
                    if (error := _give_up(opts, attach)) is not None:
                        raise error
                    deadline = time.monotonic() + opts.timeout_s  # a trainer runs: wait on
                elif opts.frames and attach.lasting_problem(min(PROBLEM_GRACE_S, opts.timeout_s)):
                    raise _no_frames(opts, attach)
                typed = keys.wait(1.0 / max(opts.fps, 0.5))
                if "q" in typed or "\x1b" in typed:
                    return 0
    except KeyboardInterrupt:
        return 0
    finally:
        attach.close()


def run_snapshot(opts: ViewOptions) -> int:
    """Wait for one fresh frame, draw it with its overlay off screen, save the PNG."""
    assert opts.snapshot is not None
    pg = import_pygame("edgerl view")
    attach = Attachment(opts.run_dir)
    started = time.monotonic()
    deadline, said = started + opts.timeout_s, False
    try:
        while time.monotonic() < deadline:
            frame = attach.latest()
            reader = attach.reader
            waited = time.monotonic() - started
            if frame is None and waited >= PROBLEM_GRACE_S and attach.ended():
                raise EdgerlError(  # its status says it stopped: no frame will come by itself
                    f"no frame to save: {attach.idle()}; a snapshot shows a running trainer's "
                    f"game (edgerl train --run-dir {opts.run_dir} to train on)"
                )
            if not said and frame is None and attach.problem is None and waited >= PROBLEM_GRACE_S:
                said = _say_waiting(opts, attach)  # a problem ends the wait instead, said once
            if frame is not None and reader is not None:
                renderer = SurfaceRenderer(
                    pg, reader.action_meanings, (reader.height, reader.width), opts.scale
                )
                surface = pg.Surface(renderer.size)
                renderer.draw(surface, frame.pixels, frame.meta)
                opts.snapshot.parent.mkdir(parents=True, exist_ok=True)
                pg.image.save(surface, str(opts.snapshot))
                log.info("saved %s (step %s)", opts.snapshot, f"{frame.meta.step:,}")
                return 0
            if attach.lasting_problem(min(PROBLEM_GRACE_S, opts.timeout_s)):
                break
            time.sleep(0.05)
    finally:
        attach.close()
    raise _no_frames(opts, attach)


def run_window(opts: ViewOptions) -> int:
    """The interactive window (or fullscreen on the board's screen)."""
    pg = import_pygame(
        "edgerl view's window", instead="draw in this terminal without it: edgerl view --console"
    )
    open_display(pg)
    attach = Attachment(opts.run_dir)
    scale, fullscreen, overlay = opts.scale, opts.fullscreen, True
    renderer: SurfaceRenderer | None = None
    screen = None
    last: Frame | None = None
    last_at = noted = 0.0  # when the last frame came; when the pause note was last drawn
    drawn = 0
    clock = pg.time.Clock()
    pg.display.set_caption(f"edgerl view - {opts.run_dir}")
    deadline = time.monotonic() + opts.timeout_s

    def open_screen(size: tuple[int, int]) -> Any:
        flags = pg.FULLSCREEN if fullscreen else 0
        return pg.display.set_mode((0, 0) if fullscreen else size, flags)

    try:
        screen = open_screen((640, 600))
        while True:
            dirty = False
            for event in pg.event.get():
                if event.type == pg.QUIT:
                    return 0
                if event.type != pg.KEYDOWN:
                    continue
                if event.key in (pg.K_q, pg.K_ESCAPE):
                    return 0
                if event.key == pg.K_f:
                    fullscreen = not fullscreen
                    screen = open_screen(renderer.size if renderer else (640, 600))
                elif event.key in (pg.K_PLUS, pg.K_EQUALS, pg.K_KP_PLUS):
                    scale = min(scale + 1, 16)
                elif event.key in (pg.K_MINUS, pg.K_KP_MINUS):
                    scale = max(scale - 1, 1)
                elif event.key == pg.K_o:
                    overlay = not overlay
                elif event.key == pg.K_s and screen is not None:
                    name = Path(f"edgerl-{time.strftime('%Y%m%d-%H%M%S')}.png")
                    pg.image.save(screen, str(name))
                    log.info("screenshot saved to %s", name)
                dirty = True
            frame = attach.latest()
            reader = attach.reader
            if reader is not None and (renderer is None or renderer.scale != scale):
                renderer = SurfaceRenderer(
                    pg, reader.action_meanings, (reader.height, reader.width), scale
                )
                if not fullscreen:
                    screen = open_screen(renderer.size)
                dirty = True
            now = time.monotonic()
            if frame is not None:
                last, dirty, last_at = frame, True, now
                drawn += 1
                deadline = now + opts.timeout_s
            paused = reader is not None and last is not None and now - last_at >= PAUSE_NOTE_S
            if paused and now - noted >= 1.0:  # the note's seconds count up
                dirty, noted = True, now
            if dirty and renderer is not None and screen is not None:
                if reader is None:
                    banner = attach.problem or _waiting_banner(opts.run_dir)
                else:
                    banner = pause_note(now - last_at) if paused else ""
                if last is not None:
                    renderer.draw(screen, last.pixels, last.meta, overlay, banner)
                pg.display.flip()
            elif reader is None and screen is not None and (dirty or last is None):
                screen.fill((12, 12, 12))
                font = pg.font.Font(None, 22)
                lines = [_waiting_banner(opts.run_dir)] + (
                    [attach.problem] if attach.problem else []
                )
                for i, line in enumerate(lines):
                    screen.blit(font.render(line, True, (220, 220, 220)), (10, 10 + 24 * i))
                pg.display.flip()
            if opts.frames and drawn >= opts.frames:
                return 0
            if frame is None and time.monotonic() > deadline:
                if opts.frames:
                    raise _no_frames(opts, attach)
                if (error := _give_up(opts, attach)) is not None:
                    raise error
                deadline = time.monotonic() + opts.timeout_s  # a trainer runs: wait on
            clock.tick(opts.fps)
    finally:
        attach.close()
        with contextlib.suppress(Exception):
            pg.display.quit()


def check_has_frames(run_dir: Path) -> None:
    """Raise NoFramesToShow at once for a run whose game has no screen (vector observations),
    running or not: no trainer of it will ever publish a frame."""
    game = game_without_frames(run_dir)
    if game is not None:
        raise NoFramesToShow(no_frames(run_dir, game))


def run(opts: ViewOptions) -> int:
    """Run the viewer in the mode the options ask for; returns the exit code."""
    check_has_frames(opts.run_dir)
    if opts.console:
        return run_console(opts)
    if opts.snapshot is not None:
        return run_snapshot(opts)
    return run_window(opts)
