"""The game on the page: one reader of a run's frame stream, shared by all who watch that run,
and the WebSocket that sends each of them frames as fast as their link takes them.

A :class:`FrameHub` reads the stream only while someone watches, at most ``fps`` times a second,
through the same :class:`~edgerl.display.attach.Attachment` as ``edgerl view`` (so it waits for a
trainer, follows a restart and names a damaged stream). Each new frame is made a small PNG once,
whoever watches. A viewer is sent a frame only once it has said that it drew the one before, so
a slow link gets fewer frames instead of a queue, and a viewer that stops reading holds nothing
but its own socket. Frames are binary messages: a 4-byte little-endian length, that many bytes
of JSON (step, episode, score, action...), then the PNG. Text messages are JSON sentences saying
why no frame comes (``{"note": ...}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
import zlib
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.display.attach import Attachment, NoFramesToShow
from edgerl.errors import EdgerlError
from edgerl.report.status import game_without_frames, read_status
from edgerl.serve.rundir import foreign_stream, pointer_refusal
from edgerl.serve.runs import for_viewers
from edgerl.stream.reader import Frame, no_frames

log = logging.getLogger(__name__)

NOTE_EVERY_S = 1.0  # how often the reason for no frames is looked at again
SEND_TIMEOUT_S = 30.0  # a viewer whose socket takes nothing for this long is dropped
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_grey(pixels: np.ndarray) -> bytes:
    """An 8-bit greyscale PNG of a 2-D uint8 array (what a browser draws without help)."""
    height, width = pixels.shape
    rows = np.zeros((height, width + 1), dtype=np.uint8)  # each row starts with filter 0: none
    rows[:, 1:] = pixels

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


def frame_message(frame: Frame, actions: list[str]) -> bytes:
    """A frame as the page receives it: length, JSON of its figures, PNG."""
    meta = frame.meta
    action = actions[meta.action] if 0 <= meta.action < len(actions) else None
    figures = {
        "seq": frame.seq,
        "step": meta.step,
        "episode": meta.episode,
        "score": _finite(meta.episode_return),
        "epsilon": _finite(meta.epsilon),
        "action": action,
        "sps": _finite(meta.sps),
        "q": [_finite(q) for q in meta.q_values],
        "actions": actions,
        "time": _finite(meta.time),
    }
    head = json.dumps(figures, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head + png_grey(frame.pixels)


def _finite(x: float) -> float | None:
    return round(x, 4) if np.isfinite(x) else None


def note_message(text: str, run_dir: Path) -> str:
    """Why no frame is shown, as the page gets it: the board's paths and pids left out (what
    ``for_viewers`` does for every text the server sends about a run)."""
    return json.dumps({"note": for_viewers(text, run_dir)})


class FrameHub:
    """The newest frame (or the reason there is none) of one run, read while anyone watches."""

    def __init__(self, run_dir: Path, fps: float, pool: Executor) -> None:
        self.run_dir = run_dir
        self.period = 1.0 / fps
        self.pool = pool
        self.viewers = 0
        self.version = 0
        self.message: bytes | str = note_message(
            f"waiting for the trainer of {run_dir.name}", run_dir
        )
        self._news = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attach: Attachment | None = None
        self._noted = -1e9
        self._checked: object = None  # the reader whose stream was found the run's own

    def join(self) -> None:
        """One more viewer; the reading starts with the first."""
        self.viewers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._read())

    def leave(self) -> None:
        """One viewer fewer; the reading stops (and the stream is let go) after the last."""
        self.viewers -= 1

    async def close(self) -> None:
        """Stop reading (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def newer_than(self, version: int) -> tuple[int, bytes | str]:
        """The first message after ``version`` (waits for it): (its version, the message)."""
        while self.version <= version:
            news = self._news
            await news.wait()
        return self.version, self.message

    def _publish(self, message: bytes | str) -> None:
        if message == self.message:
            return
        self.message = message
        self.version += 1
        self._news.set()
        self._news = asyncio.Event()

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        self._attach = Attachment(self.run_dir)
        try:
            while self.viewers > 0:
                started = loop.time()
                message = await loop.run_in_executor(self.pool, self._poll)
                if message is not None:
                    self._publish(message)
                await asyncio.sleep(max(self.period - (loop.time() - started), 0.005))
        finally:
            attach, self._attach = self._attach, None
            if attach is not None:
                attach.close()  # closes a file descriptor: nothing to wait for
        if self.viewers > 0:  # one came while the last was leaving
            self._task = loop.create_task(self._read())

    def _poll(self) -> bytes | str | None:
        """In a worker thread: the message to show now, or None to keep the current one."""
        attach = self._attach
        if attach is None:
            return None
        try:
            if attach.reader is None and (why := pointer_refusal(self.run_dir)) is not None:
                return note_message(why, self.run_dir)  # display.json is not read
            frame = attach.latest()
            reader = attach.reader
            if reader is not None and reader is not self._checked:
                # display.json may name any run's stream: only the run owner's is shown
                if (why := foreign_stream(self.run_dir, reader.path)) is not None:
                    attach.close()
                    self._attach = Attachment(self.run_dir)
                    return note_message(why, self.run_dir)
                self._checked = reader
            if frame is not None and reader is not None:
                return frame_message(frame, reader.action_meanings)
            if reader is not None or time.monotonic() - self._noted < NOTE_EVERY_S:
                return None
            self._noted = time.monotonic()
            return note_message(self._why_none(attach), self.run_dir)
        except NoFramesToShow as e:
            return note_message(str(e), self.run_dir)
        except (EdgerlError, OSError, ValueError) as e:  # a stream we may not read, damage
            attach.close()
            self._attach = Attachment(self.run_dir)
            return note_message(str(e), self.run_dir)

    def _why_none(self, attach: Attachment) -> str:
        game = game_without_frames(self.run_dir)
        if game is not None:
            return no_frames(self.run_dir, game)
        why = attach.problem or attach.idle()
        if why is not None:
            return why
        try:
            stopping = read_status(self.run_dir).get("state") == "stopping"
        except EdgerlError:
            stopping = False
        if stopping:
            return f"the trainer of {self.run_dir.name} is stopping (writing its checkpoint)"
        return (
            f"the trainer of {self.run_dir.name} publishes no frames yet (it may be starting, "
            "or display.enabled is false)"
        )


async def stream_to(ws: Any, hub: FrameHub) -> None:
    """Send ``hub``'s messages to the WebSocket ``ws`` (aiohttp's) until it closes: a frame,
    then the next one only once the page has answered that it drew it."""
    from aiohttp import WSMsgType

    version, ready = 0, True
    receiving: asyncio.Future[Any] = asyncio.ensure_future(ws.receive())
    waiting: asyncio.Future[tuple[int, bytes | str]] | None = None
    hub.join()
    try:
        while True:
            if ready and waiting is None:
                waiting = asyncio.ensure_future(hub.newer_than(version))
            pending = {receiving} | ({waiting} if waiting is not None else set())
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if receiving in done:
                if receiving.result().type != WSMsgType.TEXT:
                    return  # closed, or an error: the page has gone
                ready = True
                receiving = asyncio.ensure_future(ws.receive())
            if waiting is not None and waiting in done:
                version, message = waiting.result()
                waiting = None
                send = ws.send_bytes if isinstance(message, bytes) else ws.send_str
                await asyncio.wait_for(send(message), SEND_TIMEOUT_S)
                ready = not isinstance(message, bytes)  # a note needs no answer
    except (asyncio.TimeoutError, ConnectionError) as e:
        log.debug("dropped a viewer of %s: %s", hub.run_dir, e)
    finally:
        hub.leave()
        for task in (receiving, waiting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
