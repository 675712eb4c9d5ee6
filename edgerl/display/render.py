"""Drawing a frame with its overlay: a pygame surface (window, screenshot) or text (console).

Shared by ``edgerl view`` and ``edgerl play --render``. pygame is imported lazily (an extra).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np

from edgerl.errors import EdgerlError, MissingDependencyError
from edgerl.play.observer import Moment, Observer
from edgerl.stream import FrameMeta

PANEL_HEIGHT = 96  # the Q-value bar chart under the game
TOP_HEIGHT = 86  # the overlay (up to 4 lines) above the game: over it, it hid Pong's left score
TEXT = (235, 235, 235)
DIM = (140, 140, 140)
BAR = (70, 130, 200)
CHOSEN = (240, 170, 40)


def import_pygame(purpose: str, instead: str = "") -> Any:
    """pygame with its greeting silenced; MissingDependencyError if the extra is not installed
    (``instead``: a way to the same end without it, said first)."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        import pygame
    except ImportError:
        raise MissingDependencyError("pygame", "viewer", purpose, instead) from None
    return pygame


log = logging.getLogger(__name__)

HEADLESS_DRIVERS = ("offscreen", "dummy")  # SDL's drivers that draw to no screen


def no_display_sentence(reason: str, console_flag: str = "--console") -> str:
    """The one sentence for "there is no screen here", naming the three ways on."""
    snapshot = "--snapshot FILE.png" if console_flag == "--console" else "edgerl view --snapshot"
    return (
        f"no display available ({reason}): on the board's own screen without a desktop run with "
        f"SDL_VIDEODRIVER=kmsdrm (x11 or wayland on a desktop), in a terminal use {console_flag}, "
        f"or save a frame with {snapshot}"
    )


@contextlib.contextmanager
def sdl_output_logged() -> Iterator[None]:
    """What SDL writes to the process's stderr while it probes video drivers (``error:
    XDG_RUNTIME_DIR is invalid or not set in the environment.``, printed before edgerl's own
    sentence about the display) goes to the debug log instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read(4096).decode(errors="replace").strip()
    if text:
        log.debug("SDL: %s", text)


def open_display(pg: Any, console_flag: str = "--console") -> None:
    """Initialise pygame's display and fonts; raises EdgerlError (one sentence) when there is no
    screen. SDL falls back to its offscreen or dummy driver when it finds none, and a window
    there shows nothing to anyone: that counts as no display unless SDL_VIDEODRIVER asked for it."""
    asked = os.environ.get("SDL_VIDEODRIVER", "")
    try:
        with sdl_output_logged():
            pg.display.init()
    except pg.error as e:
        raise EdgerlError(
            no_display_sentence(f"{e}; SDL_VIDEODRIVER={asked or 'unset'}", console_flag)
        ) from None
    driver = pg.display.get_driver()
    if driver in HEADLESS_DRIVERS and driver != asked:
        pg.display.quit()
        seen = ", ".join(
            f"{k}={os.environ[k]}" for k in ("DISPLAY", "WAYLAND_DISPLAY") if os.environ.get(k)
        )
        raise EdgerlError(
            no_display_sentence(
                f"SDL found no screen and fell back to its {driver} driver; "
                f"{seen or 'no DISPLAY or WAYLAND_DISPLAY'}",
                console_flag,
            )
        )
    pg.font.init()


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.0f}%"


def overlay_lines(meta: FrameMeta) -> list[str]:
    """The overlay's text: score, episode, step, epsilon, steps/s, CPU max-core, GR3D."""
    return [
        f"score {meta.episode_return:+.0f}   episode {meta.episode:,}   step {meta.step:,}",
        f"epsilon {meta.epsilon:.3f}   {meta.sps:,.0f} steps/s",
        f"CPU {_pct(meta.cpu_max_core)} max-core   GR3D {_pct(meta.gr3d)}",
    ]


class SurfaceRenderer:
    """Draws a grey frame scaled up, the text overlay and a Q-value bar chart (pygame)."""

    def __init__(
        self, pygame: Any, action_meanings: list[str], frame_hw: tuple[int, int], scale: int
    ) -> None:
        self.pg = pygame
        pygame.font.init()  # also for --snapshot, which opens no display
        self.font = pygame.font.Font(None, 22)
        self.small = pygame.font.Font(None, 16)
        self.actions = action_meanings
        self.frame_hw = frame_hw
        self.scale = scale

    @property
    def size(self) -> tuple[int, int]:
        h, w = self.frame_hw
        return max(w * self.scale, 420), h * self.scale + TOP_HEIGHT + PANEL_HEIGHT

    def draw(
        self,
        target: Any,
        frame: np.ndarray | None,
        meta: FrameMeta,
        overlay: bool = True,
        banner: str = "",
    ) -> None:
        pg = self.pg
        target.fill((12, 12, 12))
        width, height = target.get_size()
        game_h = height - PANEL_HEIGHT - TOP_HEIGHT
        if frame is not None:
            rgb = np.repeat(frame[:, :, None], 3, axis=2) if frame.ndim == 2 else frame
            surf = pg.surfarray.make_surface(np.ascontiguousarray(rgb.swapaxes(0, 1)))
            fh, fw = frame.shape[:2]
            s = max(1, min(width // fw, game_h // fh))
            scaled = pg.transform.scale(surf, (fw * s, fh * s))
            target.blit(scaled, ((width - fw * s) // 2, TOP_HEIGHT + (game_h - fh * s) // 2))
        if overlay:
            self._text_box(target, overlay_lines(meta) + ([banner] if banner else []))
            self._q_bars(target, meta, pg.Rect(0, TOP_HEIGHT + game_h, width, PANEL_HEIGHT))
        elif banner:
            self._text_box(target, [banner])

    def _text_box(self, target: Any, lines: list[str]) -> None:
        rendered = [self.font.render(line, True, TEXT) for line in lines]
        w = max(r.get_width() for r in rendered) + 12
        h = sum(r.get_height() + 2 for r in rendered) + 8
        box = self.pg.Surface((w, h), self.pg.SRCALPHA)
        box.fill((0, 0, 0, 170))
        target.blit(box, (6, 6))
        y = 10
        for r in rendered:
            target.blit(r, (12, y))
            y += r.get_height() + 2

    def _q_bars(self, target: Any, meta: FrameMeta, rect: Any) -> None:
        pg = self.pg
        q = [v for v in meta.q_values if not math.isnan(v)]
        n = max(len(self.actions), 1)
        slot = rect.width / n
        label_h = 16
        if len(q) != len(meta.q_values) or not q:
            msg = self.small.render("Q-values: none (random action)", True, DIM)
            target.blit(msg, (rect.x + 8, rect.y + 8))
            return
        lo, hi = min(q), max(q)
        span = hi - lo or 1.0
        top, bottom = rect.y + 6, rect.bottom - label_h - 4
        for i, v in enumerate(meta.q_values):
            frac = 0.1 + 0.9 * (v - lo) / span
            h = int((bottom - top) * frac)
            x = int(rect.x + i * slot + slot * 0.15)
            color = CHOSEN if i == meta.action else BAR
            pg.draw.rect(target, color, pg.Rect(x, bottom - h, max(2, int(slot * 0.7)), h))
            name = self.actions[i] if i < len(self.actions) else str(i)
            label = self.small.render(name[:9], True, CHOSEN if i == meta.action else DIM)
            target.blit(
                label, (int(rect.x + i * slot + (slot - label.get_width()) / 2), bottom + 3)
            )


GREYS = 24  # the 256-colour palette's grey ramp, colours 232..255


def text_frame(
    frame: np.ndarray | None,
    meta: FrameMeta,
    action_meanings: list[str],
    columns: int = 42,
    status: str | None = None,
    rows: int | None = None,
    q_bars: bool = False,
    width: int | None = None,
) -> str:
    """The frame as text (each character shows two pixels with a half block) plus a status line;
    ``columns`` and ``rows`` bound the whole text, ``q_bars`` adds a bar per action. The status
    is cut into lines of at most ``width`` characters (the terminal's, by default) between its
    ``|``-separated parts, never inside a word."""
    lines: list[str] = []
    bars = q_bar_lines(meta, action_meanings, columns) if q_bars else []
    if frame is not None and frame.ndim == 2:
        h, w = frame.shape
        cols = max(8, columns)
        if rows is not None:  # leave room for the status lines and the bars
            free = max(2, rows - len(bars) - 4)
            cols = max(8, min(cols, int(free * 2 * w / h)))
        text_rows = max(2, round(h * cols / w / 2) * 2)
        ys = (np.arange(text_rows) * h / text_rows).astype(int)
        xs = (np.arange(cols) * w / cols).astype(int)
        small = frame[ys][:, xs].astype(np.int32) * GREYS // 256 + 232
        for r in range(0, text_rows, 2):
            top, bottom = small[r], small[r + 1]
            cells = "".join(
                f"\x1b[38;5;{t}m\x1b[48;5;{b}m\u2580" for t, b in zip(top, bottom, strict=True)
            )
            lines.append(cells + "\x1b[0m")
    if 0 <= meta.action < len(action_meanings):
        action = action_meanings[meta.action]
    elif meta.action < 0 and meta.q_values:  # a continuous game's: its numbers
        action = " ".join(f"{v:+.2f}" for v in meta.q_values[:8])
    else:
        action = str(meta.action)
    if status is None:
        status = " | ".join([*overlay_lines(meta), f"action {action}"]).replace("   ", " ")
    lines += fit_status(status, width or shutil.get_terminal_size((100, 40)).columns)
    lines += bars
    return "\n".join(lines)


def fit_status(status: str, width: int) -> list[str]:
    """``status`` ("a | b | c") as lines of at most ``width`` characters, cut between its parts
    (a part longer than a line is cut between its words): a terminal's own wrap would cut
    inside a word ("RIG" / "HT")."""
    width = max(20, width)
    lines: list[str] = []
    for part in status.split(" | "):
        pieces = textwrap.wrap(part, width, break_long_words=False) or [""]
        if lines and len(lines[-1]) + 3 + len(pieces[0]) <= width:
            lines[-1] += " | " + pieces.pop(0)
        lines += pieces
    return lines


def q_bar_lines(meta: FrameMeta, action_meanings: list[str], columns: int) -> list[str]:
    """The window's Q-value chart as text: one line per action, the chosen one marked."""
    q = meta.q_values
    if not q or any(math.isnan(v) for v in q):
        return ["Q-values: none (random action)"]
    lo, hi = min(q), max(q)
    span = hi - lo or 1.0
    width = max(4, min(40, columns - 24))
    lines = []
    for i, v in enumerate(q):
        name = action_meanings[i] if i < len(action_meanings) else str(i)
        filled = 1 + round((width - 1) * (v - lo) / span)
        mark = ">" if i == meta.action else " "
        lines.append(f"{mark}{name[:10]:<10} {'#' * filled:<{width}} {v:+.3f}")
    return lines


class DisplayUnavailable(EdgerlError):
    """No video device for a window."""


class PlayRenderer(Observer):
    """``edgerl play --render screen|console``: draws each step; closing the window or pressing
    q or Escape ends playing."""

    wants_q = True  # the bar chart and the console's best Q

    def __init__(
        self,
        kind: str,
        action_meanings: list[str],
        frame_hw: tuple[int, int] | None,
        fullscreen: bool = False,
        scale: int = 6,
    ) -> None:
        self.kind = kind
        self.window = kind == "screen"
        self.actions = action_meanings
        self.pg: Any = None
        self.screen: Any = None
        self.renderer: SurfaceRenderer | None = None
        if kind == "screen":
            self.pg = import_pygame(
                "edgerl play --render screen",
                instead="draw in this terminal without it: edgerl play --render console",
            )
            open_display(self.pg, console_flag="--render console")
            self.renderer = SurfaceRenderer(self.pg, action_meanings, frame_hw or (84, 84), scale)
            flags = self.pg.FULLSCREEN if fullscreen else 0
            self.screen = self.pg.display.set_mode(
                (0, 0) if fullscreen else self.renderer.size, flags
            )
            self.pg.display.set_caption("edgerl play")

    def on_step(self, moment: Moment) -> bool:
        """Draw the observation the step's action was chosen on, with the action, its Q-values and
        the score after it; False when the window was closed."""
        obs, action, q = moment.obs, moment.action, moment.q
        episode, step, ret = moment.episode, moment.steps, moment.ret
        frame = obs[-1] if obs.ndim == 3 else None
        meta = FrameMeta(
            step=step,
            episode=episode,
            episode_return=ret,
            epsilon=0.0,
            action=action,
            q_values=tuple(q.tolist()) if q is not None else (),
        )
        if self.kind == "console":
            name = self.actions[action] if 0 <= action < len(self.actions) else str(action)
            best = f" | Q {max(meta.q_values):+.3f}" if meta.q_values else ""
            if action < 0 and meta.q_values:  # a continuous game's action: its numbers
                name, best = " ".join(f"{v:+.3f}" for v in meta.q_values[:8]), ""
            status = f"episode {episode} | step {step:,} | score {ret:+.0f} | action {name}{best}"
            if frame is None:
                status = "obs [" + " ".join(f"{v:+.3f}" for v in obs.ravel()) + "] | " + status
            screen = text_frame(frame, meta, self.actions, status=status)
            print("\x1b[H\x1b[2J" + screen, flush=True)
            return True
        pg = self.pg
        for event in pg.event.get():
            if event.type == pg.QUIT or (
                event.type == pg.KEYDOWN and event.key in (pg.K_q, pg.K_ESCAPE)
            ):
                return False
        assert self.renderer is not None
        self.renderer.draw(self.screen, frame, meta)
        pg.display.flip()
        return True

    def close(self) -> None:
        if self.pg is not None:
            self.pg.display.quit()


def make_renderer(kind: str, spec: Any, fullscreen: bool = False) -> PlayRenderer:
    """A renderer for ``edgerl play``; raises EdgerlError when no display is available."""
    return PlayRenderer(kind, list(spec.action_meanings), spec.frame_size, fullscreen)
