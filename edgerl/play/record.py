"""Recording frames to a GIF (Pillow) or an MP4 (ffmpeg), written atomically.

:func:`open_recorder` gives a :class:`Recorder` for ``FILE.gif`` or ``FILE.mp4``; ``add()`` takes
one frame at a time (HxWx3 uint8 RGB or HxW grey, optionally with a caption drawn in a band beneath
it) and ``close()`` (or leaving the ``with`` block) finishes the file. Frames are written as they
come, so memory stays flat however long the recording: a GIF frame holds only the pixels that
changed since the one before (the others are transparent), an MP4 is piped to ffmpeg as raw video.

Written under a temporary name, renamed when complete: a kill leaves no half file under its name.

Pillow is the ``record`` extra (imported here only, with the install hint when it is missing); an
MP4 needs the ``ffmpeg`` program on PATH or the binary of the ``imageio-ffmpeg`` package.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np

from edgerl.errors import EdgerlError, MissingDependencyError
from edgerl.files.atomic import TEMP_NAME, claim_temp, fsync_dir, open_temp, temp_path
from edgerl.files.processes import pid_alive

log = logging.getLogger(__name__)

SUFFIXES = (".gif", ".mp4")
CAPTION_HEIGHT = 14  # the band beneath a frame that holds its caption, in pixels (scaled up
CAPTION_WIDTH = 240  # by one more for each CAPTION_WIDTH pixels of a frame's width)
GIF_MIN_DELAY_CS = 2  # browsers show a GIF frame shorter than 2/100 s for 1/10 s instead
MP4_MIN_WIDTH = 320  # smaller frames are scaled up (nearest neighbour) so players keep pixels sharp
FFMPEG_TIMEOUT_S = 120.0


class RecordError(EdgerlError):
    """A recording cannot be made (unsupported file, no encoder, unwritable directory)."""


@dataclass(frozen=True)
class Recording:
    """What a finished recording wrote."""

    path: Path
    frames: int  # frames in the file (a GIF faster than 50 fps keeps every k-th)
    seconds: float  # its playing time
    bytes: int

    def describe(self) -> str:
        """One line: where, how many frames, how long, how big."""
        return (
            f"recorded {self.frames:,} frames ({self.seconds:.1f} s) to {self.path} "
            f"({_size(self.bytes)})"
        )


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} bytes"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 / 1024:.1f} MiB"


def _import_pillow(purpose: str) -> Any:
    """Pillow's Image module; MissingDependencyError with the install hint when absent."""
    try:
        from PIL import Image, ImageDraw, ImageFont  # noqa: F401
    except ImportError:
        raise MissingDependencyError("pillow", "record", purpose) from None
    return Image


def caption_scale(width: int) -> int:
    """How many times its natural size a caption is drawn under a frame ``width`` pixels wide:
    the band is ``CAPTION_HEIGHT`` times that high."""
    return max(1, width // CAPTION_WIDTH)


def caption_frame(frame: np.ndarray, text: str) -> np.ndarray:
    """``frame`` (RGB) with a black band beneath it holding ``text`` in white (see
    :func:`caption_scale`); text wider than the frame is cut. Raises MissingDependencyError
    without Pillow."""
    Image = _import_pillow("drawing a recording's caption")
    from PIL import ImageDraw, ImageFont

    w = frame.shape[1]
    scale = caption_scale(w)
    band = Image.new("RGB", (-(-w // scale), CAPTION_HEIGHT))
    # The bitmap font (Courier 8): crisp at this size, the same on every machine. Pillow 10.1+
    # makes load_default() a scalable font where FreeType is present, so ask for it by name.
    bitmap = getattr(ImageFont, "load_default_imagefont", ImageFont.load_default)
    ImageDraw.Draw(band).text((3, 2), text, fill=(235, 235, 235), font=bitmap())
    pixels = np.asarray(band, dtype=np.uint8).repeat(scale, axis=0).repeat(scale, axis=1)
    return np.concatenate([frame, pixels[:, :w]], axis=0)


class Recorder:
    """Frames in, a finished file out; see the module docstring. Use :func:`open_recorder`."""

    def __init__(self, path: Path, fps: float) -> None:
        self.path = path
        self.fps = fps
        self.frames = 0  # frames added
        self._tmp = temp_path(path)
        self._shape: tuple[int, int] | None = None
        self._done = False

    def add(self, frame: np.ndarray, caption: str | None = None) -> None:
        """Append one frame: HxWx3 uint8 RGB or HxW uint8 grey, all of one size; with
        ``caption``, a band beneath it holds that text. Raises ValueError for a frame of another
        size or kind, RecordError when the encoder fails or the file cannot be written."""
        if self._done:
            raise ValueError(f"recording {self.path} is already closed")
        rgb = _as_rgb(frame)
        if caption is not None:
            rgb = caption_frame(rgb, caption)
        shape = (rgb.shape[0], rgb.shape[1])
        if self._shape is not None and shape != self._shape:
            raise ValueError(f"frame of {shape}, but this recording's frames are {self._shape}")
        try:
            if self._shape is None:
                self._shape = shape
                self._start(shape)
            self._write(rgb)
        except OSError as e:  # a full disk: nothing is left under either name
            self.abort()
            raise RecordError(_cannot_write(self.path, e)) from None
        self.frames += 1

    def close(self) -> Recording | None:
        """Finish the file and give it its name; returns what was written, or None when no frame
        was added (then nothing is written). Raises RecordError when the encoder fails or the
        file cannot be written (a full disk), with nothing left under either name."""
        if self._done:
            raise ValueError(f"recording {self.path} is already closed")
        self._done = True
        if self._shape is None:
            return None
        try:
            frames, seconds = self._finish()
            os.replace(self._tmp, self.path)
            fsync_dir(self.path.parent)
        except BaseException as e:
            with contextlib.suppress(Exception):
                self._stop()
            self._remove_temp()
            if isinstance(e, OSError):
                raise RecordError(_cannot_write(self.path, e)) from None
            raise
        return Recording(self.path.resolve(), frames, seconds, self.path.stat().st_size)

    def abort(self) -> None:
        """Stop without writing anything under the final name (the temporary file goes)."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(Exception):
            self._stop()
        self._remove_temp()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.close()

    def _remove_temp(self) -> None:
        with contextlib.suppress(OSError):
            self._tmp.unlink()

    # What each format does.
    def _start(self, shape: tuple[int, int]) -> None:
        raise NotImplementedError

    def _write(self, rgb: np.ndarray) -> None:
        raise NotImplementedError

    def _finish(self) -> tuple[int, float]:
        """Complete and fsync the temporary file; returns (frames in it, seconds)."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Release what is open, leaving the file as it is."""


def _cannot_write(path: Path, e: OSError) -> str:
    full = " (the disk is full)" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"cannot write the recording {path}: {e.strerror or e}{full}"


def _as_rgb(frame: np.ndarray) -> np.ndarray:
    if frame.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, not {frame.dtype}")
    if frame.ndim == 2:
        return np.repeat(frame[:, :, None], 3, axis=2)
    if frame.ndim == 3 and frame.shape[2] == 3:
        return np.ascontiguousarray(frame)
    raise ValueError(f"a frame must be HxWx3 RGB or HxW grey, not of shape {frame.shape}")


class GifRecorder(Recorder):
    """An animated GIF that loops, written frame by frame with Pillow's LZW encoder.

    Each frame has its own colour table (the exact colours when it has at most 255, else
    Pillow's quantiser) and holds only the rectangle that changed, with unchanged pixels in it
    transparent: Atari screens change little from step to step, which keeps files small."""

    def __init__(self, path: Path, fps: float) -> None:
        super().__init__(path, fps)
        self._image = _import_pillow(f"recording a GIF ({path.name})")
        from PIL import GifImagePlugin

        self._gif = GifImagePlugin
        # Keep every k-th frame where the rate is above what a GIF can show.
        self.every = max(1, math.ceil(fps * GIF_MIN_DELAY_CS / 100 - 1e-9))
        self._fp: IO[bytes] | None = None
        self._prev: np.ndarray | None = None
        self._pending: tuple[Any, tuple[int, int], int | None] | None = None
        self._kept = 0

    def _start(self, shape: tuple[int, int]) -> None:
        h, w = shape
        self._fp = open_temp(self.path)
        # Header: no global colour table (each frame brings its own); loop forever.
        self._fp.write(b"GIF89a" + _u16(w) + _u16(h) + b"\x00\x00\x00")
        self._fp.write(b"!\xff\x0bNETSCAPE2.0\x03\x01" + _u16(0) + b"\x00")

    def _write(self, rgb: np.ndarray) -> None:
        if (self.frames % self.every) != 0:
            return
        if self._prev is None:
            changed = np.ones(rgb.shape[:2], dtype=bool)
        else:
            changed = np.any(rgb != self._prev, axis=2)
        self._prev = rgb
        rows, cols = np.flatnonzero(changed.any(axis=1)), np.flatnonzero(changed.any(axis=0))
        if rows.size == 0:  # nothing changed: one transparent pixel keeps the frame's time
            top, left, bottom, right = 0, 0, 1, 1
        else:
            top, bottom, left, right = rows[0], rows[-1] + 1, cols[0], cols[-1] + 1
        image, transparent = self._paletted(
            rgb[top:bottom, left:right], changed[top:bottom, left:right]
        )
        self._flush_pending()
        self._pending = (image, (int(left), int(top)), transparent)

    def _paletted(self, crop: np.ndarray, changed: np.ndarray) -> tuple[Any, int | None]:
        """The crop as a "P" image whose unchanged pixels use a transparent index."""
        Image = self._image
        h, w = crop.shape[:2]
        packed = (
            crop[..., 0].astype(np.uint32) << 16
            | crop[..., 1].astype(np.uint32) << 8
            | crop[..., 2].astype(np.uint32)
        )
        colours, index = np.unique(packed[changed], return_inverse=True)
        if colours.size <= 255:
            indices = np.full((h, w), colours.size, dtype=np.uint8)
            indices[changed] = index.astype(np.uint8)
            palette = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=1)
        else:  # too many colours (a smooth render): Pillow picks 255 of them
            quantised = Image.fromarray(crop).quantize(
                255, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
            )
            indices = np.asarray(quantised, dtype=np.uint8).copy()
            indices[~changed] = 255
            raw = quantised.getpalette()[: 255 * 3]
            palette = np.asarray(raw + [0] * (255 * 3 - len(raw))).reshape(255, 3)
        transparent = int(palette.shape[0]) if not changed.all() else None
        image = Image.frombytes("P", (w, h), indices.tobytes())
        flat = palette.astype(np.uint8).ravel().tobytes()
        image.putpalette(flat + b"\x00\x00\x00" if transparent is not None else flat)
        return image, transparent

    def _flush_pending(self) -> None:
        """Write the frame held back: its delay is known once the next one comes (the delays
        add up to the exact playing time, 15 fps being 7, 7 and 6 hundredths)."""
        if self._pending is None:
            return
        assert self._fp is not None
        image, offset, transparent = self._pending
        start = round(self._kept * self.every * 100 / self.fps)
        end = round((self._kept + 1) * self.every * 100 / self.fps)
        params: dict[str, Any] = {
            "duration": max(end - start, GIF_MIN_DELAY_CS) * 10,
            "disposal": 1,  # leave it in place: the next frame draws only what changed
            "include_color_table": True,
        }
        if transparent is not None:
            params["transparency"] = transparent
        for chunk in self._gif.getdata(image, offset, **params):
            self._fp.write(chunk)
        self._kept += 1
        self._pending = None

    def _finish(self) -> tuple[int, float]:
        assert self._fp is not None
        self._flush_pending()
        self._fp.write(b";")
        self._fp.flush()
        os.fsync(self._fp.fileno())
        self._fp.close()
        return self._kept, self._kept * self.every / self.fps

    def _stop(self) -> None:
        if self._fp is not None:
            self._fp.close()


def _u16(v: int) -> bytes:
    return int(v).to_bytes(2, "little")


def find_ffmpeg() -> str | None:
    """The ffmpeg program to encode with: ``ffmpeg`` on PATH, else the binary of the
    imageio-ffmpeg package when it is installed; None when there is neither."""
    found = shutil.which("ffmpeg")
    if found:
        return found
    try:
        import imageio_ffmpeg
    except ImportError:
        return None
    try:
        return str(imageio_ffmpeg.get_ffmpeg_exe())
    except RuntimeError:  # the package without a binary for this platform
        return None


def _h264_available(ffmpeg: str) -> bool:
    try:
        out = subprocess.run(
            [ffmpeg, "-hide_banner", "-encoders"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return " libx264 " in out


class Mp4Recorder(Recorder):
    """An H.264 MP4 (MPEG-4 part 2 where ffmpeg lacks libx264), frames piped to ffmpeg raw."""

    def __init__(self, path: Path, fps: float, ffmpeg: str) -> None:
        super().__init__(path, fps)
        self.ffmpeg = ffmpeg
        self.codec = "libx264" if _h264_available(ffmpeg) else "mpeg4"
        self._proc: subprocess.Popen[bytes] | None = None
        self._errors: IO[bytes] | None = None

    def _start(self, shape: tuple[int, int]) -> None:
        h, w = shape
        scale = max(1, math.ceil(MP4_MIN_WIDTH / w))
        # yuv420p (what every player takes) needs even sizes: pad by a pixel where odd.
        video_filter = f"scale={w * scale}:{h * scale}:flags=neighbor,pad=ceil(iw/2)*2:ceil(ih/2)*2"
        quality = ["-crf", "18", "-preset", "veryfast"]
        if self.codec != "libx264":
            quality = ["-q:v", "3"]
        raw_in = f"-f rawvideo -pix_fmt rgb24 -s {w}x{h} -framerate {self.fps:g} -i -".split()
        out = ["-vf", video_filter, "-c:v", self.codec, *quality, "-pix_fmt", "yuv420p"]
        cmd = [self.ffmpeg, "-hide_banner", "-loglevel", "error", "-y", *raw_in, *out]
        cmd += ["-movflags", "+faststart", "-f", "mp4", str(self._tmp)]
        claim_temp(self.path)  # ffmpeg writes by name: this process owns it first
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 - ffmpeg's stderr, read on failure
        try:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._errors
            )
        except OSError as e:
            raise RecordError(f"cannot start {self.ffmpeg} to write {self.path}: {e}") from None

    def _write(self, rgb: np.ndarray) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(rgb.tobytes())
        except (BrokenPipeError, ValueError):
            raise RecordError(self._failure()) from None

    def _failure(self) -> str:
        detail = ""
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=FFMPEG_TIMEOUT_S)
        if self._errors is not None:
            self._errors.seek(0)
            lines = self._errors.read().decode(errors="replace").strip().splitlines()
            detail = lines[-1] if lines else ""
        return f"ffmpeg could not write {self.path}: {detail or 'it stopped without a message'}"

    def _finish(self) -> tuple[int, float]:
        assert self._proc is not None and self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()
        try:
            code = self._proc.wait(timeout=FFMPEG_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            raise RecordError(
                f"ffmpeg did not finish {self.path} within {FFMPEG_TIMEOUT_S:.0f} s"
            ) from None
        if code != 0:
            raise RecordError(self._failure())
        with self._tmp.open("rb") as f:
            os.fsync(f.fileno())
        self._stop()
        return self.frames, self.frames / self.fps

    def _stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._errors is not None:
            self._errors.close()


def remove_stale_recordings(path: Path) -> list[Path]:
    """Delete temporary files that earlier, killed recordings to ``path`` left beside it;
    returns them. Another live edgerl's file is left alone."""
    removed = []
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            m = TEMP_NAME.match(p.name)
            if m is None or m["name"] != path.name or not p.is_file():
                continue
            pid = int(m["pid"])
            if pid != os.getpid() and pid_alive(pid):
                continue
            with contextlib.suppress(OSError):
                p.unlink()
                log.info("removed %s: a recording that was killed before it finished", p)
                removed.append(p)
    return removed


def check_target(path: Path) -> str | None:
    """Refuse now what :func:`open_recorder` would refuse for ``path``, before any work is done;
    returns the ffmpeg to use for an MP4 (None for a GIF). Raises as open_recorder does."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise RecordError(
            f"cannot record to {path}: the file must end in .gif (needs nothing but the record "
            "extra) or .mp4 (needs ffmpeg)"
        )
    directory = path.parent
    if not directory.is_dir():
        raise RecordError(f"cannot record to {path}: the directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise RecordError(f"cannot record to {path}: the directory {directory} is not writable")
    if path.is_dir():
        raise RecordError(f"cannot record to {path}: it is a directory; give a file name")
    if suffix == ".gif":
        _import_pillow(f"recording a GIF ({path.name})")
        return None
    _import_pillow(f"recording {path.name} with its captions")
    ffmpeg = find_ffmpeg()
    if ffmpeg is None:
        raise RecordError(
            f"cannot record {path.name}: an MP4 needs ffmpeg, which is not here; install it "
            "(sudo apt install ffmpeg) or pip install imageio-ffmpeg, or record a .gif, which "
            "needs nothing more"
        )
    return ffmpeg


def open_recorder(path: Path, fps: float) -> Recorder:
    """A recorder for ``path`` (``.gif`` or ``.mp4``) whose frames play at ``fps`` per second.

    Nothing is written until the first frame; temporary files that killed recordings to the same
    name left behind are removed. Raises RecordError (one sentence) for another suffix, a
    directory that does not exist or cannot be written, or an MP4 without an encoder, and
    MissingDependencyError without Pillow (GIFs and captions need it).
    """
    if fps <= 0:
        raise ValueError(f"fps must be positive, not {fps}")
    ffmpeg = check_target(path)
    remove_stale_recordings(path)
    if ffmpeg is None:
        return GifRecorder(path, fps)
    return Mp4Recorder(path, fps, ffmpeg)
