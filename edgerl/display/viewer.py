"""``edgerl view``: watch a running trainer on the board's screen, in a terminal, or as a PNG.

The viewer is a separate process that maps the trainer's frame stream read-only: opening, closing or
crashing it never touches training. It draws only when a new frame has arrived (at most ``--fps``),
waits when nothing runs, and reattaches when the trainer restarts.

Keys: q/Esc quit, f fullscreen, +/- scale, o overlay on/off, s screenshot.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from edgerl.display.render import SurfaceRenderer, import_pygame, open_display, text_frame
from edgerl.display.stream import POINTER_FILE, Frame, FrameReader
from edgerl.errors import EdgerlError

log = logging.getLogger(__name__)

CHECK_TRAINER_EVERY_S = 1.0


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


class Attachment:
    """The current reader, replaced when the trainer restarts; None while nothing publishes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.reader: FrameReader | None = None
        self._checked = 0.0

    def poll(self) -> FrameReader | None:
        now = time.monotonic()
        if now - self._checked < CHECK_TRAINER_EVERY_S and self.reader is not None:
            return self.reader
        self._checked = now
        if self.reader is not None and not self.reader.still_current():
            log.info("the trainer stopped publishing; waiting for it to come back")
            self.reader.close()
            self.reader = None
        if self.reader is None and (self.run_dir / POINTER_FILE).exists():
            try:
                self.reader = FrameReader(self.run_dir)
            except (OSError, ValueError) as e:  # a stream being created or removed right now
                log.debug("not attached yet: %s", e)
                return None
            if not self.reader.still_current():
                self.reader.close()
                self.reader = None
            else:
                log.info("attached to %s", self.run_dir)
        return self.reader

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def _waiting_banner(run_dir: Path) -> str:
    return f"waiting for a trainer in {run_dir} (display.enabled = true)..."


def _no_frames(opts: ViewOptions) -> EdgerlError:
    return EdgerlError(
        f"no frame from {opts.run_dir} within {opts.timeout_s:.0f} s: is a trainer running there "
        "with display.enabled = true? (edgerl status shows it)"
    )


def run_console(opts: ViewOptions, out: TextIO | None = None) -> int:
    """Draw frames as text in place, a few times a second; Ctrl-C quits."""
    out = out or sys.stdout
    attach = Attachment(opts.run_dir)
    drawn = 0
    deadline = time.monotonic() + opts.timeout_s
    tty = out.isatty()
    try:
        while True:
            reader = attach.poll()
            frame = reader.latest() if reader is not None else None
            if frame is not None:
                text = text_frame(frame.pixels, frame.meta, reader.action_meanings)
                out.write(("\x1b[H\x1b[2J" if tty else "") + text + "\n")
                out.flush()
                drawn += 1
                deadline = time.monotonic() + opts.timeout_s
                if opts.frames and drawn >= opts.frames:
                    return 0
            elif opts.frames and time.monotonic() > deadline:
                raise _no_frames(opts)
            time.sleep(1.0 / max(opts.fps, 0.5))
    except KeyboardInterrupt:
        return 0
    finally:
        attach.close()


def run_snapshot(opts: ViewOptions) -> int:
    """Wait for one fresh frame, draw it with its overlay off screen, save the PNG."""
    assert opts.snapshot is not None
    pg = import_pygame("edgerl view")
    attach = Attachment(opts.run_dir)
    deadline = time.monotonic() + opts.timeout_s
    try:
        while time.monotonic() < deadline:
            reader = attach.poll()
            frame = reader.latest() if reader is not None else None
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
            time.sleep(0.05)
    finally:
        attach.close()
    raise _no_frames(opts)


def run_window(opts: ViewOptions) -> int:
    """The interactive window (or fullscreen on the board's screen)."""
    pg = import_pygame("edgerl view")
    open_display(pg)
    attach = Attachment(opts.run_dir)
    scale, fullscreen, overlay = opts.scale, opts.fullscreen, True
    renderer: SurfaceRenderer | None = None
    screen = None
    last: Frame | None = None
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
            reader = attach.poll()
            frame = reader.latest() if reader is not None else None
            if reader is not None and (renderer is None or renderer.scale != scale):
                renderer = SurfaceRenderer(
                    pg, reader.action_meanings, (reader.height, reader.width), scale
                )
                if not fullscreen:
                    screen = open_screen(renderer.size)
                dirty = True
            if frame is not None:
                last, dirty = frame, True
                drawn += 1
                deadline = time.monotonic() + opts.timeout_s
            if dirty and renderer is not None and screen is not None:
                banner = "" if reader is not None else _waiting_banner(opts.run_dir)
                if last is not None:
                    renderer.draw(screen, last.pixels, last.meta, overlay, banner)
                pg.display.flip()
            elif reader is None and screen is not None and (dirty or last is None):
                screen.fill((12, 12, 12))
                font = pg.font.Font(None, 22)
                screen.blit(
                    font.render(_waiting_banner(opts.run_dir), True, (220, 220, 220)), (10, 10)
                )
                pg.display.flip()
            if opts.frames and drawn >= opts.frames:
                return 0
            if opts.frames and time.monotonic() > deadline:
                raise _no_frames(opts)
            clock.tick(opts.fps)
    finally:
        attach.close()
        with contextlib.suppress(Exception):
            pg.display.quit()


def run(opts: ViewOptions) -> int:
    """Run the viewer in the mode the options ask for; returns the exit code."""
    if opts.console:
        return run_console(opts)
    if opts.snapshot is not None:
        return run_snapshot(opts)
    return run_window(opts)
