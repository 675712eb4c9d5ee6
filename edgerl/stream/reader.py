"""The reader side of the frame stream (:mod:`edgerl.stream`): what ``edgerl view`` uses.

A reader attaches through ``<run_dir>/display.json``, checks every header field against the file
and the pointer, and copies slots with ``pread``; a slot is accepted only when its sequence numbers
agree and its CRC matches, so a frame being written is skipped, never shown torn. A stream that
is truncated, replaced or left behind by a trainer that died gives a sentence, never a crash.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgerl.errors import EdgerlError
from edgerl.files.processes import pid_alive
from edgerl.files.regular import FileTooLargeError, NotRegularFileError, read_regular
from edgerl.stream import (
    CRC,
    HEADER,
    MAGIC,
    MAX_ACTIONS,
    META,
    POINTER_FILE,
    SEQ,
    VERSION,
    WRITES_OFFSET,
    FrameMeta,
    is_stream_path,
    slot_size,
)


@dataclass
class Frame:
    pixels: np.ndarray  # (H, W) uint8
    meta: FrameMeta
    seq: int


class StreamError(ValueError):
    """A frame stream or its pointer file is not what it says it is; ``str()`` says what."""


class StreamPermissionError(EdgerlError):
    """The viewer may not read the stream or its pointer file."""


MAX_POINTER_BYTES = 64 * 1024  # display.json is a few hundred bytes
# A header's bounds: far above what a trainer writes (4 slots of its observation's frames, 84x84
# or 96x96), and small enough that a lying one costs a viewer little (64 slots of 1024x1024).
MAX_SLOTS = 64
MAX_SIDE = 1024
PID_MAX = 1 << 22  # Linux's largest pid


def _path_shown(path: Path) -> str:
    """``path`` for a sentence: as it is, or escaped where a damaged pointer put a NUL byte, a
    newline or another unprintable character in it."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def _permission_error(path: Path) -> StreamPermissionError:
    try:
        st = path.stat()
        group = grp.getgrgid(st.st_gid).gr_name
        owner = f" (mode {st.st_mode & 0o777:04o}, group {group})"
        fix = f"sudo usermod -aG {group} $USER, then log in again"
    except (OSError, KeyError):
        owner, fix = "", "sudo usermod -aG edgerl $USER, then log in again"
    return StreamPermissionError(
        f"permission denied reading {_path_shown(path)}{owner}: join the trainer's group "
        f"({fix}) or run the viewer as the trainer's user"
    )


def read_pointer(run_dir: Path) -> dict[str, Any]:
    """The parsed ``display.json``, each field checked; FileNotFoundError when there is none,
    StreamError (one sentence) when it is damaged, StreamPermissionError when we may not read
    it."""
    path = run_dir / POINTER_FILE
    try:
        data = read_regular(path, MAX_POINTER_BYTES, follow=False)
    except PermissionError:
        raise _permission_error(path) from None
    except IsADirectoryError:
        raise StreamError(f"{path} is a directory, not a frame stream pointer") from None
    except (NotRegularFileError, FileTooLargeError) as e:
        raise StreamError(f"{path} is damaged: {e.strerror}") from None
    try:
        pointer = json.loads(data)
    except (ValueError, RecursionError):  # not UTF-8, not JSON
        raise StreamError(f"{path} is damaged: it is not JSON") from None
    if not isinstance(pointer, dict):
        raise StreamError(f"{path} is damaged: it holds no object")
    pid = pointer.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= PID_MAX:
        raise StreamError(f"{path} is damaged: pid is {_shown(pid)}, not a process id")
    if pointer.get("frames", True) is False:
        return pointer  # a run on vector observations: nothing to show, says so
    for key, kind in POINTER_KEYS.items():
        value = pointer.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise StreamError(f"{path} is damaged: {key} is {_shown(value)}")
    if not pointer["path"]:  # Path("") is the current directory: named as the damage it is
        raise StreamError(f"{path} is damaged: path is empty")
    return pointer


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


POINTER_KEYS: dict[str, type | tuple[type, ...]] = {
    "path": str,
    "session": int,
    "pid": int,
    "height": int,
    "width": int,
    "slots": int,
    "action_meanings": list,
}


class FrameReader:
    """The reader side: attach through ``<run_dir>/display.json``; ``latest()`` for new frames.

    Reads with ``pread`` rather than a mapping, so a file truncated under the viewer gives a
    sentence (StreamError) instead of SIGBUS. Raises StreamError for a header that does not match
    its file or its pointer, StreamPermissionError when the file may not be read.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        pointer = read_pointer(run_dir)
        self.pointer: dict[str, Any] = pointer
        self.path = Path(pointer["path"])
        self.pid = int(pointer["pid"])
        self.action_meanings: list[str] = [str(a) for a in pointer["action_meanings"]]
        pointer_file, shown = run_dir / POINTER_FILE, _path_shown(self.path)
        if "\0" not in pointer["path"] and not is_stream_path(self.path):
            raise StreamError(
                f"{pointer_file} is damaged: the path it names, {shown}, is not where edgerl "
                "puts a frame stream"
            )
        try:
            # O_NONBLOCK: a FIFO named by a damaged pointer must not hang the viewer here;
            # O_NOFOLLOW: nor may a link make it read another file.
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except PermissionError:
            raise _permission_error(self.path) from None
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(errno.ENOENT, "no such file", str(self.path)) from None
        except ValueError:  # a NUL byte in the path: no file can have that name
            raise StreamError(
                f"{pointer_file} is damaged: the path it names, {shown}, holds a NUL byte"
            ) from None
        except OSError as e:
            why = e.strerror or str(e)
            if e.errno in (errno.ENAMETOOLONG, errno.ELOOP):  # no stream could be there
                raise StreamError(
                    f"{pointer_file} is damaged: the path it names, {shown}, cannot be opened "
                    f"({why})"
                ) from None
            raise StreamError(f"the frame stream {shown} cannot be opened: {why}") from None
        try:
            if not stat.S_ISREG(os.fstat(self._fd).st_mode):
                raise StreamError(
                    f"{pointer_file} is damaged: the path it names, {shown}, is not a file"
                )
            self._check_header(pointer)
        except BaseException:
            os.close(self._fd)
            raise
        self.last_seq = 0
        self.torn = 0  # frames rejected as torn (seq or CRC mismatch)

    def _check_header(self, pointer: dict[str, Any]) -> None:
        """Every header field against the file and the pointer; raises StreamError."""
        where = _path_shown(self.path)
        size = os.fstat(self._fd).st_size
        raw = os.pread(self._fd, HEADER.size, 0)
        if len(raw) < HEADER.size:
            raise StreamError(
                f"{where} has {size:,} bytes, less than a frame stream header ({HEADER.size}): "
                "it was truncated"
            )
        magic, version, slots, h, w, actions, _, session, _ = HEADER.unpack(raw)
        if magic != MAGIC:
            raise StreamError(
                f"{where} does not start with {MAGIC.decode()}: it is not a frame stream"
            )
        if version != VERSION:
            raise StreamError(
                f"{where} is frame stream version {version} and this viewer reads version "
                f"{VERSION}: run the viewer of the trainer's edgerl"
            )
        for name, value, top in (
            ("slots", slots, MAX_SLOTS),
            ("frame height", h, MAX_SIDE),
            ("frame width", w, MAX_SIDE),
            ("actions", actions, MAX_ACTIONS),
        ):
            if not 1 <= value <= top:
                raise StreamError(
                    f"{where} has a corrupt header: {name} is {value:,}, not within 1..{top}"
                )
        want = HEADER.size + slots * slot_size(h, w)
        if size != want:
            raise StreamError(
                f"{where} has {size:,} bytes but its header ({slots} slots of {h}x{w} frames) "
                f"needs {want:,}: the file was truncated or its header is corrupt"
            )
        expected = {
            "session": (session, pointer["session"]),
            "slots": (slots, pointer["slots"]),
            "frame height": (h, pointer["height"]),
            "frame width": (w, pointer["width"]),
            "actions": (actions, len(pointer["action_meanings"])),
        }
        for name, (in_file, in_pointer) in expected.items():
            if in_file != in_pointer:
                raise StreamError(
                    f"{where} says {name} {in_file} but {self.run_dir / POINTER_FILE} says "
                    f"{in_pointer}: the stream was replaced or damaged"
                )
        self.slots, self.height, self.width, self.num_actions = slots, h, w, actions
        self.session = session
        self._slot = slot_size(h, w)
        self.size = size

    def _pread(self, n: int, offset: int) -> bytes:
        raw = os.pread(self._fd, n, offset)
        if len(raw) < n:
            size = os.fstat(self._fd).st_size
            raise StreamError(
                f"{_path_shown(self.path)} shrank to {size:,} bytes while being watched (it "
                f"should have {self.size:,}): it was truncated"
            )
        return raw

    @property
    def writes(self) -> int:
        return SEQ.unpack(self._pread(SEQ.size, WRITES_OFFSET))[0]

    def read_slot(self, index: int) -> Frame | None:
        """A consistent copy of one slot, or None if it is being written (torn) or empty."""
        base = HEADER.size + index * self._slot
        end = SEQ.unpack(self._pread(SEQ.size, base + self._slot - SEQ.size))[0]
        first = SEQ.unpack(self._pread(SEQ.size, base))[0]
        if first == 0 or first != end:  # empty, or being written: not worth copying the slot
            self.torn += first != 0
            return None
        raw = self._pread(self._slot, base)  # one copy of the whole slot
        begin = SEQ.unpack_from(raw, 0)[0]
        if begin == 0 or begin != end or begin != SEQ.unpack_from(raw, self._slot - SEQ.size)[0]:
            self.torn += begin != 0
            return None
        off = SEQ.size
        meta_bytes = raw[off : off + META.size]
        off += META.size
        (crc,) = CRC.unpack_from(raw, off)
        off += CRC.size
        pixels = np.frombuffer(raw, dtype=np.uint8, count=self.height * self.width, offset=off)
        if zlib.crc32(pixels, zlib.crc32(meta_bytes)) != crc:
            self.torn += 1
            return None
        meta = FrameMeta.unpack(meta_bytes, self.num_actions)
        return Frame(pixels.reshape(self.height, self.width).copy(), meta, begin)

    def latest(self) -> Frame | None:
        """The newest consistent frame not returned before, or None; raises StreamError when the
        file was truncated under us."""
        writes = self.writes
        for back in range(min(self.slots, writes)):
            seq = writes - back
            if seq <= self.last_seq:
                return None
            frame = self.read_slot((seq - 1) % self.slots)
            if frame is not None and frame.seq > self.last_seq:
                self.last_seq = frame.seq
                return frame
        return None

    def trainer_gone(self) -> str | None:
        """Why this stream will bring no more frames (its trainer died, or a new one replaced
        it), or None while it is current."""
        try:
            pointer = read_pointer(self.run_dir)
        except FileNotFoundError:
            return "the trainer stopped publishing"
        except (StreamError, StreamPermissionError) as e:
            return str(e)
        if pointer["session"] != self.session:
            return "a new trainer session replaced the stream"
        if not pid_alive(pointer["pid"]):
            return dead_trainer(self.run_dir, pointer["pid"])
        return None

    def still_current(self) -> bool:
        """False once the trainer has gone or a new one has replaced this stream."""
        return self.trainer_gone() is None

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def no_frames(run_dir: Path, env_id: str) -> str:
    """The sentence for a run whose observations are vectors, not screens."""
    return (
        f"the run in {run_dir} learns {env_id} from vector observations, and such runs have "
        "no frames to show; follow it with edgerl status or edgerl plot --terminal"
    )


def dead_trainer(run_dir: Path, pid: int) -> str:
    """The sentence for a stream whose writer is gone without removing it (killed, crashed)."""
    return (
        f"the trainer of {run_dir} (pid {pid}) is not running any more: it was killed or "
        "crashed; restart it (edgerl status shows the run)"
    )
