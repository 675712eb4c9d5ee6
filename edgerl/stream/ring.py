"""The writer side of the frame stream: the ring file the trainer writes frames into."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import logging
import math
import os
import secrets
import time
import zlib
from pathlib import Path

import numpy as np

from edgerl.files.atomic import write_atomic
from edgerl.stream.layout import (
    CRC,
    DAMAGE_CHECK_EVERY_S,
    HEADER,
    MAGIC,
    POINTER_FILE,
    SEQ,
    VERSION,
    WRITES_OFFSET,
    FrameMeta,
    shm_path,
    slot_size,
)

log = logging.getLogger(__name__)


def _own_directory(path: Path, group: str) -> None:
    """Make ``path`` this user's directory for streams (0750, given to ``group`` where we may),
    or check the one there is; raises PermissionError (with why) when what is there is not a
    directory of this user's that only it may write in."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o750)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # ELOOP for a link
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise PermissionError(errno.EPERM, "it belongs to another user", str(path))
        if st.st_mode & 0o022:
            raise PermissionError(errno.EPERM, "others may write in it", str(path))
        os.fchmod(fd, 0o750)  # whatever the umask: the display group may enter, not write
        _share_with_group(fd, group)
    finally:
        os.close(fd)


class FrameRing:
    """The writer side, owned by the trainer. Use as a context manager; ``publish`` per frame.

    Frames are written with ``pwrite``, not through a mapping: writing a mapping past the end of
    a file that someone truncated (or into a full ``/dev/shm``) kills the process with SIGBUS,
    while ``pwrite`` only ever raises OSError. Before each frame the ring checks that its file is
    still the one at its path with its full size, and recreates it (new session) when not.
    """

    def __init__(
        self,
        run_dir: Path,
        height: int,
        width: int,
        action_meanings: list[str],
        slots: int = 4,
        group: str = "edgerl",
    ) -> None:
        self.run_dir = run_dir
        self.height, self.width, self.slots = height, width, slots
        self.action_meanings = list(action_meanings)
        self.num_actions = len(action_meanings)
        self.path = shm_path(run_dir)
        self.group_name = group
        self._slot = slot_size(height, width)
        self.size = HEADER.size + slots * self._slot
        self.recreated = 0  # times the file was found damaged or replaced and made again
        self._fd = -1
        self._ino = 0
        self._fixed_header = b""
        self._checked = -math.inf  # when damage() last ran
        self._create()

    def _create(self) -> None:
        """(Re)make the file, its header and the pointer file, under a new session id."""
        self.session = secrets.randbits(63)
        self.writes = 0
        _own_directory(self.path.parent, self.group_name)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
        try:
            os.fchmod(fd, 0o640)
            self.group = _share_with_group(fd, self.group_name)
            os.ftruncate(fd, self.size)
            header = HEADER.pack(
                MAGIC, VERSION, self.slots, self.height, self.width, self.num_actions, 0,
                self.session, 0,
            )  # fmt: skip
            os.pwrite(fd, header, 0)
            self._fixed_header = header[:WRITES_OFFSET]  # what damage() expects to read back
        except BaseException:
            os.close(fd)
            raise
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = fd
        self._ino = os.fstat(fd).st_ino
        pointer = {
            "path": str(self.path),
            "session": self.session,
            "pid": os.getpid(),
            "height": self.height,
            "width": self.width,
            "slots": self.slots,
            "action_meanings": self.action_meanings,
            "created": time.time(),
        }
        write_atomic(self.run_dir / POINTER_FILE, json.dumps(pointer).encode())

    def damage(self) -> str | None:
        """What is wrong with the file at our path (removed, replaced, resized), or None."""
        st = os.fstat(self._fd)
        if st.st_nlink == 0:
            return "removed"
        try:
            at_path = os.stat(self.path)
        except FileNotFoundError:
            return "removed"
        if at_path.st_ino != self._ino or at_path.st_dev != st.st_dev:
            return "replaced"
        if st.st_size != self.size:
            return f"resized to {st.st_size:,} bytes"
        # A file truncated and regrown by our own writes (4 slots are written again in a few
        # steps, between two checks) has its size back but a header of zeros: no reader opens it.
        if os.pread(self._fd, WRITES_OFFSET, 0) != self._fixed_header:
            return "emptied or overwritten"
        return None

    def publish(self, frame: np.ndarray, meta: FrameMeta) -> None:
        """Copy one frame and its metadata into the next slot (never blocks); raises OSError when
        the file cannot be written (for example ``/dev/shm`` is full)."""
        now = time.monotonic()
        # Checking costs two stat calls, more than the rest of a publish: a few times a second
        # is soon enough to notice a stream someone removed (writes never fault meanwhile).
        if now - self._checked >= DAMAGE_CHECK_EVERY_S:
            self._checked = now
            damage = self.damage()
            if damage is not None:
                log.warning(
                    "display stream %s was %s by someone else; made a new one", self.path, damage
                )
                self.recreated += 1
                self._create()
        index = self.writes % self.slots
        base = HEADER.size + index * self._slot
        seq = SEQ.pack(self.writes + 1)
        meta_bytes = meta.pack(self.num_actions)
        pixels = np.ascontiguousarray(frame, dtype=np.uint8).reshape(-1)
        crc = CRC.pack(zlib.crc32(pixels, zlib.crc32(meta_bytes)))
        fd = self._fd
        os.pwrite(fd, seq, base)  # seq_begin first: a reader now sees begin != end
        os.pwrite(fd, meta_bytes + crc + pixels.tobytes(), base + SEQ.size)
        os.pwrite(fd, seq, base + self._slot - SEQ.size)  # seq_end last
        self.writes += 1
        os.pwrite(fd, SEQ.pack(self.writes), WRITES_OFFSET)

    def close(self) -> None:
        """Remove the stream and its pointer file (only if they are still ours)."""
        if self._fd >= 0:
            damage = None
            with contextlib.suppress(OSError):
                damage = self.damage()
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        # A file that replaced ours at our path belongs to someone else: leave it.
        paths = [self.run_dir / POINTER_FILE] + ([] if damage == "replaced" else [self.path])
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def __enter__(self) -> FrameRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _share_with_group(fd: int, group: str) -> str | None:
    """Give the stream to ``group`` when we may (root, or a member); None if it does not exist."""
    if not group:
        return None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return None
    try:
        os.fchown(fd, -1, gid)
    except PermissionError:
        log.debug("cannot give the display stream to group %s", group)
        return None
    return group
